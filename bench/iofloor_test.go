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

// floorWriter is the state of one floor writer.
type floorWriter struct {
	db, log     *os.File
	prof        ioProfile
	frames      []byte
	page        []byte
	logEnd      int64 // end of the frames written since the log started over
	restart     bool  // a checkpoint completed: the next commit starts over
	sinceCkpt   int   // events committed since the last checkpoint
	firstCommit time.Time
	nextPage    int     // next entry of prof.pages to copy
	framesOwed  float64 // fractional frames carried to the next batch
	pagesOwed   float64 // fractional pages carried to the next checkpoint
}

// floorLogHeader is the size of a WAL file's header.
const floorLogHeader = 32

// run is the floor's writer: one goroutine, like the store's, committing
// whatever has queued and checkpointing between batches.
func (f *ioFloor) run(in <-chan chan struct{}, prof ioProfile) error {
	w := &floorWriter{db: f.db, log: f.log, prof: prof, frames: make([]byte, 1<<20), page: make([]byte, prof.frameSize)}
	interval := sqlitefs.DefaultCheckpointInterval
	var batch []chan struct{}
	// One timer for the checkpoint deadline, reset each time round, so the
	// loop allocates nothing per batch.
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		var due <-chan time.Time
		if w.sinceCkpt > 0 {
			timer.Reset(time.Until(w.firstCommit.Add(interval)))
			due = timer.C
		}
		select {
		case r, ok := <-in:
			if !ok {
				return nil
			}
			batch = append(batch[:0], r)
		case <-due:
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
			if err := w.commit(len(batch)); err != nil {
				return err
			}
			for _, r := range batch {
				close(r)
			}
			batch = batch[:0]
		}
		if w.sinceCkpt > 0 && time.Since(w.firstCommit) >= interval {
			if err := w.checkpoint(); err != nil {
				return err
			}
		}
	}
}

// commit appends the frames of events events in one write and syncs them,
// starting the log over first if a checkpoint completed since the last
// commit.
func (w *floorWriter) commit(events int) error {
	if w.restart || w.logEnd == 0 {
		if _, err := w.log.WriteAt(w.frames[:floorLogHeader], 0); err != nil {
			return err
		}
		if err := w.log.Sync(); err != nil {
			return err
		}
		w.logEnd, w.restart = floorLogHeader, false
	}
	w.framesOwed += w.prof.framesPerEvent * float64(events)
	n := int(w.framesOwed)
	w.framesOwed -= float64(n)
	for left := n * w.prof.frameSize; left > 0; {
		chunk := min(left, len(w.frames))
		if _, err := w.log.WriteAt(w.frames[:chunk], w.logEnd); err != nil {
			return err
		}
		w.logEnd += int64(chunk)
		left -= chunk
	}
	if err := w.log.Sync(); err != nil {
		return err
	}
	if w.sinceCkpt == 0 {
		w.firstCommit = time.Now()
	}
	w.sinceCkpt += events
	return nil
}

// checkpoint copies the store's pages per event for the events since the
// last checkpoint, each read from a frame of the log as SQLite reads it,
// into the database file at its page's offset, then syncs that file.
func (w *floorWriter) checkpoint() error {
	w.pagesOwed += w.prof.pagesPerEvent * float64(w.sinceCkpt)
	n := int(w.pagesOwed)
	w.pagesOwed -= float64(n)
	pageSize := int64(w.prof.frameSize - 24)
	logFrames := max(1, (w.logEnd-floorLogHeader)/int64(w.prof.frameSize))
	for i := range n {
		pgno := w.prof.pages[w.nextPage%len(w.prof.pages)]
		w.nextPage++
		src := floorLogHeader + int64(i)%logFrames*int64(w.prof.frameSize)
		if _, err := w.log.ReadAt(w.page, src); err != nil {
			return fmt.Errorf("floor checkpoint read: %w", err)
		}
		if _, err := w.db.WriteAt(w.page[24:], int64(pgno-1)*pageSize); err != nil {
			return err
		}
	}
	if err := w.db.Sync(); err != nil {
		return err
	}
	w.sinceCkpt, w.restart = 0, true
	return nil
}
