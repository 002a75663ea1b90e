package store_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// A thread's root closes its last page, and it is charged to the page's
// budget like any reply: when the replies nearly fill the budget, a large
// root does not ride along over it but starts the next page, which the
// cursor leads to.
func TestARootThatNoLongerFitsTheBudgetMovesToTheNextPage(t *testing.T) {
	const (
		room   = "!budget:example.org"
		alice  = "@alice:example.org"
		stored = 1000
	)
	// The default bound leaves these few rows in the unmerged tail; a
	// bound of 1 merges every row into the page index.
	for _, c := range []struct {
		name string
		tail int
	}{{"RowsInTheUnmergedTail", 0}, {"RowsInThePageIndex", 1}} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			s := testsupport.MustOpenWith(t, store.Options{StorageDir: t.TempDir(), MaxUnmergedTail: c.tail,
				PageBudget: journal.PageBudget{StoredLimit: stored, DecodedLimit: 1 << 20}})
			v, err := s.Principal(ctx, "reader", "@bot:example.org")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := v.AdmitBatch(ctx, mx.Live(room,
				mx.Message("$root", alice, 1000, strings.Repeat("r", 400)),
				mx.ThreadReply("$t1", alice, 1001, "$root", strings.Repeat("a", 150)),
				mx.ThreadReply("$t2", alice, 1002, "$root", strings.Repeat("b", 150)),
				mx.ThreadReply("$t3", alice, 1003, "$root", strings.Repeat("c", 150)),
			), ""); err != nil {
				t.Fatal(err)
			}
			thread := "$root"
			read := func(before *journal.Cursor) journal.Page {
				t.Helper()
				p, err := v.Read(ctx, journal.ReadRequest{RoomID: room, Thread: &thread, Limit: 10, Before: before})
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
			ids := func(p journal.Page) (out []string, size int) {
				for _, m := range p.Messages {
					out = append(out, m.EventID)
					size += len(m.Content)
				}
				return out, size
			}

			first := read(nil)
			got, replies := ids(first)
			if !slices.Equal(got, []string{"$t1", "$t2", "$t3"}) {
				t.Fatalf("first page = %q (%d bytes), want the three replies without the root", got, replies)
			}
			if first.NextCursor == nil || first.NextCursor.EventID != "$t1" {
				t.Fatalf("first page's cursor = %+v, want one after $t1 leading to the root", first.NextCursor)
			}
			second := read(first.NextCursor)
			got, root := ids(second)
			if !slices.Equal(got, []string{"$root"}) || second.NextCursor != nil {
				t.Fatalf("second page = %q, cursor %+v; want the root and the end", got, second.NextCursor)
			}
			// The case is the intended one: the replies fit, the root on top
			// of them would not.
			if replies > stored || replies+root <= stored {
				t.Fatalf("test setup: replies %d bytes and root %d against a budget of %d", replies, root, stored)
			}
		})
	}
}
