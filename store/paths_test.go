package store_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// The storage directory is whatever a person types: relative to the working
// directory (the default is), or named with characters a URI gives meaning
// to. Each must open, keep what was committed, and reopen.
func TestAJournalOpensWhereverItsStorageDirectoryIsNamed(t *testing.T) {
	for _, dir := range []string{"", "./mindroom_data", "st", "nested/dir", "with space", "what?", "hash#tag", "per%20cent", "trailing/"} {
		t.Run(dir, func(t *testing.T) {
			work := t.TempDir()
			t.Chdir(work)
			ctx := context.Background()
			open := func() *store.Store {
				t.Helper()
				s, err := store.Open(ctx, store.Options{StorageDir: dir, Now: (&testsupport.Clock{T: testsupport.DefaultNow}).Now})
				if err != nil {
					t.Fatalf("Open(%q): %v", dir, err)
				}
				return s
			}
			s := open()
			v, err := s.Principal(ctx, "helper", "@bot:example.org")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := v.AdmitBatch(ctx, mx.Live("!r:example.org", mx.Message("$a", "@alice:example.org", 1000, "hi")), "tok"); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			want := dir
			if want == "" {
				want = "mindroom_data"
			}
			if _, err := os.Stat(filepath.Join(work, want, "tracking", "event_journal.db")); err != nil {
				t.Fatalf("the journal is not under the working directory: %v", err)
			}
			s = open()
			defer s.Close()
			v, err = s.Principal(ctx, "helper", "@bot:example.org")
			if err != nil {
				t.Fatal(err)
			}
			if tok, err := v.SyncToken(ctx); err != nil || tok != "tok" {
				t.Fatalf("sync token after reopening = %q, %v; want tok", tok, err)
			}
		})
	}
}
