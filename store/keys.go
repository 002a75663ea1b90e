package store

import (
	"context"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
)

var _ journal.Keys = (*View)(nil)

// expireBatch bounds how many events one expiry command settles, so a
// backlog of undecryptable events never holds the writer for long.
const expireBatch = 256

// KeyWaits implements journal.Keys.
func (v *View) KeyWaits(ctx context.Context, limit int) ([]journal.KeyWait, error) {
	return journalsql.KeyWaits(ctx, v.r, v.p, limit)
}

// AwaitingFor implements journal.Keys.
func (v *View) AwaitingFor(ctx context.Context, room, session string, limit int) ([]journal.AwaitingEvent, error) {
	return journalsql.AwaitingFor(ctx, v.r, v.p, room, session, limit)
}

// ResolveAwaiting implements journal.Keys. The cleartext is parsed here,
// in the caller's goroutine, as admission's events are.
func (v *View) ResolveAwaiting(ctx context.Context, seq int64, clear journal.Inbound) (journal.KeyOutcome, error) {
	var out journal.KeyOutcome
	parsed := journal.Parse([]journal.Inbound{clear}, v.now())[0]
	err := v.w.Do(ctx, "resolve awaiting", len(clear.Event), func(tx journalsql.Tx) (hints []hint.Hint, err error) {
		out, hints, err = journalsql.ResolveAwaiting(tx, v.p, seq, parsed)
		return hints, err
	})
	if err != nil {
		return 0, err
	}
	return out, nil
}

// ExpireAwaiting implements journal.Keys, in batches of expireBatch.
func (v *View) ExpireAwaiting(ctx context.Context, cutoffMS int64) (int, error) {
	total := 0
	for {
		var n int
		err := v.do(ctx, "expire awaiting", 0, func(tx journalsql.Tx) (err error) {
			n, err = journalsql.ExpireAwaiting(tx, v.p, cutoffMS, expireBatch)
			return err
		})
		if err != nil {
			return total, err
		}
		total += n
		if n < expireBatch {
			return total, nil
		}
	}
}
