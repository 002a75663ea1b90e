package principal

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// gapHomeserver answers one /messages page: the events of a limited
// timeline's gap, newest first.
type gapHomeserver struct {
	Transport
	chunk []json.RawMessage
}

func (g *gapHomeserver) UserID() string { return "@bot:example.org" }

func (g *gapHomeserver) Messages(context.Context, string, string, matrix.Direction, int) (matrix.MessagesPage, error) {
	return matrix.MessagesPage{Chunk: g.chunk, End: "end"}, nil
}

func TestAGapFillStopsAtEventsOlderThanTheIdentitiesRetentionForgot(t *testing.T) {
	ctx := context.Background()
	const room = "!gap:example.org"
	clock := &testsupport.ShiftClock{Base: testsupport.DefaultNow}
	s := testsupport.MustOpenWith(t, store.Options{StorageDir: t.TempDir(), Now: clock.Now})
	v, err := s.Principal(ctx, "bot", "@bot:example.org")
	if err != nil {
		t.Fatal(err)
	}
	start := testsupport.DefaultNow.UnixMilli()
	answered := mx.Message("$answered", "@alice:example.org", start, "answered long ago")
	if _, err := v.AdmitBatch(ctx, mx.Live(room, answered), "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Settle(ctx, "$answered"); err != nil {
		t.Fatal(err)
	}
	// Three days on, a sync stores a new token, and retention forgets the
	// answered event.
	clock.Advance(72 * time.Hour)
	if _, err := v.AdmitBatch(ctx, nil, "s2"); err != nil {
		t.Fatal(err)
	}
	n, err := v.Retain(ctx, journal.RetentionPolicy{Bodies: time.Hour, Identities: journal.MinIdentityWindow})
	if err != nil || n.Identities != 1 {
		t.Fatalf("retention pruned %+v, %v; want the answered event's identity", n, err)
	}
	if _, seen, err := v.AdmittedThreadID(ctx, room, "$answered"); err != nil || seen {
		t.Fatalf("the journal still knows $answered (%v, %v)", seen, err)
	}

	// A limited sync's gap holds a message missed just now and, behind it,
	// the answered one: only the missed one is recovered.
	now := clock.Now().UnixMilli()
	missed := mx.Message("$missed", "@alice:example.org", now-60_000, "missed while away")
	a := turnActor(v, nil, &gapHomeserver{chunk: []json.RawMessage{missed.JSON(), answered.JSON()}},
		func(d *Deps) { d.Now = clock.Now })
	got, err := a.fillGap(ctx, matrix.RoomTimeline{RoomID: room, Limited: true, PrevBatch: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("recovered %d events, want only $missed: an event older than the identity horizon may be one answered", len(got))
	}
	var ev struct {
		ID string `json:"event_id"`
	}
	if err := json.Unmarshal(got[0].Event, &ev); err != nil || ev.ID != "$missed" || got[0].Provenance != journal.Recovered {
		t.Fatalf("recovered %s (%v)", got[0].Event, err)
	}
}
