package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/pg"
)

// pgAdmitBatch is the events of one AdmitBatch in the batched arm of
// BenchmarkPGAdmit: a small sync batch.
const pgAdmitBatch = 8

const (
	pgSampleTargets = `SELECT r.principal, r.room_id, v.event_id, v.sender, v.created_ts
		FROM visible_messages v JOIN rooms r ON r.id = v.room WHERE v.seq % $1 = 0`
	// pgWALPosition is the server's WAL insert position in bytes: the
	// difference of two is the WAL every process wrote between them.
	// pg_stat_wal's wal_bytes counts the same records, but a backend adds
	// its own only when it flushes its statistics, at most once a second
	// and up to 10 s after it goes idle, so read right after a round it
	// misses part of the round's WAL, or all of it.
	pgWALPosition = `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`
)

// BenchmarkPGAdmit measures admission through the PostgreSQL journal
// into a schema already holding 3×10^5 settled messages over 16
// principals × 32 rooms (the layout and mix of BenchmarkAdmit), on a
// durable cluster. 256 senders, sender s speaking for principal s mod 16,
// each admit their events in a loop, awaiting every commit, in four arms:
// one event per AdmitBatch through the store as it runs (group: the
// commands of a principal that wait gather into one transaction), the
// same through a second store on the schema that gathers none (single:
// every event a transaction of its own), AdmitBatch calls of
// pgAdmitBatch events (batch), and one event per command into the SQLite
// fixture of the same spec (sqlite: the writer's group commit). The arms
// take turns, one round of each per iteration, so the VM's drift moves
// all alike. A round ends after 30,000 events or 15 s.
//
// Metrics: each arm's events/s, the ratios group/single and group/sqlite,
// and the PostgreSQL arms' WAL bytes per event (<arm>-walB/ev) from the
// server's WAL position (pgWALPosition).
func BenchmarkPGAdmit(b *testing.B) {
	c := pgCluster(b)
	sz := benchSizes()
	spec := fixtureSpec{Layout: "admit-16x32", N: sz.admitBase, Principals: admitPrincipals, Rooms: admitRooms}
	env := openPGAdmit(b, c, spec)
	lite := openStoreAdmit(b, storeFixture(b, spec), store.Options{})
	b.Run(fmt.Sprintf("senders=%d", ratioSenders), func(b *testing.B) {
		runPGAdmit(b, env, lite, ratioSenders)
	})
}

// pgAdmitEnv is the schema admission runs against and its instruments.
type pgAdmitEnv struct {
	views []journal.PrincipalStore
	// single are views of a second store on the schema that commits every
	// command alone.
	single  []journal.PrincipalStore
	targets [][]target
	// admin reads the WAL position.
	admin *pgx.Conn
}

func openPGAdmit(b *testing.B, c *pg.Cluster, spec fixtureSpec) *pgAdmitEnv {
	b.Helper()
	ctx := context.Background()
	url := c.Schema(b)
	start := time.Now()
	s, ids := loadPGStore(b, url, spec)
	b.Logf("loaded %d messages into PostgreSQL in %v", spec.N, time.Since(start).Round(time.Millisecond))
	env := &pgAdmitEnv{views: make([]journal.PrincipalStore, spec.Principals), single: make([]journal.PrincipalStore, spec.Principals)}
	alone, err := store.Open(ctx, store.Options{DatabaseURL: url, PGMaxGroup: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { alone.Close() })
	for p := range env.views {
		if env.views[p], err = s.Principal(ctx, agentName(p), agentUser(p)); err != nil {
			b.Fatal(err)
		}
		if env.single[p], err = alone.Principal(ctx, agentName(p), agentUser(p)); err != nil {
			b.Fatal(err)
		}
	}
	if env.admin, err = pgx.Connect(ctx, url); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { env.admin.Close(context.Background()) })
	index := map[int64]int{}
	for p, id := range ids {
		index[id] = p
	}
	if env.targets, err = samplePGTargets(ctx, env.admin, max(1, spec.N/targetSample), index); err != nil {
		b.Fatalf("sample targets: %v", err)
	}
	return env
}

// samplePGTargets reads every every-th fixture message, grouped by
// principal index.
func samplePGTargets(ctx context.Context, conn *pgx.Conn, every int, index map[int64]int) ([][]target, error) {
	rows, err := conn.Query(ctx, pgSampleTargets, every)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([][]target, admitPrincipals)
	for rows.Next() {
		var (
			pid int64
			t   target
		)
		if err := rows.Scan(&pid, &t.room, &t.id, &t.sender, &t.ts); err != nil {
			return nil, err
		}
		p, ok := index[pid]
		if !ok {
			return nil, fmt.Errorf("sampled a message of unknown principal %d", pid)
		}
		out[p] = append(out[p], t)
	}
	return out, rows.Err()
}

