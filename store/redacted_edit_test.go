package store_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const countHeldEdits = `SELECT count(*) FROM unresolved_edits`

// An edit of a redacted message has nothing left to apply to and must never
// wait for its target either: holding it would write the words the
// redaction removed to disk. Whether the target arrived before its
// redaction or not at all, the edit leaves no held row, and its body
// reaches no page of the file (the edit is context-only, so nothing else
// stores it).
func TestAnEditOfARedactedMessageLeavesNothingOnDisk(t *testing.T) {
	const (
		room  = "!redacted:example.org"
		alice = "@alice:example.org"
		// The edit's body is written nowhere, so any copy of it in the
		// files is a leak, whether in a table, a free page or the WAL.
		body = "edit-of-a-redacted-message-c41f9e"
	)
	for _, c := range []struct {
		name   string
		before []mx.Ev // batches admitted before the edit, one event each
		after  []mx.Ev // batches admitted after it
		screen []string
	}{
		{
			name:   "TheTargetArrivedBeforeItsRedaction",
			before: []mx.Ev{mx.Message("$m1", alice, 1000, "draft"), mx.Redaction("$x1", alice, 2000, "$m1")},
		},
		{
			name:   "TheTargetNeverArrived",
			before: []mx.Ev{mx.Redaction("$x1", alice, 2000, "$m1")},
		},
		{
			name:   "TheTargetArrivesAfterTheEdit",
			before: []mx.Ev{mx.Redaction("$x1", alice, 2000, "$m1")},
			after:  []mx.Ev{mx.Message("$m1", alice, 1000, "draft"), mx.Message("$m2", alice, 4000, "next")},
			screen: []string{"$m2"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			s, dir := testsupport.MustOpen(t)
			v, err := s.Principal(ctx, "helper", "@bot:example.org")
			if err != nil {
				t.Fatal(err)
			}
			admit := func(e mx.Ev) {
				t.Helper()
				res, err := v.AdmitBatch(ctx, mx.Live(room, e), "")
				if err != nil || res[0].Outcome != journal.Admitted {
					t.Fatalf("admit %v: %+v, %v", e["event_id"], res, err)
				}
			}
			for _, e := range c.before {
				admit(e)
			}
			admit(mx.Edit("$e1", alice, 3000, "$m1", body))
			var held int
			if err := openRaw(t, dir).QueryRowContext(ctx, countHeldEdits).Scan(&held); err != nil {
				t.Fatal(err)
			}
			if held != 0 {
				t.Fatalf("%d held edits after an edit of a redacted message, want none", held)
			}
			for _, e := range c.after {
				admit(e)
			}
			want := c.screen
			if want == nil {
				want = []string{}
			}
			if got := screenIDs(t, v, room); !slices.Equal(got, want) {
				t.Fatalf("screen = %q, want %q", got, want)
			}
			// Everything committed is in the file or its WAL now; after
			// Close the WAL is checkpointed into the file and truncated.
			requireNotOnDisk(t, dir, body)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			requireNotOnDisk(t, dir, body)
		})
	}
}

// requireNotOnDisk fails the test if any file of the journal under dir
// holds secret.
func requireNotOnDisk(t *testing.T, dir, secret string) {
	t.Helper()
	files, err := filepath.Glob(sqlitefs.Path(dir) + "*")
	if err != nil || len(files) == 0 {
		t.Fatalf("journal files under %s: %v, %v", dir, files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(secret)) {
			t.Fatalf("%s holds the redacted message's edit %q", filepath.Base(f), secret)
		}
	}
}
