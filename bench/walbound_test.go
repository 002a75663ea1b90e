package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
)

// walBoundSenders saturates the writer, as the throughput rounds do.
const (
	walBoundSenders = 256
	walBoundReaders = 4
	// walBoundSample is how often the WAL file's size is looked at.
	walBoundSample = 10 * time.Millisecond
)

// BenchmarkWALBound measures how large the WAL file grows under the load
// that keeps it from starting over: a saturated writer (256 senders
// admitting one-event batches, as in BenchmarkAdmit) beside readers that
// never pause (4 goroutines reading the newest page of 50 of a random
// conversation, back to back), on a copy of the admission fixture. One
// iteration admits for a fixed time (40 s; 1 s under -short), and the
// iterations run on, one store throughout, so `make bench` (3x) is a 120 s
// run.
//
// Metrics: wal-peak-MiB, the largest the -wal file was at any 10 ms
// sample, which the store holds near sqlitefs.DefaultWALBound (64 MiB);
// wal-end-MiB, its size at the end; wal-restarts, the times the WAL started
// over; events/s and reads/s.
func BenchmarkWALBound(b *testing.B) {
	sz := benchSizes()
	spec := fixtureSpec{Layout: "admit-16x32", N: sz.admitBase, Principals: admitPrincipals, Rooms: admitRooms}
	env := openStoreAdmit(b, storeFixture(b, spec), store.Options{})
	views := env.adm.(storeAdmitter).views
	walPath := strings.TrimSuffix(env.wal.shm.Name(), "-shm") + "-wal"
	round := 40 * time.Second
	if testing.Short() {
		round = time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg    sync.WaitGroup
		reads atomic.Int64
		peak  atomic.Int64
		errc  = make(chan error, walBoundReaders+1)
	)
	for i := range walBoundReaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := newGen(uint64(time.Now().UnixNano()), uint64(i))
			for ctx.Err() == nil {
				v := views[g.r.IntN(len(views))]
				if _, err := v.Read(ctx, journal.ReadRequest{RoomID: roomID(g.r.IntN(admitRooms)), Limit: 50}); err != nil {
					if ctx.Err() == nil {
						errc <- fmt.Errorf("read: %w", err)
					}
					return
				}
				reads.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(walBoundSample)
		defer t.Stop()
		for {
			if fi, err := os.Stat(walPath); err == nil && fi.Size() > peak.Load() {
				peak.Store(fi.Size())
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	stop := func() {
		cancel()
		wg.Wait()
	}
	defer stop()

	pl := newPlanner(env.targets)
	wal0, _, err := env.wal.sample()
	if err != nil {
		b.Fatal(err)
	}
	reads0 := reads.Load()
	var (
		events  int
		elapsed time.Duration
	)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		n, err := admitFor(ctx, env.adm, pl, walBoundSenders, round)
		if err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		events += n
	}
	b.StopTimer()
	readCount := reads.Load() - reads0
	stop()
	select {
	case err := <-errc:
		b.Fatal(err)
	default:
	}
	wal1, _, err := env.wal.sample()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(peak.Load())/(1<<20), "wal-peak-MiB")
	b.ReportMetric(float64(fileSize(walPath))/(1<<20), "wal-end-MiB")
	b.ReportMetric(float64(wal1.Restarts-wal0.Restarts), "wal-restarts")
	b.ReportMetric(float64(events)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(readCount)/elapsed.Seconds(), "reads/s")
}

// admitFor keeps senders goroutines admitting one event at a time, each
// awaiting its commit, for d, and returns the events admitted. Events are
// planned as they go: a plan for the whole time would hold every event in
// memory, and pausing between shorter plans would give the WAL a quiet
// moment to start over in that a saturated writer never has.
func admitFor(ctx context.Context, adm admitter, pl *planner, senders int, d time.Duration) (int, error) {
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		admitted atomic.Int64
		errc     = make(chan error, senders)
	)
	deadline := time.Now().Add(d)
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				mu.Lock()
				e := pl.next(s)
				mu.Unlock()
				if err := adm.admit(ctx, e); err != nil {
					errc <- err
					return
				}
				admitted.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errc)
	return int(admitted.Load()), <-errc
}
