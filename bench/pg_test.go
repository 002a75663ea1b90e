package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/pgfs"
	"github.com/mindroomd/mindroomd/testsupport/pg"
)

// flagPG opts into the PostgreSQL benchmarks (BenchmarkPG*, and the
// replicas' BenchmarkReplica*). They start a PostgreSQL server of their
// own, so `-bench .` (make bench) leaves them out unless asked.
var flagPG = flag.Bool("pg", false, "run the PostgreSQL benchmarks (BenchmarkPG*, BenchmarkReplica*)")

// skipPG is why a PostgreSQL benchmark did not run without -pg.
const skipPG = "the PostgreSQL benchmarks are opt-in: run them with `make bench-pg`, " +
	"or go test -run '^$' -bench 'PG|Replica' ./bench/ -args -pg"

// The floor runs the reader's own page statements (pgfs.PageQueryHead,
// pgfs.PageQueryAfter) bare. Their arguments are (principal, room, thread,
// limit[, cursor ts, cursor event]).
const (
	pgPageHead  = pgfs.PageQueryHead
	pgPageAfter = pgfs.PageQueryAfter
	// pgPageDisjunctive is the same page with the cursor spelled as a
	// disjunction, which the index cannot bound.
	pgPageDisjunctive = `SELECT ` + pgfs.PageColumns + ` ` + pgfs.ConversationRows +
		` AND (v.created_ts < $5 OR (v.created_ts = $5 AND v.event_id < $6)) ORDER BY v.created_ts DESC, v.event_id DESC LIMIT $4`
	// pgCursorAtDepth is the cursor of a room's depth-th newest message.
	pgCursorAtDepth = `SELECT v.created_ts, v.event_id FROM visible_messages v
		WHERE v.room = (SELECT id FROM rooms WHERE principal = $1 AND room_id = $2) AND v.thread_id = ''
		ORDER BY v.created_ts DESC, v.event_id DESC LIMIT 1 OFFSET $3`
)

// pgCluster is the PostgreSQL server one PG benchmark runs against: the
// one MINDROOM_TEST_PG_URL names, or a durable cluster (fsync and
// synchronous_commit on, so admission pays for real commits) launched in
// the benchmark's temporary directory and stopped when the benchmark
// function returns, fails or panics (a panic in another goroutine, or a
// -timeout, leaves it running). Before it is used, the bulk loader is held
// to the rows admission writes (checkPGFixture).
func pgCluster(b *testing.B) *pg.Cluster {
	b.Helper()
	if !*flagPG {
		b.Skip(skipPG)
	}
	var c *pg.Cluster
	if os.Getenv(pg.EnvURL) != "" {
		c = pg.Start(b) // the server the variable names; Start launches nothing then
	} else {
		var err error
		if c, err = pg.Launch(b.TempDir(), true); err != nil {
			b.Fatalf("start postgres: %v", err)
		}
		b.Cleanup(func() {
			if err := c.Stop(); err != nil {
				b.Errorf("stop postgres: %v", err)
			}
		})
	}
	checkPGFixture(b, c)
	return c
}

// pgWalkEnv is one loaded conversation and the two ways of reading it.
type pgWalkEnv struct {
	v     journal.PrincipalStore
	floor *pgFloor
	pid   int64
	room  string
	n     int
}

// openPGWalk loads a conversation of benchSizes().walkN messages into a
// fresh schema of c, checks that the floor reads what the reader reads,
// and walks it once each way, untimed, so neither timed walk pays for
// first reads or connection setup.
func openPGWalk(b *testing.B, c *pg.Cluster) *pgWalkEnv {
	b.Helper()
	ctx := context.Background()
	n := benchSizes().walkN
	url := c.Schema(b)
	start := time.Now()
	s, ids := loadPGStore(b, url, fixtureSpec{Layout: "walk-1x1", N: n, Principals: 1, Rooms: 1})
	b.Logf("loaded %d messages into PostgreSQL in %v", n, time.Since(start).Round(time.Millisecond))
	env := &pgWalkEnv{pid: ids[0], room: roomID(0), n: n}
	var err error
	if env.v, err = s.Principal(ctx, agentName(0), agentUser(0)); err != nil {
		b.Fatal(err)
	}
	if env.floor, err = newPGFloor(ctx, url); err != nil {
		b.Fatalf("floor connection: %v", err)
	}
	b.Cleanup(env.floor.close)
	if err := checkPGFloorMatchesReader(ctx, env); err != nil {
		b.Fatalf("the floor does not read what the reader reads: %v", err)
	}
	if total, err := env.floor.walk(ctx, env.pid, env.room, 500); err != nil || total != n {
		b.Fatalf("warm-up floor walk read %d of %d: %v", total, n, err)
	}
	if total, err := readerWalk(ctx, env.v, env.room, 500); err != nil || total != n {
		b.Fatalf("warm-up reader walk read %d of %d: %v", total, n, err)
	}
	return env
}

// pgFloor runs the page SQL on one connection of its own: prepared once
// (pgx caches the statement), scanned into reused buffers that alias the
// driver's, nothing allocated per row.
type pgFloor struct {
	conn                                       *pgx.Conn
	eventID, thread, sender, revision, content pgtype.DriverBytes
	createdTS, revisionTS                      int64
	dest                                       []any
	// lastTS and lastID are the oldest row read so far: the next cursor.
	lastTS int64
	lastID []byte
	// ids, when non-nil, collects the event IDs read (for checks only).
	ids []string
}

func newPGFloor(ctx context.Context, url string) (*pgFloor, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	f := &pgFloor{conn: conn}
	f.dest = []any{&f.eventID, &f.thread, &f.sender, &f.createdTS, &f.revision, &f.revisionTS, &f.content}
	return f, nil
}

