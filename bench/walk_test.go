package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store"
)

// The floor and deep-page loops run the reader's own SQL without the
// reader around it; checkFloorMatchesReader proves at setup that they
// return the reader's rows in its order.
const (
	floorPageHead  = sqlitefs.PageQueryHead
	floorPageAfter = sqlitefs.PageQueryAfter
	// disjunctivePageAfter is the spelling docs/ARCHITECTURE.md warns against: the
	// same rows, but the planner cannot bound the index range with it. Its
	// three comparisons take three placeholders, as positional parameters
	// are written; given one parameter twice, SQLite would merge "a < ?5
	// OR a = ?5" into a range and hide the difference.
	disjunctivePageAfter = `SELECT 0, ` + sqlitefs.VisibleColumns + ` FROM visible_messages v
		WHERE v.seq > (SELECT upto FROM visible_page_merged WHERE id = 1)
		AND v.room = (SELECT id FROM rooms WHERE principal = ?1 AND room_id = ?2) AND v.thread_id = ?3 AND v.event_id <> ?3
		AND (v.created_ts < ?5 OR (v.created_ts = ?7 AND v.event_id < ?6))
		UNION ALL SELECT * FROM (SELECT 1, ` + sqlitefs.VisibleColumns + `
		FROM visible_page p JOIN visible_messages v ON v.seq = p.seq
		WHERE p.room = (SELECT id FROM rooms WHERE principal = ?1 AND room_id = ?2) AND p.thread_id = ?3 AND p.event_id <> ?3
		AND (p.created_ts < ?5 OR (p.created_ts = ?7 AND p.event_id < ?6))
		ORDER BY p.created_ts DESC, p.event_id DESC LIMIT ?4)`
)

// floor runs the page queries directly on the reader pool: prepared once,
// scanned into reused buffers, no transaction, budget or allocation per
// row. It is the lower bound the reader is compared against.
type floor struct {
	head, after, disjunctive *sql.Stmt
}

func newFloor(ctx context.Context, db *sql.DB) (*floor, error) {
	f := &floor{}
	for _, p := range []struct {
		dst **sql.Stmt
		q   string
	}{{&f.head, floorPageHead}, {&f.after, floorPageAfter}, {&f.disjunctive, disjunctivePageAfter}} {
		st, err := db.PrepareContext(ctx, p.q)
		if err != nil {
			f.close()
			return nil, err
		}
		*p.dst = st
	}
	return f, nil
}

func (f *floor) close() {
	for _, st := range []*sql.Stmt{f.head, f.after, f.disjunctive} {
		if st != nil {
			st.Close()
		}
	}
}

// pageScanner holds the reused scan targets of the floor loops.
type pageScanner struct {
	eventID, thread, sender, revision, content sql.RawBytes
	src, createdTS, revisionTS                 int64
	dest                                       []any
	// lastTS and lastID are the oldest row read so far: the next cursor.
	lastTS int64
	lastID []byte
	// ids, when non-nil, collects the event IDs read (for checks only).
	ids []string
}

func newPageScanner() *pageScanner {
	ps := &pageScanner{}
	ps.dest = []any{&ps.src, &ps.eventID, &ps.thread, &ps.sender, &ps.createdTS, &ps.revision, &ps.revisionTS, &ps.content}
	return ps
}

// page reads at most limit rows (the query asks for limit+1, as the reader
// does, so a further row means more may follow).
func (ps *pageScanner) page(ctx context.Context, st *sql.Stmt, limit int, args ...any) (read int, more bool, err error) {
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return 0, false, err
	}
	for rows.Next() {
		if read == limit {
			more = true
			break
		}
		if err := rows.Scan(ps.dest...); err != nil {
			rows.Close()
			return 0, false, err
		}
		read++
		ps.lastTS = ps.createdTS
		ps.lastID = append(ps.lastID[:0], ps.eventID...)
		if ps.ids != nil {
			ps.ids = append(ps.ids, string(ps.eventID))
		}
	}
	if err := rows.Err(); err != nil {
		rows.Close()
		return 0, false, err
	}
	return read, more, rows.Close()
}

