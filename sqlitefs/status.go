package sqlitefs

import (
	"context"
	"fmt"
)

const selectStatus = `SELECT p.agent, p.user_id,
		(SELECT count(*) FROM journal_events j WHERE j.principal = p.id),
		(SELECT count(*) FROM journal_events j WHERE j.principal = p.id AND j.state = 0),
		(SELECT count(*) FROM rooms r JOIN visible_messages v ON v.room = r.id WHERE r.principal = p.id),
		(SELECT count(*) FROM delivery_outbox o WHERE o.principal = p.id AND o.state IN (0, 1))
	FROM principals p ORDER BY p.agent, p.user_id`

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
			WHERE o.principal = p.id AND o.state IN (0, 1) AND o.state = 1)
	FROM principals p ORDER BY p.agent, p.user_id`

// Backlog is what one principal still owes.
type Backlog struct {
	Agent, UserID string
	Pending       int64 // actionable events not yet settled
	Queued        int64 // replies enqueued, never attempted
	Attempted     int64 // replies sent or being sent, not yet acknowledged
}

// Backlogs reads every principal's backlog, cheaply enough for each metrics
// scrape.
func (db *DB) Backlogs(ctx context.Context) ([]Backlog, error) {
	rows, err := db.readers.QueryContext(ctx, selectBacklog)
	if err != nil {
		return nil, fmt.Errorf("read backlog: %w", deadlineErr(ctx, err))
	}
	defer rows.Close()
	var out []Backlog
	for rows.Next() {
		var b Backlog
		if err := rows.Scan(&b.Agent, &b.UserID, &b.Pending, &b.Queued, &b.Attempted); err != nil {
			return nil, fmt.Errorf("read backlog: %w", err)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read backlog: %w", deadlineErr(ctx, err))
	}
	return out, nil
}

// PrincipalStatus summarises one principal's rows.
type PrincipalStatus struct {
	Agent, UserID string
	Events        int64 // journal rows
	Pending       int64 // actionable events not yet settled
	Visible       int64 // visible messages
	Undelivered   int64 // outbox rows not yet acknowledged
}

// Status summarises every principal. It counts rows, so it is an operator
// command, not a hot path.
func (db *DB) Status(ctx context.Context) ([]PrincipalStatus, error) {
	rows, err := db.readers.QueryContext(ctx, selectStatus)
	if err != nil {
		return nil, fmt.Errorf("read status: %w", deadlineErr(ctx, err))
	}
	defer rows.Close()
	var out []PrincipalStatus
	for rows.Next() {
		var s PrincipalStatus
		if err := rows.Scan(&s.Agent, &s.UserID, &s.Events, &s.Pending, &s.Visible, &s.Undelivered); err != nil {
			return nil, fmt.Errorf("read status: %w", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read status: %w", deadlineErr(ctx, err))
	}
	return out, nil
}
