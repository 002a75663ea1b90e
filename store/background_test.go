package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store/writer"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// mergeRooms are the conversations the merge tests fill, each with n
// messages whose timestamps run out of receipt order, so merge order and
// page order differ.
var mergeRooms = []string{"!a:example.org", "!b:example.org", "!c:example.org"}

const mergeRoomMessages = 7

// openForMerges opens a store under dir whose background merger waits an
// hour, so a test drives every step of a merge itself.
func openForMerges(t *testing.T, dir string) (*Store, journal.PrincipalStore) {
	t.Helper()
	return openWith(t, Options{StorageDir: dir, MaxUnmergedTail: 1000, MergeDelay: time.Hour})
}

// openWith opens a store with opts and the view the merge tests read.
func openWith(t *testing.T, opts Options) (*Store, journal.PrincipalStore) {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	v, err := s.Principal(ctx, "reader", "@bot:example.org")
	if err != nil {
		t.Fatal(err)
	}
	return s, v
}

// admitMergeRooms fills mergeRooms and returns each room's event IDs in
// page order, as read before any merge.
func admitMergeRooms(t *testing.T, v journal.PrincipalStore) map[string][]string {
	t.Helper()
	ctx := context.Background()
	for r, room := range mergeRooms {
		var evs []mx.Ev
		for i := range mergeRoomMessages {
			id := fmt.Sprintf("$m%d-%02d", r, i)
			evs = append(evs, mx.Message(id, "@alice:example.org", int64(1000+(i*5)%mergeRoomMessages), "hi"))
		}
		if _, err := v.AdmitBatch(ctx, mx.Live(room, evs...), ""); err != nil {
			t.Fatal(err)
		}
	}
	want := make(map[string][]string)
	for _, room := range mergeRooms {
		want[room] = readWhole(t, v, room, mergeRoomMessages)
		if len(want[room]) != mergeRoomMessages {
			t.Fatalf("%s read %d messages before any merge, want %d", room, len(want[room]), mergeRoomMessages)
		}
	}
	return want
}

// readWhole pages through room, limit messages a page, oldest first.
func readWhole(t *testing.T, v journal.PrincipalStore, room string, limit int) []string {
	t.Helper()
	var got []string
	for p, err := range journal.Export(context.Background(), v, room, nil, limit) {
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]string, 0, len(p.Messages))
		for _, m := range p.Messages {
			ids = append(ids, m.EventID)
		}
		got = append(ids, got...)
	}
	return got
}

// mustReadAsBefore fails unless every room reads as want, in pages of
// several sizes.
func mustReadAsBefore(t *testing.T, v journal.PrincipalStore, want map[string][]string, step string) {
	t.Helper()
	for _, room := range mergeRooms {
		for _, limit := range []int{1, 2, 4, mergeRoomMessages} {
			if got := readWhole(t, v, room, limit); !slices.Equal(got, want[room]) {
				t.Fatalf("%s: %s in pages of %d read %v, want %v", step, room, limit, got, want[room])
			}
		}
	}
}

// A conversation reads the same, in order, whether its rows sit in the
// unmerged tail, in the page index, or in the index of a cycle that has
// not finished, at every step of the cycle.
func TestEveryStepOfAMergeCycleReadsTheSamePages(t *testing.T) {
	ctx := context.Background()
	s, v := openForMerges(t, t.TempDir())
	want := admitMergeRooms(t, v)
	plan, err := s.planMerge(ctx, mergeRoomMessages)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Chunks) != len(mergeRooms) {
		t.Fatalf("a chunk of %d rows planned %d chunks for %d rooms of %d rows", mergeRoomMessages, len(plan.Chunks), len(mergeRooms), mergeRoomMessages)
	}
	for i, rooms := range plan.Chunks {
		if err := s.mergeRooms(ctx, plan.Boundary, rooms); err != nil {
			t.Fatal(err)
		}
		mustReadAsBefore(t, v, want, fmt.Sprintf("after chunk %d", i))
		if left := s.db.Unmerged(); left != int64(len(mergeRooms)*mergeRoomMessages) {
			t.Fatalf("after chunk %d the tail is %d rows, want all of them until the cycle ends", i, left)
		}
	}
	mustFinishWithNoTail(t, s, v, want, plan.Boundary, "after the cycle")
}

// mustFinishWithNoTail finishes a cycle up to boundary and fails unless
// every room reads as want and no tail is left.
func mustFinishWithNoTail(t *testing.T, s *Store, v journal.PrincipalStore, want map[string][]string, boundary int64, step string) {
	t.Helper()
	if err := s.finishMerge(context.Background(), boundary); err != nil {
		t.Fatal(err)
	}
	mustReadAsBefore(t, v, want, step)
	if left := s.db.Unmerged(); left != 0 {
		t.Fatalf("%s: the tail is estimated at %d rows, want none (a finish must never move the merged mark back)", step, left)
	}
}