func (f *pgFloor) close() { f.conn.Close(context.Background()) }

// page reads at most limit rows of query; it asks for limit+1, as the
// reader does, so a further row means more may follow.
func (f *pgFloor) page(ctx context.Context, query string, limit int, args ...any) (read int, more bool, err error) {
	rows, err := f.conn.Query(ctx, query, args...)
	if err != nil {
		return 0, false, err
	}
	defer rows.Close()
	for rows.Next() {
		if read == limit {
			more = true
			break
		}
		if err := rows.Scan(f.dest...); err != nil {
			return 0, false, err
		}
		read++
		f.lastTS = f.createdTS
		f.lastID = append(f.lastID[:0], f.eventID...)
		if f.ids != nil {
			f.ids = append(f.ids, string(f.eventID))
		}
	}
	rows.Close()
	return read, more, rows.Err()
}

// walk reads a whole room-level conversation newest first and returns how
// many rows it read.
func (f *pgFloor) walk(ctx context.Context, pid int64, room string, limit int) (int, error) {
	total := 0
	read, more, err := f.page(ctx, pgPageHead, limit, pid, room, "", limit+1)
	for {
		if err != nil {
			return total, err
		}
		total += read
		if !more {
			return total, nil
		}
		read, more, err = f.page(ctx, pgPageAfter, limit, pid, room, "", limit+1, f.lastTS, f.lastID)
	}
}

// checkPGFloorMatchesReader confirms that the floor's SQL returns what the
// reader returns: the first page, and the page below it with the cursor in
// the row-value and the disjunctive spelling.
func checkPGFloorMatchesReader(ctx context.Context, env *pgWalkEnv) error {
	const limit = 20
	f := env.floor
	defer func() { f.ids = nil }()
	first, err := env.v.Read(ctx, journal.ReadRequest{RoomID: env.room, Limit: limit})
	if err != nil {
		return err
	}
	f.ids = []string{}
	if _, _, err := f.page(ctx, pgPageHead, limit, env.pid, env.room, "", limit+1); err != nil {
		return err
	}
	if err := sameIDs(first, f.ids); err != nil {
		return fmt.Errorf("head page: %w", err)
	}
	if first.NextCursor == nil {
		return errors.New("the reader's first page has no cursor")
	}
	cur := *first.NextCursor
	second, err := env.v.Read(ctx, journal.ReadRequest{RoomID: env.room, Limit: limit, Before: &cur})
	if err != nil {
		return err
	}
	for name, query := range map[string]string{"row value": pgPageAfter, "disjunctive": pgPageDisjunctive} {
		f.ids = []string{}
		if _, _, err := f.page(ctx, query, limit, env.pid, env.room, "", limit+1, cur.CreatedTS, cur.EventID); err != nil {
			return err
		}
		if err := sameIDs(second, f.ids); err != nil {
			return fmt.Errorf("%s page: %w", name, err)
		}
	}
	return nil
}

// BenchmarkPGConversationWalk reads one room of N messages (-n, 10^6 by
// default) end to end through the PostgreSQL journal's reader, following
// NextCursor until nil, and in the same iteration through the bare page
// SQL on one pgx connection (the floor). Metrics: rows/s of each and the
// reader/floor time ratio (1.0 means the reader adds nothing).
func BenchmarkPGConversationWalk(b *testing.B) {
	env := openPGWalk(b, pgCluster(b))
	for _, limit := range []int{500, 50} {
		b.Run(fmt.Sprintf("page=%d", limit), func(b *testing.B) {
			ctx := context.Background()
			var readerTime, floorTime time.Duration
			b.ResetTimer()
			for range b.N {
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

// BenchmarkPGDeepPage reads one 50-row page below a cursor at depths 1k,
// 500k and 999k of a 10^6 conversation (scaled to -n) on PostgreSQL: with
// the row-value cursor, with the disjunctive spelling (both bare, on the
// floor's connection) and through the reader, in the same iteration.
// Metrics: ns/page of each and the disjunctive/row-value ratio.
func BenchmarkPGDeepPage(b *testing.B) {
	env := openPGWalk(b, pgCluster(b))
	const limit = 50
	minDur := benchSizes().minMeasure
	for _, perMillion := range []int64{1_000, 500_000, 999_000} {
		depth := max(1, int(perMillion*int64(env.n)/1_000_000))
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			ctx := context.Background()
			var cur journal.Cursor
			if err := env.floor.conn.QueryRow(ctx, pgCursorAtDepth, env.pid, env.room, depth-1).
				Scan(&cur.CreatedTS, &cur.EventID); err != nil {
				b.Fatalf("cursor at depth %d: %v", depth, err)
			}
			want := min(limit, env.n-depth)
			forms := []struct {
				name string
				page func() (int, error)
			}{
				{"rowvalue", func() (int, error) {
					read, _, err := env.floor.page(ctx, pgPageAfter, limit, env.pid, env.room, "", limit+1, cur.CreatedTS, cur.EventID)
					return read, err
				}},
				{"disjunctive", func() (int, error) {
					read, _, err := env.floor.page(ctx, pgPageDisjunctive, limit, env.pid, env.room, "", limit+1, cur.CreatedTS, cur.EventID)
					return read, err
				}},
				{"reader", func() (int, error) {
					page, err := env.v.Read(ctx, journal.ReadRequest{RoomID: env.room, Limit: limit, Before: &cur})
					return len(page.Messages), err
				}},
			}
			perPage := make([]time.Duration, len(forms))
			b.ResetTimer()
			for range b.N {
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
