package sqlitefs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// selectStatus reads every figure of every principal in one statement, so
// they come from one snapshot. The outbox is read once, grouped by
// principal, its states being journal.DeliveryState's: 0 queued,
// 1 attempted, 2 acknowledged, 3 failed, 4 retired.
const selectStatus = `SELECT p.agent, p.user_id, p.sync_token <> '', p.sync_token_ms,
		(SELECT count(*) FROM journal_events j WHERE j.principal = p.id),
		(SELECT count(*) FROM journal_events j WHERE j.principal = p.id AND j.state = 0),
		(SELECT count(*) FROM rooms r JOIN visible_messages v ON v.room = r.id WHERE r.principal = p.id),
		coalesce(o.queued, 0), coalesce(o.attempted, 0), coalesce(o.acknowledged, 0),
		coalesce(o.failed, 0), coalesce(o.retired, 0),
		(SELECT count(*) FROM owed_departure_reports d WHERE d.principal = p.id),
		(SELECT count(*) FROM awaiting_keys a WHERE a.principal = p.id),
		(SELECT count(*) FROM journal_events j WHERE j.principal = p.id AND j.state = 3)
	FROM principals p
	LEFT JOIN (SELECT principal,
			sum(state = 0) AS queued, sum(state = 1) AS attempted, sum(state = 2) AS acknowledged,
			sum(state = 3) AS failed, sum(state = 4) AS retired
		FROM delivery_outbox GROUP BY principal) o ON o.principal = p.id
	ORDER BY p.agent, p.user_id`

// selectBacklog counts what each principal still owes, through the partial
// indexes on pending events and unacknowledged deliveries only: it is read
// at every metrics scrape, so it never scans the whole journal or outbox.
// The planner would rather count the outbox through its covering room
// index, which holds every acknowledged row too; INDEXED BY keeps it on
// the partial one.
const selectBacklog = `SELECT p.agent, p.user_id,
		(SELECT count(*) FROM journal_events j WHERE j.principal = p.id AND j.state = 0),
		(SELECT count(*) FROM delivery_outbox o INDEXED BY delivery_outbox_unacknowledged
			WHERE o.principal = p.id AND o.state IN (0, 1) AND o.state = 0),
		(SELECT count(*) FROM delivery_outbox o INDEXED BY delivery_outbox_unacknowledged
			WHERE o.principal = p.id AND o.state IN (0, 1) AND o.state = 1),
		(SELECT count(*) FROM awaiting_keys a WHERE a.principal = p.id)
	FROM principals p ORDER BY p.agent, p.user_id`

// walSuffix names a database's write-ahead log after it, as SQLite does.
const walSuffix = "-wal"

// FileSizes are the sizes of the journal's files on disk, in bytes.
type FileSizes struct {
	// Database is the journal file itself.
	Database int64
	// WAL is its write-ahead log: committed pages not yet checkpointed into
	// the file, or space kept for the next ones. 0 when there is none, as
	// after an orderly shutdown.
	WAL int64
}

// Sizes reads the sizes of the journal's files. It reads the file system,
// not the database, so it neither waits for a lock nor changes a file.
func (db *DB) Sizes() (FileSizes, error) {
	var sz FileSizes
	fi, err := os.Stat(db.Path)
	if err != nil {
		return sz, fmt.Errorf("journal size: %w", err)
	}
	sz.Database = fi.Size()
	switch fi, err := os.Stat(db.Path + walSuffix); {
	case err == nil:
		sz.WAL = fi.Size()
	case !errors.Is(err, fs.ErrNotExist):
		return sz, fmt.Errorf("WAL size: %w", err)
	}
	return sz, nil
}
