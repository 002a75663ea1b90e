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
