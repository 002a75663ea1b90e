package sqlitefs

// Retention: the statements that prune settled data in bounded steps. A
// scan walks a kind's rows in key order, which is the order they were
// written in; a range statement prunes what the scan found older than the
// cutoff, under guards that keep anything pending or owed: a room with an
// event not settled, a ciphertext waiting for its key, a delivery not
// finished, an open approval or a departure report owed keeps its bodies.
const (
	retainScanVisible = `SELECT v.seq, coalesce(j.received_ms, 0) FROM visible_messages v
		JOIN rooms r ON r.id = v.room LEFT JOIN journal_events j ON j.seq = v.seq
		WHERE r.principal = ? AND v.seq > ? ORDER BY v.seq LIMIT ?`
	retainBodies = `DELETE FROM visible_messages WHERE seq IN (
		SELECT v.seq FROM visible_messages v JOIN rooms r ON r.id = v.room
		WHERE r.principal = ?1 AND v.seq > ?2 AND v.seq <= ?3 AND v.content_json IS NOT NULL
		  AND NOT EXISTS (SELECT 1 FROM journal_events p WHERE p.principal = ?1 AND p.state = 0 AND p.room_id = r.room_id)
		  AND NOT EXISTS (SELECT 1 FROM awaiting_keys k WHERE k.principal = ?1 AND k.room_id = r.room_id)
		  AND NOT EXISTS (SELECT 1 FROM delivery_outbox d WHERE d.principal = ?1 AND d.room_id = r.room_id AND d.state IN (0, 1))
		  AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.principal = ?1 AND a.room_id = r.room_id AND a.state = 0)
		  AND NOT EXISTS (SELECT 1 FROM owed_departure_reports o WHERE o.principal = ?1 AND o.room_id = r.room_id))
		RETURNING room, created_ts, length(CAST(content_json AS BLOB))`
	markPrunedBefore = `UPDATE rooms SET pruned_before = max(pruned_before, ?) WHERE id = ?`
	retainEdits      = `DELETE FROM unresolved_edits WHERE (principal, room_id, target_id, sender) IN (
		SELECT principal, room_id, target_id, sender FROM unresolved_edits
		WHERE principal = ?1 AND edit_ts < ?2 LIMIT ?3)`
	retainScanOutbox   = `SELECT id, created_ms FROM delivery_outbox WHERE principal = ? AND id > ? ORDER BY id LIMIT ?`
	finishedDeliveries = `principal = ?1 AND id > ?2 AND id <= ?3 AND state IN (2, 3, 4) AND updated_ms < ?4`
	retainPayloadBytes = `SELECT count(*), coalesce(sum(length(CAST(payload_json AS BLOB))), 0) FROM delivery_outbox
		WHERE ` + finishedDeliveries + ` AND payload_json <> ''`
	retainPayloads    = `UPDATE delivery_outbox SET payload_json = '' WHERE ` + finishedDeliveries + ` AND payload_json <> ''`
	answeredTurns     = `SELECT turn_id FROM turn_records WHERE agent = ?1 AND state = 2 AND updated_ms < ?2 ORDER BY turn_id LIMIT ?3`
	retainTurnSources = `DELETE FROM turn_sources WHERE agent = ?1 AND turn_id IN (` + answeredTurns + `)`
	retainTurnRecords = `DELETE FROM turn_records WHERE agent = ?1 AND turn_id IN (` + answeredTurns + `)`
	retainRejected    = `DELETE FROM rejected_events WHERE id IN (
		SELECT id FROM rejected_events WHERE principal = ?1 AND received_ms < ?2 ORDER BY id LIMIT ?3)`
	retainScanEvents = `SELECT seq, received_ms FROM journal_events WHERE principal = ? AND seq > ? ORDER BY seq LIMIT ?`
	retainIdentities = `DELETE FROM journal_events WHERE seq IN (
		SELECT j.seq FROM journal_events j
		WHERE j.principal = ?1 AND j.seq > ?2 AND j.seq <= ?3 AND j.received_ms < ?4 AND j.state <> 0
		  AND NOT EXISTS (SELECT 1 FROM visible_messages v WHERE v.seq = j.seq)
		  AND NOT EXISTS (SELECT 1 FROM awaiting_keys k WHERE k.seq = j.seq))`
	// A decided approval stays while its turn is pending (the agent is yet
	// to be told) and while its card's edit is on its way.
	retainApprovals = `DELETE FROM approvals WHERE principal = ?1 AND call_id IN (
		SELECT a.call_id FROM approvals a WHERE a.principal = ?1 AND a.state <> 0 AND a.decided_ms < ?2
		  AND NOT EXISTS (SELECT 1 FROM journal_events j WHERE j.principal = ?1
		      AND j.id_hash = mindroomd_id_hash(a.event_id) AND j.event_id = a.event_id AND j.state = 0)
		  AND NOT EXISTS (SELECT 1 FROM delivery_outbox d WHERE d.principal = ?1
		      AND d.delivery_id = a.card_delivery_id AND d.state IN (0, 1))
		ORDER BY a.call_id LIMIT ?3)`
	// A finished stage stays while its delivery's other stage is unfinished
	// (a final answer names the placeholder it replaces) and while an
	// approval names it as its card.
	retainDeliveries = `DELETE FROM delivery_outbox WHERE id IN (
		SELECT d.id FROM delivery_outbox d
		WHERE d.principal = ?1 AND d.id > ?2 AND d.id <= ?3 AND d.state IN (2, 3, 4) AND d.updated_ms < ?4
		  AND NOT EXISTS (SELECT 1 FROM delivery_outbox s WHERE s.principal = ?1 AND s.delivery_id = d.delivery_id
		      AND s.state IN (0, 1))
		  AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.principal = ?1 AND a.card_delivery_id = d.delivery_id))`
	addRetentionTotals = `INSERT INTO retention_totals
		(principal, bodies, edits, payloads, turns, rejected, identities, deliveries, approvals, bytes)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (principal) DO UPDATE SET bodies = bodies + excluded.bodies, edits = edits + excluded.edits,
		payloads = payloads + excluded.payloads, turns = turns + excluded.turns, rejected = rejected + excluded.rejected,
		identities = identities + excluded.identities, deliveries = deliveries + excluded.deliveries,
		approvals = approvals + excluded.approvals, bytes = bytes + excluded.bytes`
	endRetentionPassRow = `INSERT INTO retention_totals (principal, passes, last_pass_ms, identities_before_ms)
		VALUES (?, 1, ?, ?)
		ON CONFLICT (principal) DO UPDATE SET passes = passes + 1, last_pass_ms = excluded.last_pass_ms,
		identities_before_ms = max(identities_before_ms, excluded.identities_before_ms)`
	selectRetentionTotals = `SELECT passes, last_pass_ms, bodies, edits, payloads, turns, rejected, identities,
		deliveries, approvals, bytes, identities_before_ms FROM retention_totals WHERE principal = ?`
	selectOldestBody = `SELECT coalesce(min(v.created_ts), 0) FROM visible_messages v JOIN rooms r ON r.id = v.room
		WHERE r.principal = ?`
	selectPrunedBefore    = `SELECT pruned_before FROM rooms WHERE principal = ? AND room_id = ?`
	selectIdentityHorizon = `SELECT identities_before_ms FROM retention_totals WHERE principal = ?`
)
