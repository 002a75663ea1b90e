package hydrator

import (
	"context"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
)

// refetch reads one logical message again from the server, its original
// and its edits, and installs the revision they reduce to, if the debt
// read before asking still stands when the answer is installed.
func (d *Deps) refetch(ctx context.Context, room, eventID string) (journal.RefetchOutcome, Walk, error) {
	start := d.Now()
	w := Walk{Kind: "refetch", RoomID: room}
	debt, owed, err := d.Store.RefreshDebt(ctx, room, eventID)
	if err != nil || !owed {
		// Paid meanwhile, or gone: nothing to fetch.
		return journal.RefetchSuperseded, w, err
	}
	wk := &walker{d: d, room: room, walk: w}
	raw, err := wk.event(ctx, eventID)
	if err != nil {
		return 0, wk.walk, fmt.Errorf("refetch %s: %w", eventID, err)
	}
	original, err := journal.ParseEvent(d.history(ctx, room, raw), d.Now())
	if err != nil {
		return 0, wk.walk, fmt.Errorf("refetch %s: %w", eventID, err)
	}
	r := journal.Refetched{Debt: debt, Original: original}
	// The newest edits, as many as the ceiling allows.
	edits, _, err := wk.collect(ctx, eventID, "m.replace", nil, d.Ceiling)
	if err != nil {
		return 0, wk.walk, fmt.Errorf("refetch %s: %w", eventID, err)
	}
	wk.walk.Events += len(edits)
	for _, raw := range edits {
		// An edit that does not parse is no candidate; the rules choose
		// among the rest.
		if e, err := journal.ParseEvent(d.history(ctx, room, raw), d.Now()); err == nil {
			r.Edits = append(r.Edits, e)
		}
	}
	outcome, err := d.Store.ApplyRefetch(ctx, r)
	wk.walk.Took = d.Now().Sub(start)
	if err == nil && outcome == journal.RefetchInstalled {
		wk.walk.Installed, wk.walk.Chunks = 1, 1
	}
	return outcome, wk.walk, err
}
