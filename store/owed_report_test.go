package store_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// steppedClock is a clock the test moves forward. The writer reads it on
// its own goroutine, so the time is held atomically.
type steppedClock struct{ ms atomic.Int64 }

func (c *steppedClock) Now() time.Time          { return time.UnixMilli(c.ms.Load()).UTC() }
func (c *steppedClock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

// A local leave owes the echo sync will report, but only for a while: an
// echo that never came must not swallow a real departure reported after
// the window, or the new membership would outlive it unfenced.
func TestAnOwedEchoOnlyAbsorbsAReportWithinItsWindow(t *testing.T) {
	const (
		room  = "!owed:example.org"
		alice = "@alice:example.org"
	)
	for _, c := range []struct {
		name    string
		elapsed time.Duration
		outcome journal.DepartureOutcome
		epoch   string
		screen  []string
		owing   []string
	}{
		{"AReportWithinTheWindowIsTheEcho", journal.OwedReportWindow - time.Millisecond,
			journal.OwedReportConsumed, "epoch 1, in", []string{"$n1"}, []string{}},
		{"AReportAfterTheWindowFences", journal.OwedReportWindow + time.Millisecond,
			journal.Fenced, "epoch 2, out", []string{}, []string{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			clock := &steppedClock{}
			clock.ms.Store(testsupport.DefaultNow.UnixMilli())
			s := testsupport.MustOpenWith(t, store.Options{StorageDir: t.TempDir(), Now: clock.Now})
			v, err := s.Principal(ctx, "helper", "@bot:example.org")
			if err != nil {
				t.Fatal(err)
			}
			if o, err := v.FenceDeparture(ctx, room, journal.DepartureLocal, ""); err != nil || o != journal.Fenced {
				t.Fatalf("local leave = %v, %v; want %v", o, err, journal.Fenced)
			}
			if err := v.RecordJoin(ctx, room, "join-1"); err != nil {
				t.Fatal(err)
			}
			if _, err := v.AdmitBatch(ctx, mx.Live(room, mx.Message("$n1", alice, 1000, "after the rejoin")), ""); err != nil {
				t.Fatal(err)
			}

			clock.Advance(c.elapsed)
			o, err := v.FenceDeparture(ctx, room, journal.DepartureReported, "leave-1")
			if err != nil || o != c.outcome {
				t.Fatalf("reported departure %v after the leave = %v, %v; want %v", c.elapsed, o, err, c.outcome)
			}
			epoch, departed, err := v.RoomEpoch(ctx, room)
			if err != nil {
				t.Fatal(err)
			}
			in := "in"
			if departed {
				in = "out"
			}
			if membership := fmt.Sprintf("epoch %d, %s", epoch, in); membership != c.epoch {
				t.Fatalf("membership = %s, want %s", membership, c.epoch)
			}
			if got := screenIDs(t, v, room); !slices.Equal(got, c.screen) {
				t.Fatalf("screen = %q, want %q", got, c.screen)
			}
			owing, err := v.RoomsOwingDepartureReports(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if owing == nil {
				owing = []string{}
			}
			if !slices.Equal(owing, c.owing) {
				t.Fatalf("rooms owing a report = %q, want %q", owing, c.owing)
			}
		})
	}
}
