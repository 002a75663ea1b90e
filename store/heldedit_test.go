package store_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// An edit is held only while its target is unknown to the journal: a target
// the journal holds but does not show will never project, so an edit held
// for it would keep its plaintext for good. And the arrival of its target,
// whatever the target turns out to be, resolves every held edit of it.
func TestAHeldEditNeverOutlivesTheArrivalOfItsTarget(t *testing.T) {
	const (
		room  = "!held:example.org"
		alice = "@alice:example.org"
	)
	type step struct {
		events []mx.Ev
		leave  bool // a local leave instead of events
		join   bool // a rejoin instead of events
	}
	admit := func(evs ...mx.Ev) step { return step{events: evs} }
	for _, c := range []struct {
		name   string
		steps  []step
		screen []string
	}{
		{
			name:  "TheTargetIsUndecryptable",
			steps: []step{admit(mx.Encrypted("$enc", alice, 1000)), admit(mx.Edit("$e1", alice, 2000, "$enc", "secret words"))},
		},
		{
			name: "TheTargetIsItselfAnEdit",
			steps: []step{admit(mx.Message("$m1", alice, 1000, "first")), admit(mx.Edit("$e1", alice, 2000, "$m1", "second")),
				admit(mx.Edit("$e2", alice, 3000, "$e1", "secret words"))},
			screen: []string{"$m1:second"},
		},
		{
			name: "TheTargetWasFenced",
			steps: []step{admit(mx.Message("$m1", alice, 1000, "first")), {leave: true}, {join: true},
				admit(mx.Edit("$e1", alice, 2000, "$m1", "secret words"))},
		},
		{
			name:  "TheTargetArrivesUndecryptableAfterTheEdit",
			steps: []step{admit(mx.Edit("$e1", alice, 2000, "$enc", "secret words")), admit(mx.Encrypted("$enc", alice, 1000))},
		},
		{
			name: "TheTargetArrivesWhileOutOfTheRoom",
			steps: []step{admit(mx.Edit("$e1", alice, 2000, "$m1", "secret words")), {leave: true},
				admit(mx.Message("$m1", alice, 1000, "first"))},
		},
		{
			name:   "TheTargetArrivesAsAMessage",
			steps:  []step{admit(mx.Edit("$e1", alice, 2000, "$m1", "edited")), admit(mx.Message("$m1", alice, 1000, "first"))},
			screen: []string{"$m1:edited"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			s, _ := testsupport.MustOpen(t)
			v, err := s.Principal(ctx, "helper", "@bot:example.org")
			if err != nil {
				t.Fatal(err)
			}
			for _, st := range c.steps {
				switch {
				case st.leave:
					if _, err := v.FenceDeparture(ctx, room, journal.DepartureLocal, ""); err != nil {
						t.Fatal(err)
					}
				case st.join:
					if err := v.RecordJoin(ctx, room, ""); err != nil {
						t.Fatal(err)
					}
				default:
					if _, err := v.AdmitBatch(ctx, mx.Live(room, st.events...), ""); err != nil {
						t.Fatal(err)
					}
				}
			}
			var held int
			if err := s.DB().QueryPool().QueryRowContext(ctx, `SELECT count(*) FROM unresolved_edits`).Scan(&held); err != nil {
				t.Fatal(err)
			}
			if held != 0 {
				t.Errorf("held edits = %d, want none", held)
			}
			page := read(t, v, room)
			var screen []string
			for _, m := range page.Messages {
				screen = append(screen, m.EventID+":"+bodyText(t, m.Content))
			}
			if !slices.Equal(screen, c.screen) {
				t.Errorf("screen = %v, want %v", screen, c.screen)
			}
		})
	}
}

// bodyText is a content's body.
func bodyText(t *testing.T, content json.RawMessage) string {
	t.Helper()
	var c struct {
		Body string `json:"body"`
	}
	if err := json.Unmarshal(content, &c); err != nil {
		t.Fatalf("content %s: %v", content, err)
	}
	return c.Body
}