// walk reads a whole room-level conversation newest-first, page by page,
// and returns how many rows it read.
func (f *floor) walk(ctx context.Context, pid int64, room string, limit int) (int, error) {
	ps := newPageScanner()
	total := 0
	read, more, err := ps.page(ctx, f.head, limit, pid, room, "", limit+1)
	for {
		if err != nil {
			return total, err
		}
		total += read
		if !more {
			return total, nil
		}
		read, more, err = ps.page(ctx, f.after, limit, pid, room, "", limit+1, ps.lastTS, string(ps.lastID))
	}
}

// readerWalk reads a whole room-level conversation through the public
// reader, following NextCursor until it is nil.
func readerWalk(ctx context.Context, v journal.ConversationReader, room string, limit int) (int, error) {
	var (
		before *journal.Cursor
		total  int
	)
	for {
		page, err := v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: limit, Before: before})
		if err != nil {
			return total, err
		}
		total += len(page.Messages) + len(page.OwedRefetch)
		if page.NextCursor == nil {
			return total, nil
		}
		before = page.NextCursor
	}
}

// checkFloorMatchesReader confirms the copied SQL returns what the reader
// returns: the first two pages, and a page below a mid cursor in both the
// row-value and the disjunctive spelling.
func checkFloorMatchesReader(ctx context.Context, f *floor, v journal.ConversationReader, pid int64, room string) error {
	const limit = 20
	first, err := v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: limit})
	if err != nil {
		return err
	}
	ps := newPageScanner()
	ps.ids = []string{}
	if _, _, err := ps.page(ctx, f.head, limit, pid, room, "", limit+1); err != nil {
		return err
	}
	if err := sameIDs(first, ps.ids); err != nil {
		return fmt.Errorf("head page: %w", err)
	}
	if first.NextCursor == nil {
		return nil
	}
	cur := *first.NextCursor
	second, err := v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: limit, Before: &cur})
	if err != nil {
		return err
	}
	for name, run := range map[string]func(*pageScanner) error{
		"row value": func(ps *pageScanner) error {
			_, _, err := ps.page(ctx, f.after, limit, pid, room, "", limit+1, cur.CreatedTS, cur.EventID)
			return err
		},
		"disjunctive": func(ps *pageScanner) error {
			_, _, err := ps.page(ctx, f.disjunctive, limit, pid, room, "", limit+1, cur.CreatedTS, cur.EventID, cur.CreatedTS)
			return err
		},
	} {
		ps := newPageScanner()
		ps.ids = []string{}
		if err := run(ps); err != nil {
			return err
		}
		if err := sameIDs(second, ps.ids); err != nil {
			return fmt.Errorf("%s page: %w", name, err)
		}
	}
	return nil
}

// sameIDs compares a reader page (oldest first) with IDs read newest first.
func sameIDs(page journal.Page, newestFirst []string) error {
	got := make([]string, len(page.Messages))
	for i, m := range page.Messages {
		got[len(got)-1-i] = m.EventID
	}
	if !slices.Equal(got, newestFirst) {
		return fmt.Errorf("reader returned %d rows, the copied SQL %d, or in another order", len(got), len(newestFirst))
	}
	return nil
}

// walkEnv is one per-run copy of the walk fixture, opened once and shared
// by the walk and deep-page benchmarks (copying ~1 GB per sub-benchmark
// would dominate `make bench`). TestMain closes it.
type walkEnv struct {
	dir   string
	s     *store.Store
	v     journal.PrincipalStore
	pid   int64
	room  string
	n     int
	floor *floor
}

var (
	walkOnce   sync.Once
	walkShared *walkEnv
	walkErr    error
)

