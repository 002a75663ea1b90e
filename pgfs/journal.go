package pgfs

import (
	"context"
	"errors"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

var errNotBuilt = errors.New("not built yet")

// AdmitBatch journals one parsed sync batch for p in tx.
func AdmitBatch(tx *Tx, p Principal, events []journal.Parsed, nextBatch string) ([]journal.AdmitResult, []hint.Hint, error) {
	return nil, nil, errNotBuilt
}

// Settle settles p's pending events.
func Settle(tx *Tx, p Principal, eventIDs []string) (int, error) { return 0, errNotBuilt }

func (s *Store) pending(ctx context.Context, p Principal, limit int, after int64) (journal.PendingPage, error) {
	return journal.PendingPage{}, errNotBuilt
}

func (s *Store) admittedThreadID(ctx context.Context, p Principal, room, eventID string) (string, bool, error) {
	return "", false, errNotBuilt
}

func (s *Store) admittedEvent(ctx context.Context, p Principal, eventID string) (room, thread string, pending, seen bool, err error) {
	return "", "", false, false, errNotBuilt
}

// InstallHistory installs one chunk of history.
func InstallHistory(tx *Tx, p Principal, room string, epoch int64, events []journal.Parsed) (journal.HistoryResult, error) {
	return journal.HistoryResult{}, errNotBuilt
}

// MarkCovered publishes a coverage marker.
func MarkCovered(tx *Tx, p Principal, room, thread string, epoch int64) error { return errNotBuilt }

func (s *Store) covered(ctx context.Context, p Principal, room, thread string) (bool, error) {
	return false, errNotBuilt
}

func (s *Store) refreshDebt(ctx context.Context, p Principal, room, eventID string) (journal.RefreshDebt, bool, error) {
	return journal.RefreshDebt{}, false, errNotBuilt
}

// ApplyRefetch installs a refetched revision.
func ApplyRefetch(tx *Tx, p Principal, r journal.Refetched) (journal.RefetchOutcome, error) {
	return 0, errNotBuilt
}
