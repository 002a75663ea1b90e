package sqlitefs

const (
	turnColumns = `turn_id, room_id, state, record_json, event_id, updated_ms`
	upsertTurn  = `INSERT INTO turn_records (agent, turn_id, room_id, state, record_json, event_id, updated_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (agent, turn_id) DO UPDATE SET room_id = excluded.room_id, state = excluded.state,
		record_json = excluded.record_json, event_id = excluded.event_id, updated_ms = excluded.updated_ms`
	completeTurnRecord = `UPDATE turn_records SET state = 2, event_id = ?, updated_ms = ? WHERE agent = ? AND turn_id = ?`
	deleteTurnSources  = `DELETE FROM turn_sources WHERE agent = ? AND turn_id = ?`
	// A source re-anchored to another turn leaves no row under its old one.
	upsertTurnSource = `INSERT INTO turn_sources (agent, event_id, turn_id) VALUES (?, ?, ?)
		ON CONFLICT (agent, event_id) DO UPDATE SET turn_id = excluded.turn_id`
	deleteTurn        = `DELETE FROM turn_records WHERE agent = ? AND turn_id = ?`
	selectTurn        = `SELECT ` + turnColumns + ` FROM turn_records WHERE agent = ? AND turn_id = ?`
	selectTurnByEvent = `SELECT t.turn_id, t.room_id, t.state, t.record_json, t.event_id, t.updated_ms
		FROM turn_sources s JOIN turn_records t ON t.agent = s.agent AND t.turn_id = s.turn_id
		WHERE s.agent = ? AND s.event_id = ?`
	selectTurnSources = `SELECT event_id FROM turn_sources WHERE agent = ? AND turn_id = ? ORDER BY event_id`
	selectTurnsAfter  = `SELECT ` + turnColumns + ` FROM turn_records WHERE agent = ? AND turn_id > ? ORDER BY turn_id LIMIT ?`
)
