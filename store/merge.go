package store

import (
	"context"
	"time"

	"github.com/mindroomd/mindroomd/actors/writer"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

// DefaultMergeDelay is how long commits must pause before the unmerged
// tail of the page index is merged in the background, and DefaultMergeAge
// how long a tail may wait at most while commits never pause. Under full
// load neither fires: admission's inline merge at the tail bound moves the
// most rows per merge, which is what makes merging cheap.
const (
	DefaultMergeDelay = 100 * time.Millisecond
	DefaultMergeAge   = 2 * time.Second
)

// runMerges merges the page index's unmerged tail once commits pause for
// delay, or once the tail is DefaultMergeAge old, until ctx ends, so
// readers of a journal at rest scan no tail.
func (s *Store) runMerges(ctx context.Context, delay time.Duration) {
	if delay <= 0 {
		delay = DefaultMergeDelay
	}
	quiet := time.NewTimer(delay)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.merges:
		}
		if s.db.Unmerged() == 0 {
			continue // the commit was the merge itself, or left no tail
		}
		quiet.Reset(delay)
		deadline := time.After(DefaultMergeAge)
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.merges:
				quiet.Reset(delay)
			case <-quiet.C:
				break wait
			case <-deadline:
				break wait
			}
		}
		if s.db.Unmerged() == 0 {
			continue // admission merged it meanwhile
		}
		if _, err := s.MergePageTail(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("Page index merge failed; the unmerged tail waits for the next")
		}
	}
}

// MergePageTail moves the page index's unmerged tail into it now and
// reports how many rows moved. The store merges on its own after commits;
// this is for tools and benchmarks that want to start from a merged index.
func (s *Store) MergePageTail(ctx context.Context) (int64, error) {
	n, err := s.exec(ctx, "merge_page_tail", 0, func(t *writer.Tx) (any, error) {
		return sqlitefs.MergePageTail(s.tx(t))
	})
	if err != nil {
		return 0, err
	}
	return n.(int64), nil
}