func sharedWalk(b *testing.B) *walkEnv {
	b.Helper()
	walkOnce.Do(func() {
		n := benchSizes().walkN
		path := storeFixture(b, fixtureSpec{Layout: "walk-1x1", N: n, Principals: 1, Rooms: 1})
		walkShared, walkErr = openWalkEnv(path, n)
	})
	switch {
	case walkErr != nil:
		b.Fatalf("walk fixture: %v", walkErr)
	case walkShared == nil:
		b.Fatal("walk fixture: setup failed in an earlier benchmark")
	}
	return walkShared
}

func openWalkEnv(fixture string, n int) (_ *walkEnv, err error) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "mindroomd-bench-walk-")
	if err != nil {
		return nil, err
	}
	env := &walkEnv{dir: dir, room: roomID(0), n: n}
	defer func() {
		if err != nil {
			env.close()
		}
	}()
	// Read-only use: the copy need not be durable.
	if err := copyFile(fixture, sqlitefs.Path(dir), false); err != nil {
		return nil, err
	}
	if env.s, err = store.Open(ctx, store.Options{StorageDir: dir}); err != nil {
		return nil, err
	}
	if env.v, err = env.s.Principal(ctx, agentName(0), agentUser(0)); err != nil {
		return nil, err
	}
	ids, err := principalIDs(ctx, env.s, 1)
	if err != nil {
		return nil, err
	}
	env.pid = ids[0]
	if err := verifyConversation(ctx, env.s, env.v, env.pid, env.room, n); err != nil {
		return nil, fmt.Errorf("fixture does not read back: %w", err)
	}
	if env.floor, err = newFloor(ctx, env.s.DB().QueryPool()); err != nil {
		return nil, err
	}
	if err := checkFloorMatchesReader(ctx, env.floor, env.v, env.pid, env.room); err != nil {
		return nil, err
	}
	// One untimed pass of each loop pulls the file into the OS cache and
	// opens every pooled reader connection, so neither timed loop pays for
	// first reads or connection setup.
	if total, err := env.floor.walk(ctx, env.pid, env.room, 500); err != nil || total != n {
		return nil, fmt.Errorf("warm-up floor walk read %d of %d: %v", total, n, err)
	}
	if total, err := readerWalk(ctx, env.v, env.room, 500); err != nil || total != n {
		return nil, fmt.Errorf("warm-up reader walk read %d of %d: %v", total, n, err)
	}
	return env, nil
}

func (env *walkEnv) close() {
	if env.floor != nil {
		env.floor.close()
	}
	if env.s != nil {
		env.s.Close()
	}
	os.RemoveAll(env.dir)
}

func closeWalkEnv() {
	if walkShared != nil {
		walkShared.close()
	}
}

// BenchmarkConversationWalk reads one room of N messages end to end
// through View.Read, following NextCursor until nil, and in the same run
// through the bare page SQL (the floor). Metrics: rows/s of each and the
// reader/floor time ratio (1.0 means the reader adds nothing).
func BenchmarkConversationWalk(b *testing.B) {
	env := sharedWalk(b)
	for _, limit := range []int{500, 50} {
		b.Run(fmt.Sprintf("page=%d", limit), func(b *testing.B) {
			ctx := context.Background()
			var readerTime, floorTime time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				total, err := readerWalk(ctx, env.v, env.room, limit)
				readerTime += time.Since(start)
				if err != nil || total != env.n {
					b.Fatalf("reader walk read %d of %d: %v", total, env.n, err)
				}
				start = time.Now()
				total, err = env.floor.walk(ctx, env.pid, env.room, limit)
				floorTime += time.Since(start)
				if err != nil || total != env.n {
					b.Fatalf("floor walk read %d of %d: %v", total, env.n, err)
				}
			}
			rows := float64(env.n) * float64(b.N)
			b.ReportMetric(rows/readerTime.Seconds(), "reader-rows/s")
			b.ReportMetric(rows/floorTime.Seconds(), "floor-rows/s")
			b.ReportMetric(readerTime.Seconds()/floorTime.Seconds(), "reader/floor")
		})
	}
}

