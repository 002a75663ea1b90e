package pgfs

import (
	"context"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
)

// selectBacklog counts what each principal still owes through the partial
// indexes on pending events and unacknowledged deliveries: it is read at
// every metrics scrape, so it never scans the whole journal or outbox.
const selectBacklog = `SELECT p.agent, p.user_id,
		(SELECT count(*) FROM journal_events j WHERE j.principal = p.id AND j.state = 0),
		(SELECT count(*) FROM delivery_outbox o WHERE o.principal = p.id AND o.state IN (0, 1) AND o.state = 0),
		(SELECT count(*) FROM delivery_outbox o WHERE o.principal = p.id AND o.state IN (0, 1) AND o.state = 1)
	FROM principals p ORDER BY p.agent, p.user_id`

// Backlogs reads what every principal still owes.
func (s *Store) Backlogs(ctx context.Context) ([]journal.Backlog, error) {
	rows, err := s.pool.Query(ctx, selectBacklog)
	if err != nil {
		return nil, fmt.Errorf("read backlog: %w", err)
	}
	defer rows.Close()
	var out []journal.Backlog
	for rows.Next() {
		var b journal.Backlog
		if err := rows.Scan(&b.Agent, &b.UserID, &b.Pending, &b.Queued, &b.Attempted); err != nil {
			return nil, fmt.Errorf("read backlog: %w", err)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read backlog: %w", err)
	}
	return out, nil
}