func TestAMergePlanKeepsEachRoomWholeAndChunksNearTheirSize(t *testing.T) {
	ctx := context.Background()
	s, v := openForMerges(t, t.TempDir())
	admitMergeRooms(t, v)
	for _, tc := range []struct {
		chunkRows, chunks int
	}{
		{1, 3},  // a room larger than a chunk is a chunk of its own
		{13, 3}, // two rooms would make 14
		{14, 2},
		{21, 1},
	} {
		plan, err := s.planMerge(ctx, tc.chunkRows)
		if err != nil {
			t.Fatal(err)
		}
		if len(plan.Chunks) != tc.chunks {
			t.Fatalf("chunks of %d rows: planned %v, want %d chunks", tc.chunkRows, plan.Chunks, tc.chunks)
		}
		for i := 1; i < len(plan.Chunks); i++ {
			if plan.Chunks[i].First <= plan.Chunks[i-1].Last {
				t.Fatalf("chunks of %d rows overlap or go back: %v", tc.chunkRows, plan.Chunks)
			}
		}
	}
}

// The inline merge at the tail's bound may overtake a cycle. The cycle's
// remaining chunks then write nothing, and its finish does not move the
// merged mark back over rows it never saw.
func TestACycleOvertakenByAWholeMergeFinishesWithoutHarm(t *testing.T) {
	ctx := context.Background()
	s, v := openForMerges(t, t.TempDir())
	want := admitMergeRooms(t, v)
	plan, err := s.planMerge(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.mergeRooms(ctx, plan.Boundary, plan.Chunks[0]); err != nil {
		t.Fatal(err)
	}
	late := mx.Message("$late", "@alice:example.org", 5000, "after the plan")
	if _, err := v.AdmitBatch(ctx, mx.Live(mergeRooms[0], late), ""); err != nil {
		t.Fatal(err)
	}
	want[mergeRooms[0]] = append(want[mergeRooms[0]], "$late")
	moved, err := s.MergePageTail(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if wantMoved := int64(len(mergeRooms)*mergeRoomMessages + 1 - mergeRoomMessages); moved != wantMoved {
		t.Fatalf("the whole merge wrote %d entries, want %d (all but the chunk already written)", moved, wantMoved)
	}
	for _, rooms := range plan.Chunks[1:] {
		if err := s.mergeRooms(ctx, plan.Boundary, rooms); err != nil {
			t.Fatal(err)
		}
	}
	mustFinishWithNoTail(t, s, v, want, plan.Boundary, "after the overtaken cycle")
}

// A process that stops mid-cycle leaves index entries past the merged
// mark. The next process reads around them and merges over them.
func TestACycleCutShortByARestartIsReadAroundAndMergedOver(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, v := openForMerges(t, dir)
	want := admitMergeRooms(t, v)
	plan, err := s.planMerge(ctx, mergeRoomMessages)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.mergeRooms(ctx, plan.Boundary, plan.Chunks[1]); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, v = openForMerges(t, dir)
	if left := s.db.Unmerged(); left != int64(len(mergeRooms)*mergeRoomMessages) {
		t.Fatalf("reopened with a tail of %d rows, want all %d", left, len(mergeRooms)*mergeRoomMessages)
	}
	mustReadAsBefore(t, v, want, "after the restart")
	moved, err := s.MergePageTail(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if wantMoved := int64((len(mergeRooms) - 1) * mergeRoomMessages); moved != wantMoved {
		t.Fatalf("the merge after the restart wrote %d entries, want %d", moved, wantMoved)
	}
	mustReadAsBefore(t, v, want, "after the merge")
}

// Nothing but the size of the tail starts this cycle: the delay is an hour.
func TestATailHalfItsBoundStartsABackgroundCycleAtOnce(t *testing.T) {
	ctx := context.Background()
	cycles := make(chan struct{}, 8)
	s, v := openWith(t, Options{
		StorageDir: t.TempDir(), MaxUnmergedTail: 2 * mergeRoomMessages, MergeDelay: time.Hour,
		CheckpointInterval: time.Millisecond,
		afterMergeCycle:    func(bool) { cycles <- struct{}{} },
	})
	var evs []mx.Ev
	for i := range mergeRoomMessages {
		evs = append(evs, mx.Message(fmt.Sprintf("$m%02d", i), "@alice:example.org", int64(1000+i), "hi"))
	}
	if _, err := v.AdmitBatch(ctx, mx.Live(mergeRooms[0], evs...), ""); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cycles:
	case <-time.After(time.Minute):
		t.Fatal("no merge cycle within a minute of a tail half its bound")
	}
	if left := s.db.Unmerged(); left != 0 {
		t.Fatalf("the cycle left a tail of %d rows", left)
	}
}

// A cycle gives up to a saturated writer. If the burst then ends with no
// commit to come, the tail is merged all the same.
func TestACycleGivenUpToASaturatedWriterRunsOnceTheWriterIdles(t *testing.T) {
	ctx := context.Background()
	cycles := make(chan bool, 64)
	s, v := openWith(t, Options{
		StorageDir: t.TempDir(), MaxUnmergedTail: 1000, MergeDelay: 10 * time.Millisecond,
		CheckpointInterval: time.Millisecond,
		afterMergeCycle:    func(finished bool) { cycles <- finished },
	})
	for range busyOutstanding {
		s.sem <- struct{}{} // commands in flight, as a burst keeps them
	}
	if _, err := v.AdmitBatch(ctx, mx.Live(mergeRooms[0], mx.Message("$m", "@alice:example.org", 1000, "hi")), ""); err != nil {
		t.Fatal(err)
	}
	waitCycle := func(want bool) {
		t.Helper()
		for {
			select {
			case finished := <-cycles:
				if finished == want {
					return
				}
			case <-time.After(time.Minute):
				t.Fatalf("no merge cycle with finished=%v within a minute", want)
			}
		}
	}
	waitCycle(false)
	if left := s.db.Unmerged(); left != 1 {
		t.Fatalf("a cycle beside a saturated writer merged: the tail is %d rows, want 1", left)
	}
	for range busyOutstanding {
		<-s.sem // the burst ends; nothing more is committed
	}
	waitCycle(true)
	if left := s.db.Unmerged(); left != 0 {
		t.Fatalf("the cycle after the burst left a tail of %d rows", left)
	}
}

// Test SQL: filler that grows the WAL, and a read that holds a snapshot.
const (
	createBallast = `CREATE TABLE ballast (b BLOB)`
	insertBallast = `INSERT INTO ballast (b) VALUES (zeroblob(?))`
	beginRead     = `BEGIN`
	readMeta      = `SELECT count(*) FROM store_meta`
	endRead       = `ROLLBACK`
)

// walSize is the size of the store's WAL file.
func walSize(t *testing.T, s *Store) int64 {
	t.Helper()
	fi, err := os.Stat(s.db.Path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// A reader that keeps one snapshot lets the WAL grow past its bound. Once
// no reader is left, a checkpoint starts the WAL over, and the commit after
// it truncates the file back to the bound.
func TestTheWALShrinksToItsBoundOnceReadersAllow(t *testing.T) {
	ctx := context.Background()
	// Nothing runs in the background: the test runs the checkpoint.
	const bound = 1 << 20
	s, v := openWith(t, Options{StorageDir: t.TempDir(), CheckpointInterval: time.Hour, MergeDelay: time.Hour, WALBound: bound})
	reader, err := s.db.QueryPool().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	var n int
	if _, err := reader.ExecContext(ctx, beginRead); err != nil {
		t.Fatal(err)
	}
	if err := reader.QueryRowContext(ctx, readMeta).Scan(&n); err != nil {
		t.Fatal(err)
	}
	past := int64(bound + 512<<10)
	if _, err := s.exec(ctx, "ballast", 0, func(tx *writer.Tx) (any, error) {
		if _, err := tx.Exec(createBallast); err != nil {
			return nil, err
		}
		return tx.Exec(insertBallast, past)
	}); err != nil {
		t.Fatal(err)
	}
	if got := walSize(t, s); got <= bound {
		t.Fatalf("the WAL is %d bytes after %d bytes of filler under a reader, want more than its bound", got, past)
	}
	if _, err := reader.ExecContext(ctx, endRead); err != nil {
		t.Fatal(err)
	}

	if err := s.checkpoint(ctx, &checkpointState{}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.AdmitBatch(ctx, mx.Live(mergeRooms[0], mx.Message("$after", "@alice:example.org", 1000, "hi")), ""); err != nil {
		t.Fatal(err)
	}
	if got := walSize(t, s); got > bound {
		t.Fatalf("the WAL file is %d bytes after a checkpoint with no reader and a commit, want at most its bound %d", got, bound)
	}
}

// Close cancels the background work wherever it waits (here both loops
// hold an hour's timer after a commit), then lets the writer stop, and
// leaves a journal the next Open takes up with every commit in it.
func TestCloseStopsTheBackgroundWorkWithoutWaitingItOut(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, v := openWith(t, Options{StorageDir: dir, CheckpointInterval: time.Hour, MergeDelay: time.Hour})
	if _, err := v.AdmitBatch(ctx, mx.Live(mergeRooms[0], mx.Message("$kept", "@alice:example.org", 1000, "hi")), ""); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close waited a minute for the background work")
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Close returned with the writer running")
	}
	if _, err := v.AdmitBatch(ctx, mx.Live(mergeRooms[0], mx.Message("$late", "@alice:example.org", 1001, "hi")), ""); !errors.Is(err, journal.ErrClosed) {
		t.Fatalf("admission after Close: %v, want ErrClosed", err)
	}
	_, v = openWith(t, Options{StorageDir: dir})
	if got := readWhole(t, v, mergeRooms[0], 10); !slices.Equal(got, []string{"$kept"}) {
		t.Fatalf("the reopened journal reads %v, want [$kept]", got)
	}
}
