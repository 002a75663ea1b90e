package store

import (
	"context"
	"fmt"

	"github.com/mindroomd/mindroomd/actors/writer"
	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

// View is the store bound to one principal. It implements
// journal.PrincipalStore; hand collaborators the narrow interface they need.
type View struct {
	s *Store
	p sqlitefs.Principal
}

var _ journal.PrincipalStore = (*View)(nil)

// Hints returns the store's after-commit bus, on which this view's
// commits are published.
func (v *View) Hints() *hint.Bus { return v.s.hints }

// Principal names the bound principal.
func (v *View) Principal() journal.Principal { return v.p.Principal }

// write runs a command that returns a value and hints through the writer.
func write[T any](ctx context.Context, v *View, name string, size int, run func(tx *sqlitefs.Tx) (T, []hint.Hint, error)) (T, error) {
	res, err := v.s.exec(ctx, name, size, func(t *writer.Tx) (any, error) {
		out, hints, err := run(v.s.tx(t))
		if err != nil {
			return nil, err
		}
		for _, h := range hints {
			t.Hint(h)
		}
		return out, nil
	})
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s: %w", name, err)
	}
	return res.(T), nil
}

// AdmitBatch implements journal.Admission. Events are parsed here, in the
// caller's goroutine, so the writer's single thread only runs SQL.
func (v *View) AdmitBatch(ctx context.Context, events []journal.Inbound, nextBatch string) ([]journal.AdmitResult, error) {
	size := len(nextBatch)
	for _, e := range events {
		size += len(e.Event)
	}
	parsed := journal.Parse(events, v.s.now())
	return write(ctx, v, "admit batch", size, func(tx *sqlitefs.Tx) ([]journal.AdmitResult, []hint.Hint, error) {
		return sqlitefs.AdmitBatch(tx, v.p, parsed, nextBatch)
	})
}

// SyncToken implements journal.Admission.
func (v *View) SyncToken(ctx context.Context) (string, error) { return v.s.db.SyncToken(ctx, v.p) }

// Pending implements journal.Replay.
func (v *View) Pending(ctx context.Context, limit int, after int64) (journal.PendingPage, error) {
	return v.s.db.Pending(ctx, v.p, limit, after)
}

// Settle implements journal.Replay.
func (v *View) Settle(ctx context.Context, eventIDs ...string) (int, error) {
	return write(ctx, v, "settle", 0, func(tx *sqlitefs.Tx) (int, []hint.Hint, error) {
		n, err := sqlitefs.Settle(tx, v.p, eventIDs)
		return n, nil, err
	})
}

// Read implements journal.ConversationReader.
func (v *View) Read(ctx context.Context, req journal.ReadRequest) (journal.Page, error) {
	return v.s.db.Read(ctx, v.p, req)
}

// AdmittedThreadID implements journal.RelationLookup.
func (v *View) AdmittedThreadID(ctx context.Context, roomID, eventID string) (*string, bool, error) {
	thread, ok, err := v.s.db.AdmittedThreadID(ctx, v.p, roomID, eventID)
	return journal.DecodeThread(thread), ok, err
}

// AdmittedEvent implements journal.RelationLookup.
func (v *View) AdmittedEvent(ctx context.Context, eventID string) (journal.AdmittedEvent, bool, error) {
	room, thread, pending, ok, err := v.s.db.AdmittedEvent(ctx, v.p, eventID)
	return journal.AdmittedEvent{RoomID: room, Thread: journal.DecodeThread(thread), Pending: pending}, ok, err
}

// LatestVisibleEventID implements journal.RelationLookup.
func (v *View) LatestVisibleEventID(ctx context.Context, roomID string, thread *string) (string, bool, error) {
	return v.s.db.LatestVisibleEventID(ctx, v.p, roomID, thread)
}

// InstallHistory implements journal.Hydration. Events are parsed here, in
// the caller's goroutine, as admission's are.
func (v *View) InstallHistory(ctx context.Context, roomID string, epoch int64, events []journal.Inbound) (journal.HistoryResult, error) {
	size := 0
	for _, e := range events {
		size += len(e.Event)
	}
	parsed := journal.Parse(events, v.s.now())
	return write(ctx, v, "install history", size, func(tx *sqlitefs.Tx) (journal.HistoryResult, []hint.Hint, error) {
		res, err := sqlitefs.InstallHistory(tx, v.p, roomID, epoch, parsed)
		return res, nil, err
	})
}

// MarkCovered implements journal.Hydration.
func (v *View) MarkCovered(ctx context.Context, roomID string, thread *string, epoch int64) error {
	key, err := journal.EncodeThread(thread)
	if err != nil {
		return err
	}
	_, err = write(ctx, v, "mark covered", 0, func(tx *sqlitefs.Tx) (struct{}, []hint.Hint, error) {
		return struct{}{}, nil, sqlitefs.MarkCovered(tx, v.p, roomID, key, epoch)
	})
	return err
}

// Covered implements journal.Hydration.
func (v *View) Covered(ctx context.Context, roomID string, thread *string) (bool, error) {
	key, err := journal.EncodeThread(thread)
	if err != nil {
		return false, err
	}
	return v.s.db.Covered(ctx, v.p, roomID, key)
}

// RefreshDebt implements journal.Hydration.
func (v *View) RefreshDebt(ctx context.Context, roomID, eventID string) (journal.RefreshDebt, bool, error) {
	return v.s.db.RefreshDebt(ctx, v.p, roomID, eventID)
}

// ApplyRefetch implements journal.Hydration.
func (v *View) ApplyRefetch(ctx context.Context, r journal.Refetched) (journal.RefetchOutcome, error) {
	return write(ctx, v, "apply refetch", 0, func(tx *sqlitefs.Tx) (journal.RefetchOutcome, []hint.Hint, error) {
		outcome, err := sqlitefs.ApplyRefetch(tx, v.p, r)
		return outcome, nil, err
	})
}
