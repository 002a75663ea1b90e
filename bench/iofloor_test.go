package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/sqlitefs"
)

// The I/O floor answers how much of the latency at the offered load the
// disk alone sets. It replays, with bare system calls and no SQLite, the
// disk work the store did in the round just measured, under the same
// offered load and the same group commit:
//
//   - each batch appends the store's WAL frames per event, times the events
//     in the batch, to a log file in one write and syncs it;
//   - the first commit after a checkpoint starts the log over, writing and
//     syncing a 32-byte header first, as SQLite does at synchronous=FULL;
//   - a checkpoint, the store's interval after the first commit since the
//     last one and between batches, reads from the log and writes into a
//     copy of the fixture the pages the store's checkpoints copied (taken
//     in order from the WAL-index, walstat_test.go), as many per event as
//     the store copied, then syncs that file.
//
// What it leaves out is everything but the disk: SQL, B-tree work, the
// actor and the writer's own bookkeeping. The store can approach the floor
// but not pass it, unless its disk work changes.
type ioFloor struct {
	db, log *os.File
}

// ioProfile is the disk work per event a store round did.
type ioProfile struct {
	frameSize      int
	framesPerEvent float64
	pagesPerEvent  float64
	pages          []uint32 // page numbers copied by checkpoints, in order
}

// profileRound reads what a recording walCounter saw over events events.
func profileRound(w *walCounter, before walStats, events int) (ioProfile, error) {
	after, pageSize, err := w.sample()
	if err != nil {
		return ioProfile{}, err
	}
	pages := w.takePages()
	if events == 0 || len(pages) == 0 || after.Frames == before.Frames {
		return ioProfile{}, fmt.Errorf("no WAL frames recorded over %d events", events)
	}
	return ioProfile{
		frameSize:      pageSize + 24,
		framesPerEvent: float64(after.Frames-before.Frames) / float64(events),
		pagesPerEvent:  float64(len(pages)) / float64(events),
		pages:          pages,
	}, nil
}

// newIOFloor copies fixture for the floor's database file.
func newIOFloor(tb testing.TB, fixture string) *ioFloor {
	tb.Helper()
	dir := tb.TempDir()
	dbPath := filepath.Join(dir, "floor.db")
	if err := copyFile(fixture, dbPath, true); err != nil {
		tb.Fatal(err)
	}
	db, err := os.OpenFile(dbPath, os.O_RDWR, 0)
	if err != nil {
		tb.Fatal(err)
	}
	log, err := os.OpenFile(filepath.Join(dir, "floor.log"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		db.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		db.Close()
		log.Close()
	})
	return &ioFloor{db: db, log: log}
}

// floorAdmitter hands commands to a running floor writer.
type floorAdmitter struct {
	in   chan chan struct{}
	done chan error
}

func (a floorAdmitter) admit(ctx context.Context, _ planned) error {
	committed := make(chan struct{})
	a.in <- committed
	select {
	case <-committed:
		return nil
	case err := <-a.done:
		a.done <- err
		return fmt.Errorf("io floor stopped: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// serve starts a floor writer replaying prof; stop ends it once the
// commands given to it are answered.
func (f *ioFloor) serve(prof ioProfile) (adm floorAdmitter, stop func() error) {
	adm = floorAdmitter{in: make(chan chan struct{}, 1<<14), done: make(chan error, 1)}
	go func() { adm.done <- f.run(adm.in, prof) }()
	return adm, func() error {
		close(adm.in)
		return <-adm.done
	}
}

// run is the floor's writer: one goroutine, like the store's.
func (f *ioFloor) run(in <-chan chan struct{}, prof ioProfile) error {
	db, log := f.db, f.log
	const logHeader = 32
	pageSize := prof.frameSize - 24
	frames := make([]byte, 1<<20)
	page := make([]byte, prof.frameSize)
	var (
		logEnd         int64 // end of the frames written since the log started over
		restart        bool  // a checkpoint completed: the next commit starts over
		sinceCkpt      int   // events committed since the last checkpoint
		firstCommit    time.Time
		nextPage       int
		framesOwed     float64 // fractional frames carried to the next batch
		pagesOwed      float64
		batch          []chan struct{}
		interval       = sqlitefs.DefaultCheckpointInterval
		checkpointable = func() bool { return sinceCkpt > 0 && time.Since(firstCommit) >= interval }
	)
	for {
		var timeout <-chan time.Time
		if sinceCkpt > 0 {
			timeout = time.After(time.Until(firstCommit.Add(interval)))
		}
		select {
		case r, ok := <-in:
			if !ok {
				return nil
			}
			batch = append(batch[:0], r)
		case <-timeout:
		}
	gather:
		for len(batch) > 0 {
			select {
			case r, ok := <-in:
				if !ok {
					break gather
				}
				batch = append(batch, r)
			default:
				break gather
			}
		}
		if len(batch) > 0 {
			if restart || logEnd == 0 {
				if _, err := log.WriteAt(frames[:logHeader], 0); err != nil {
					return err
				}
				if err := log.Sync(); err != nil {
					return err
				}
				logEnd, restart = logHeader, false
			}
			framesOwed += prof.framesPerEvent * float64(len(batch))
			n := int(framesOwed)
			framesOwed -= float64(n)
			for left := n * prof.frameSize; left > 0; {
				chunk := min(left, len(frames))
				if _, err := log.WriteAt(frames[:chunk], logEnd); err != nil {
					return err
				}
				logEnd += int64(chunk)
				left -= chunk
			}
			if err := log.Sync(); err != nil {
				return err
			}
			for _, r := range batch {
				close(r)
			}
			if sinceCkpt == 0 {
				firstCommit = time.Now()
			}
			sinceCkpt += len(batch)
			batch = batch[:0]
		}
		if !checkpointable() {
			continue
		}
		pagesOwed += prof.pagesPerEvent * float64(sinceCkpt)
		n := int(pagesOwed)
		pagesOwed -= float64(n)
		for i := range n {
			pgno := prof.pages[nextPage%len(prof.pages)]
			nextPage++
			src := logHeader + int64(i%max(1, int((logEnd-logHeader)/int64(prof.frameSize))))*int64(prof.frameSize)
			if _, err := log.ReadAt(page, src); err != nil {
				return fmt.Errorf("floor checkpoint read: %w", err)
			}
			if _, err := db.WriteAt(page[24:], int64(pgno-1)*int64(pageSize)); err != nil {
				return err
			}
		}
		if err := db.Sync(); err != nil {
			return err
		}
		sinceCkpt, restart = 0, true
	}
}
