package pgfs

import (
	"context"

	"github.com/mindroomd/mindroomd/journal"
)

func (s *Store) read(ctx context.Context, p Principal, req journal.ReadRequest) (journal.Page, error) {
	return journal.Page{}, errNotBuilt
}

func (s *Store) latestVisibleEventID(ctx context.Context, p Principal, room string, thread *string) (string, bool, error) {
	return "", false, errNotBuilt
}
