package crash

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// Child is the child half of the proof, for the test Journal.ChildTest
// names: it opens the journal with open and admits batches, resuming after
// the stored sync token, until it is killed. It never returns.
func Child[S journal.Store](t *testing.T, open func(ctx context.Context) (S, error)) {
	ctx := context.Background()
	_, p, err := openView(ctx, open)
	if err != nil {
		t.Fatalf("child: open: %v", err)
	}
	tok, err := p.SyncToken(ctx)
	if err != nil {
		t.Fatalf("child: read sync token: %v", err)
	}
	last, err := batchOf(tok)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	ts := sentAt.UnixMilli()
	for n := last + 1; ; n++ {
		evs := make([]mx.Ev, eventsPerBatch)
		for i := range evs {
			evs[i] = mx.Message(eventID(n, i), sender, ts, fmt.Sprintf("batch %d event %d", n, i))
		}
		if _, err := p.AdmitBatch(ctx, mx.Live(room, evs...), token(n)); err != nil {
			t.Fatalf("child: admit batch %d: %v", n, err)
		}
		// os.Stdout is unbuffered: the line is in the pipe when this returns.
		if _, err := fmt.Fprintf(os.Stdout, "ACK %d\n", n); err != nil {
			// The parent is gone.
			os.Exit(2)
		}
	}
}