// walPosition is the server's WAL insert position in bytes.
func (env *pgAdmitEnv) walPosition(ctx context.Context) (int64, error) {
	var pos int64
	err := env.admin.QueryRow(ctx, pgWALPosition).Scan(&pos)
	return pos, err
}

// pgArm is one side of the turns: the views it admits through, its batch
// size and what it measured.
type pgArm struct {
	name  string
	views []journal.PrincipalStore
	batch int
	pl    *planner
	// sqlite is set for the SQLite arm, whose WAL is not the server's.
	sqlite  bool
	elapsed time.Duration
	events  int
	wal     int64
}

// runPGAdmit runs the arms in turns with senders senders and reports
// their rates, their ratio and their WAL bytes per event.
func runPGAdmit(b *testing.B, env *pgAdmitEnv, lite *admitEnv, senders int) {
	ctx := context.Background()
	sz := benchSizes()
	perSender := max(1, sz.admitEvents/senders)
	arms := []*pgArm{
		{name: "group", views: env.views, batch: 1, pl: newPlanner(env.targets)},
		{name: "single", views: env.single, batch: 1, pl: newPlanner(env.targets)},
		{name: "batch", views: env.views, batch: pgAdmitBatch, pl: newPlanner(env.targets)},
		{name: "sqlite", views: lite.adm.(storeAdmitter).views, batch: 1, pl: newPlanner(lite.targets), sqlite: true},
	}
	for _, a := range arms {
		// A tenth of a round, untimed, warms the server's caches and the
		// pool's connections and prepared statements.
		if _, _, err := pgAdmitRound(ctx, a.views, a.pl.plan(senders, max(1, perSender/10)), a.batch, sz.maxRound/10); err != nil {
			b.Fatalf("warm-up: %v", err)
		}
	}
	b.ResetTimer()
	for range b.N {
		for _, a := range arms {
			b.StopTimer()
			plans := a.pl.plan(senders, perSender) // generation is not admission
			wal0, err := env.walPosition(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			d, n, err := pgAdmitRound(ctx, a.views, plans, a.batch, sz.maxRound)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			wal1, err := env.walPosition(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			a.elapsed += d
			a.events += n
			a.wal += wal1 - wal0
		}
	}
	b.StopTimer()
	rates := make([]float64, len(arms))
	for i, a := range arms {
		rates[i] = float64(a.events) / a.elapsed.Seconds()
		b.ReportMetric(rates[i], a.name+"-events/s")
		if !a.sqlite {
			b.ReportMetric(float64(a.wal)/float64(a.events), a.name+"-walB/ev")
		}
	}
	b.ReportMetric(rates[0]/rates[1], "group/single")
	b.ReportMetric(rates[0]/rates[3], "group/sqlite")
}

// pgAdmitRound starts one goroutine per sender, each admitting its plan in
// AdmitBatch calls of batch events (all of its principal's) and awaiting
// each commit, until its plan is done or maxDur has passed. It returns the
// wall time until the last commit and the events admitted.
func pgAdmitRound(ctx context.Context, views []journal.PrincipalStore, plans [][]planned, batch int, maxDur time.Duration) (time.Duration, int, error) {
	var (
		wg       sync.WaitGroup
		admitted atomic.Int64
		errc     = make(chan error, len(plans))
	)
	start := time.Now()
	deadline := start.Add(maxDur)
	for _, plan := range plans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			events := make([]journal.Inbound, 0, batch)
			for i := 0; i < len(plan); i += batch {
				if time.Now().After(deadline) {
					return
				}
				chunk := plan[i:min(i+batch, len(plan))]
				events = events[:0]
				for _, e := range chunk {
					events = append(events, e.in)
				}
				last := chunk[len(chunk)-1]
				res, err := views[last.principal].AdmitBatch(ctx, events, last.token)
				if err != nil {
					errc <- err
					return
				}
				for k, r := range res {
					if r.Outcome != journal.Admitted {
						errc <- fmt.Errorf("admit %s: %v %v", chunk[k].id, r.Outcome, r.Err)
						return
					}
				}
				admitted.Add(int64(len(chunk)))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errc)
	return elapsed, int(admitted.Load()), <-errc
}
