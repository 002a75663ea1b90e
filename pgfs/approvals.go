package pgfs

// Tool approvals: the ledger of exact calls a person decides.
const (
	approvalColumns = `call_id, event_id, room_id, thread_id, tool, arguments, secret, approvers, rendering,
		call_hash, expires_ms, epoch, created_ms, state, decided_by, decision_event_id, decided_ms, reason,
		context, run_state, run_result`
	selectApproval       = `SELECT ` + approvalColumns + ` FROM approvals WHERE principal = $1 AND call_id = $2`
	selectApprovalSource = `SELECT j.room_id, j.thread_id, j.state = 0, coalesce(p.payload, '')
		FROM journal_events j LEFT JOIN journal_payloads p ON p.seq = j.seq
		WHERE j.principal = $1 AND j.event_id = $2`
	insertApproval = `INSERT INTO approvals (principal, call_id, event_id, room_id, thread_id, tool, arguments, secret,
		approvers, rendering, call_hash, card_delivery_id, expires_ms, epoch, created_ms, context)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)`
	// A decision takes the principal's next decision number; the
	// principal's row lock serializes its writes, so max + 1 is unique.
	decideApprovalRow = `UPDATE approvals SET state = $1, decided_by = $2, decision_event_id = $3, decided_ms = $4,
		reason = $5, decided_seq = (SELECT coalesce(max(decided_seq), 0) + 1 FROM approvals WHERE principal = $6)
		WHERE principal = $6 AND call_id = $7 AND state = 0`
	// The card's delivery is found by its acknowledged event ID through the
	// partial index of cards, then its approval by the delivery's name.
	selectCardApproval = `SELECT a.call_id, a.event_id, a.room_id, a.thread_id, a.tool, a.arguments, a.secret,
		a.approvers, a.rendering, a.call_hash, a.expires_ms, a.epoch, a.created_ms, a.state, a.decided_by,
		a.decision_event_id, a.decided_ms, a.reason, a.context, a.run_state, a.run_result
		FROM delivery_outbox d JOIN approvals a ON a.principal = d.principal AND a.card_delivery_id = d.delivery_id
		WHERE d.principal = $1 AND d.event_id = $2 AND d.delivery_id LIKE 'approval:%' AND d.stage = 1`
	selectApprovalsForEvent = `SELECT ` + approvalColumns + ` FROM approvals
		WHERE principal = $1 AND event_id = $2 ORDER BY created_ms, call_id`
	selectOpenApprovalsInRoom = `SELECT ` + approvalColumns + ` FROM approvals
		WHERE principal = $1 AND room_id = $2 AND state = 0 ORDER BY created_ms, call_id`
	selectDueApprovals = `SELECT ` + approvalColumns + ` FROM approvals
		WHERE principal = $1 AND state = 0 AND expires_ms <= $2 ORDER BY expires_ms LIMIT $3`
	selectDecidedAfter = `SELECT ` + approvalColumns + `, decided_seq FROM approvals
		WHERE principal = $1 AND decided_seq > $2 ORDER BY decided_seq LIMIT $3`
	// A run is claimed once, and only of an approved call.
	startToolRunRow = `UPDATE approvals SET run_state = 1
		WHERE principal = $1 AND call_id = $2 AND state = 1 AND run_state = 0`
	finishToolRunRow = `UPDATE approvals SET run_state = 2, run_result = $1
		WHERE principal = $2 AND call_id = $3 AND run_state = 1`
)
