package sqlitefs

// Tool approvals: the ledger of exact calls a person decides.
const (
	approvalColumns = `call_id, event_id, room_id, thread_id, tool, arguments, secret, approvers, rendering,
		call_hash, expires_ms, epoch, created_ms, state, decided_by, decision_event_id, decided_ms, reason,
		context, run_state, run_result`
	selectApproval       = `SELECT ` + approvalColumns + ` FROM approvals WHERE principal = ? AND call_id = ?`
	selectApprovalSource = `SELECT j.room_id, j.thread_id, j.state = 0, coalesce(p.payload, '')
		FROM journal_events j LEFT JOIN journal_payloads p ON p.seq = j.seq
		WHERE j.principal = ? AND j.id_hash = ? AND j.event_id = ?`
	insertApproval = `INSERT INTO approvals (principal, call_id, event_id, room_id, thread_id, tool, arguments, secret,
		approvers, rendering, call_hash, card_delivery_id, expires_ms, epoch, created_ms, context)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	// A decision takes the principal's next decision number; the one writer
	// makes max + 1 unique.
	decideApprovalRow = `UPDATE approvals SET state = ?1, decided_by = ?2, decision_event_id = ?3, decided_ms = ?4,
		reason = ?5, decided_seq = (SELECT coalesce(max(decided_seq), 0) + 1 FROM approvals WHERE principal = ?6)
		WHERE principal = ?6 AND call_id = ?7 AND state = 0`
	// The card's delivery is found by its acknowledged event ID through the
	// partial index of cards, then its approval by the delivery's name.
	selectCardApproval = `SELECT a.call_id, a.event_id, a.room_id, a.thread_id, a.tool, a.arguments, a.secret,
		a.approvers, a.rendering, a.call_hash, a.expires_ms, a.epoch, a.created_ms, a.state, a.decided_by,
		a.decision_event_id, a.decided_ms, a.reason, a.context, a.run_state, a.run_result
		FROM delivery_outbox d JOIN approvals a ON a.principal = d.principal AND a.card_delivery_id = d.delivery_id
		WHERE d.principal = ? AND d.event_id = ? AND d.delivery_id LIKE 'approval:%' AND d.stage = 1`
	selectApprovalsForEvent = `SELECT ` + approvalColumns + ` FROM approvals
		WHERE principal = ? AND event_id = ? ORDER BY created_ms, call_id`
	selectOpenApprovalsInRoom = `SELECT ` + approvalColumns + ` FROM approvals
		WHERE principal = ? AND room_id = ? AND state = 0 ORDER BY created_ms, call_id`
	selectDueApprovals = `SELECT ` + approvalColumns + ` FROM approvals
		WHERE principal = ? AND state = 0 AND expires_ms <= ? ORDER BY expires_ms LIMIT ?`
	selectDecidedAfter = `SELECT ` + approvalColumns + `, decided_seq FROM approvals
		WHERE principal = ? AND decided_seq > ? ORDER BY decided_seq LIMIT ?`
	// A run is claimed once, and only of an approved call.
	startToolRunRow = `UPDATE approvals SET run_state = 1
		WHERE principal = ? AND call_id = ? AND state = 1 AND run_state = 0`
	finishToolRunRow = `UPDATE approvals SET run_state = 2, run_result = ?
		WHERE principal = ? AND call_id = ? AND run_state = 1`
)
