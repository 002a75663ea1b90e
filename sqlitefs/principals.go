package sqlitefs

const (
	selectPrincipalID = `SELECT id FROM principals WHERE agent = ? AND user_id = ?`
	insertPrincipal   = `INSERT INTO principals (agent, user_id) VALUES (?, ?)
		ON CONFLICT (agent, user_id) DO UPDATE SET agent = excluded.agent
		RETURNING id`
	selectSyncToken   = `SELECT sync_token FROM principals WHERE id = ?`
	selectSyncTokenMS = `SELECT sync_token_ms FROM principals WHERE id = ?`
	// The token's time is the batch's: the time of the principal's last
	// completed sync, whose age status reports.
	updateSyncToken = `UPDATE principals SET sync_token = ?, sync_token_ms = ? WHERE id = ?`
)
