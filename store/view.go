package store

import (
	"context"
	"fmt"

	"github.com/mindroomd/mindroomd/actors/writer"
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

// Principal names the bound principal.
func (v *View) Principal() journal.Principal { return v.p.Principal }

type admitted struct{ results []journal.AdmitResult }

// AdmitBatch implements journal.Admission.
func (v *View) AdmitBatch(ctx context.Context, events []journal.Inbound, nextBatch string) ([]journal.AdmitResult, error) {
	size := len(nextBatch)
	for _, e := range events {
		size += len(e.Event)
	}
	parsed := sqlitefs.Parse(events, v.s.now())
	res, err := v.s.exec(ctx, "admit_batch", size, func(t *writer.Tx) (any, error) {
		results, hints, err := sqlitefs.AdmitBatch(v.s.tx(t), v.p, parsed, nextBatch)
		if err != nil {
			return nil, err
		}
		for _, h := range hints {
			t.Hint(h)
		}
		return admitted{results}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("admit batch: %w", err)
	}
	return res.(admitted).results, nil
}

// SyncToken implements journal.Admission.
func (v *View) SyncToken(ctx context.Context) (string, error) { return v.s.db.SyncToken(ctx, v.p) }

// Pending implements journal.Replay.
func (v *View) Pending(ctx context.Context, limit int, after int64) (journal.PendingPage, error) {
	return v.s.db.Pending(ctx, v.p, limit, after)
}

// Settle implements journal.Replay.
func (v *View) Settle(ctx context.Context, eventIDs ...string) (int, error) {
	res, err := v.s.exec(ctx, "settle", 0, func(t *writer.Tx) (any, error) {
		return sqlitefs.Settle(v.s.tx(t), v.p, eventIDs)
	})
	if err != nil {
		return 0, fmt.Errorf("settle: %w", err)
	}
	return res.(int), nil
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

// LatestVisibleEventID implements journal.RelationLookup.
func (v *View) LatestVisibleEventID(ctx context.Context, roomID string, thread *string) (string, bool, error) {
	return v.s.db.LatestVisibleEventID(ctx, v.p, roomID, thread)
}
