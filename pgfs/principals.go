package pgfs

const (
	insertPrincipal = `INSERT INTO principals (agent, user_id) VALUES ($1, $2)
		ON CONFLICT (agent, user_id) DO UPDATE SET agent = excluded.agent
		RETURNING id`
	selectPrincipalID = `SELECT id FROM principals WHERE agent = $1 AND user_id = $2`
	selectSyncToken   = `SELECT sync_token FROM principals WHERE id = $1`
	selectSyncTokenMS = `SELECT sync_token_ms FROM principals WHERE id = $1`
	// The token's time is the batch's: the time of the principal's last
	// completed sync, whose age status reports.
	updateSyncToken  = `UPDATE principals SET sync_token = $1, sync_token_ms = $2 WHERE id = $3`
	selectMembership = `SELECT epoch, departed FROM rooms WHERE principal = $1 AND room_id = $2`
)
