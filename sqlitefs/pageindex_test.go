package sqlitefs_test

import (
	"errors"
	"github.com/mindroomd/mindroomd/journalsql"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

// A command that admits a message and then fails counts a tail row that
// its rollback takes away. Planning a merge finds no tail and corrects the
// estimate, whether or not merged rows came before; a merger that trusted
// the estimate would plan empty cycles for ever.
func TestAMergePlanOverAnEmptyTailCorrectsTheEstimate(t *testing.T) {
	for name, mergedBefore := range map[string]bool{"an empty journal": false, "a merged message": true} {
		t.Run(name, func(t *testing.T) {
			db := openDB(t, t.TempDir())
			b := beginBatch(t, db)
			var p journalsql.Principal
			must(t, b.command(func(tx *sqlitefs.Tx) (err error) {
				p, err = journalsql.RegisterPrincipal(tx, journal.Principal{Agent: "merger", UserID: "@bot:example.org"})
				return err
			}))
			if mergedBefore {
				must(t, b.command(func(*sqlitefs.Tx) error { return admitText(b, p, "!r:example.org", "$kept", 1000) }))
				must(t, b.command(func(tx *sqlitefs.Tx) error {
					_, err := sqlitefs.MergePageTail(tx)
					return err
				}))
			}
			failed := errors.New("the command fails after admitting")
			if err := b.command(func(*sqlitefs.Tx) error {
				must(t, admitText(b, p, "!r:example.org", "$gone", 2000))
				return failed
			}); !errors.Is(err, failed) {
				t.Fatalf("the failing command returned %v", err)
			}
			if db.Unmerged() != 1 {
				t.Fatalf("the rolled-back row left an estimate of %d, want the 1 this test corrects", db.Unmerged())
			}
			must(t, b.command(func(tx *sqlitefs.Tx) error {
				plan, err := sqlitefs.PlanPageMerge(tx, 128)
				if err == nil && len(plan.Chunks) != 0 {
					t.Errorf("a plan over an empty tail has chunks %v", plan.Chunks)
				}
				return err
			}))
			b.commit()
			if left := db.Unmerged(); left != 0 {
				t.Fatalf("after planning over an empty tail the estimate is %d, want 0", left)
			}
		})
	}
}
