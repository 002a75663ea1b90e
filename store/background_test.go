package store

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// A conversation reads the same, in order, whether its rows sit in the
// unmerged tail, in the page index, or straddle the two at any chunk
// boundary.
func TestChunkedMergesNeverChangeWhatAPageReads(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Options{StorageDir: t.TempDir(), MaxUnmergedTail: 1000, MergeDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v, err := s.Principal(ctx, "reader", "@bot:example.org")
	if err != nil {
		t.Fatal(err)
	}
	const room, n = "!room:example.org", 10
	var want []string
	var evs []mx.Ev
	for i := range n {
		id := fmt.Sprintf("$m%02d", i)
		// Timestamps out of receipt order, so merge order and page order differ.
		evs = append(evs, mx.Message(id, "@alice:example.org", int64(1000+(i*7)%n), "hi"))
	}
	if _, err := v.AdmitBatch(ctx, mx.Live(room, evs...), ""); err != nil {
		t.Fatal(err)
	}
	page, err := v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: n})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range page.Messages {
		want = append(want, m.EventID)
	}
	if len(want) != n {
		t.Fatalf("read %d messages before any merge, want %d", len(want), n)
	}
	for step, wantMoved := range []int64{3, 3, 3, 1, 0} {
		moved, err := s.mergeTail(ctx, 3)
		if err != nil || moved != wantMoved {
			t.Fatalf("merge %d moved %d (%v), want %d", step, moved, err, wantMoved)
		}
		for _, limit := range []int{1, 2, 4, n} {
			var got []string
			var before *journal.Cursor
			for {
				p, err := v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: limit, Before: before})
				if err != nil {
					t.Fatal(err)
				}
				ids := make([]string, 0, len(p.Messages))
				for _, m := range p.Messages {
					ids = append(ids, m.EventID)
				}
				got = append(ids, got...)
				if p.NextCursor == nil {
					break
				}
				before = p.NextCursor
			}
			if !slices.Equal(got, want) {
				t.Fatalf("after merge %d, pages of %d read %v, want %v", step, limit, got, want)
			}
		}
	}
	if left := s.db.Unmerged(); left != 0 {
		t.Fatalf("unmerged estimate %d after the tail emptied", left)
	}
}
