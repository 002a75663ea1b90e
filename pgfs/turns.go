package pgfs

const (
	turnColumns = `t.turn_id, t.room_id, t.state, t.record_json, t.event_id, t.updated_ms`
	upsertTurn  = `INSERT INTO turn_records (agent, turn_id, room_id, state, record_json, event_id, updated_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (agent, turn_id) DO UPDATE SET room_id = excluded.room_id, state = excluded.state,
		record_json = excluded.record_json, event_id = excluded.event_id, updated_ms = excluded.updated_ms`
	completeTurnRecord = `UPDATE turn_records SET state = 2, event_id = $1, updated_ms = $2 WHERE agent = $3 AND turn_id = $4`
	deleteTurnSources  = `DELETE FROM turn_sources WHERE agent = $1 AND turn_id = $2`
	// A source re-anchored to another turn leaves no row under its old one.
	upsertTurnSource = `INSERT INTO turn_sources (agent, event_id, turn_id) VALUES ($1, $2, $3)
		ON CONFLICT (agent, event_id) DO UPDATE SET turn_id = excluded.turn_id`
	deleteTurn        = `DELETE FROM turn_records WHERE agent = $1 AND turn_id = $2`
	selectTurnSources = `SELECT event_id FROM turn_sources WHERE agent = $1 AND turn_id = $2 ORDER BY event_id`
	selectTurn        = `SELECT ` + turnColumns + ` FROM turn_records t WHERE t.agent = $1 AND t.turn_id = $2`
	selectTurnByEvent = `SELECT ` + turnColumns + `
		FROM turn_sources e JOIN turn_records t ON t.agent = e.agent AND t.turn_id = e.turn_id
		WHERE e.agent = $1 AND e.event_id = $2`
	selectTurnsAfter = `SELECT ` + turnColumns + ` FROM turn_records t
		WHERE t.agent = $1 AND t.turn_id > $2 ORDER BY t.turn_id LIMIT $3`
)
