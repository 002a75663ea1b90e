package pgfs

import (
	"context"
	"fmt"
)

// selectStatus reads every figure of every principal in one statement, so
// they come from one snapshot; the outbox states are journal.DeliveryState's.
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
			count(*) FILTER (WHERE state = 0) AS queued, count(*) FILTER (WHERE state = 1) AS attempted,
			count(*) FILTER (WHERE state = 2) AS acknowledged, count(*) FILTER (WHERE state = 3) AS failed,
			count(*) FILTER (WHERE state = 4) AS retired
		FROM delivery_outbox GROUP BY principal) o ON o.principal = p.id
	ORDER BY p.agent, p.user_id`

// selectSize is the space the journal's tables and indexes take in the
// schema it lives in.
const selectSize = `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = current_schema() AND c.relkind = 'r'`

// Size is the bytes the journal's tables and their indexes take.
func (s *Store) Size(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, selectSize).Scan(&n); err != nil {
		return 0, fmt.Errorf("read size: %w", err)
	}
	return n, nil
}

// selectBacklog counts what each principal still owes through the partial
// indexes on pending events and unacknowledged deliveries: it is read at
// every metrics scrape, so it never scans the whole journal or outbox.
const selectBacklog = `SELECT p.agent, p.user_id,
		(SELECT count(*) FROM journal_events j WHERE j.principal = p.id AND j.state = 0),
		(SELECT count(*) FROM delivery_outbox o WHERE o.principal = p.id AND o.state IN (0, 1) AND o.state = 0),
		(SELECT count(*) FROM delivery_outbox o WHERE o.principal = p.id AND o.state IN (0, 1) AND o.state = 1),
		(SELECT count(*) FROM awaiting_keys a WHERE a.principal = p.id)
	FROM principals p ORDER BY p.agent, p.user_id`