// BenchmarkDeepPage reads one 50-row page below a cursor at depths 1k,
// 500k and 999k of a 10^6 conversation (scaled to -n), with the row-value
// cursor the reader uses and with the disjunctive spelling, in the same
// run. Metrics: ns/page of each form, of the full reader, and the
// disjunctive/row-value ratio.
func BenchmarkDeepPage(b *testing.B) {
	env := sharedWalk(b)
	const limit = 50
	minDur := benchSizes().minMeasure
	for _, perMillion := range []int64{1_000, 500_000, 999_000} {
		depth := max(1, int(perMillion*int64(env.n)/1_000_000))
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			ctx := context.Background()
			cur, err := cursorAtDepth(ctx, env, depth)
			if err != nil {
				b.Fatal(err)
			}
			want := min(limit, env.n-depth)
			ps := newPageScanner()
			forms := []struct {
				name string
				page func() (int, error)
			}{
				{"rowvalue", func() (int, error) {
					read, _, err := ps.page(ctx, env.floor.after, limit, env.pid, env.room, "", limit+1, cur.CreatedTS, cur.EventID)
					return read, err
				}},
				{"disjunctive", func() (int, error) {
					read, _, err := ps.page(ctx, env.floor.disjunctive, limit, env.pid, env.room, "",
						limit+1, cur.CreatedTS, cur.EventID, cur.CreatedTS)
					return read, err
				}},
				{"reader", func() (int, error) {
					page, err := env.v.Read(ctx, journal.ReadRequest{RoomID: env.room, Limit: limit, Before: &cur})
					return len(page.Messages), err
				}},
			}
			perPage := make([]time.Duration, len(forms))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for k, f := range forms {
					mean, err := measure(minDur, 3, func() error {
						read, err := f.page()
						if err == nil && read != want {
							err = fmt.Errorf("%s page at depth %d read %d rows, want %d", f.name, depth, read, want)
						}
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
					perPage[k] += mean
				}
			}
			for k, f := range forms {
				b.ReportMetric(float64(perPage[k].Nanoseconds())/float64(b.N), f.name+"-ns/page")
			}
			b.ReportMetric(perPage[1].Seconds()/perPage[0].Seconds(), "disjunctive/rowvalue")
		})
	}
}

// cursorAtDepth returns the cursor of the depth-th newest message, so the
// page below it starts depth rows into the conversation.
func cursorAtDepth(ctx context.Context, env *walkEnv, depth int) (journal.Cursor, error) {
	var cur journal.Cursor
	err := env.s.DB().QueryPool().QueryRowContext(ctx, `SELECT created_ts, event_id FROM visible_page
		WHERE room = (SELECT id FROM rooms WHERE principal = ? AND room_id = ?) AND thread_id = ''
		ORDER BY created_ts DESC, event_id DESC LIMIT 1 OFFSET ?`, env.pid, env.room, depth-1).Scan(&cur.CreatedTS, &cur.EventID)
	if errors.Is(err, sql.ErrNoRows) {
		return cur, fmt.Errorf("depth %d is beyond the conversation", depth)
	}
	return cur, err
}

// measure repeats op until it has run at least minReps times and for at
// least minDur, and returns the mean time per run. Slow forms (a deep
// disjunctive page costs ~10^5 times a row-value one) so run a few times,
// fast ones thousands, and both means are trustworthy in one pass.
func measure(minDur time.Duration, minReps int, op func() error) (time.Duration, error) {
	start := time.Now()
	reps := 0
	for reps < minReps || time.Since(start) < minDur {
		if err := op(); err != nil {
			return 0, err
		}
		reps++
	}
	return time.Since(start) / time.Duration(reps), nil
}
