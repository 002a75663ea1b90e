package bench

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// offeredRate is the fixed open-loop load of the latency phase, events/s.
const offeredRate = 2000

// BenchmarkAdmit measures admission through the writer actor
// (synchronous=FULL, group commit) into a database already holding
// 3×10^5 settled messages over 16 principals × 32 rooms, with random
// 43-character event IDs. Senders are goroutines that each admit one-event
// batches in a loop and await every reply; that waiting is what lets the
// writer gather concurrent commands into one commit.
//
// Sub-benchmarks: group commit with 64 and 256 senders; one command per
// transaction (MaxBatch 1) with 256 senders; the naive schema baseline
// (naive_test.go) behind the same actor with 256 senders; "latency/group"
// and "latency/naive", p50-ms and p99-ms command latency at a fixed offered
// load of 2,000 events/s, each on a fresh copy, "latency/group" also with
// the I/O floor's p50 and p99 in turns beside it (floor-p50-ms,
// floor-p99-ms, p99/floor; iofloor_test.go), the WAL bytes per event at
// that load and the pages its checkpoints copied per event
// (ckpt-pages/ev); "ratios", group/naive and group/one-per-tx (256
// senders), measured in rounds taken in turn on fresh copies so that the
// VM's drift over the run moves both sides of a ratio alike (runRatios);
// and "vfs", group commit (256 senders) through SQLite's own VFS and
// through the gathering one (store.Options.WALBuffer), in turns the same
// way, with each one's events/s (stock-events/s, walbuf-events/s) and
// walbuf/stock, the ratio the option is kept for (docs/VFS.md).
//
// Metrics per run: events/s, and events admitted per round (a round ends
// after 30,000 events or 15 s, whichever comes first); walB/ev, WAL bytes
// appended per event (walstat_test.go explains the method); wrB/ev, all
// bytes the process wrote per event, checkpoints included; ev/commit, the
// mean group-commit batch; and wal-restarts, checkpoints that let the WAL
// start over.
func BenchmarkAdmit(b *testing.B) {
	sz := benchSizes()
	spec := fixtureSpec{Layout: "admit-16x32", N: sz.admitBase, Principals: admitPrincipals, Rooms: admitRooms}
	storePath := storeFixture(b, spec)
	naivePath := naiveFixture(b, spec)

	cases := []struct {
		name    string
		senders int
		open    func(b *testing.B) *admitEnv
	}{
		{"group/senders=64", 64, func(b *testing.B) *admitEnv { return openStoreAdmit(b, storePath, store.Options{}) }},
		{"group/senders=256", 256, func(b *testing.B) *admitEnv { return openStoreAdmit(b, storePath, store.Options{}) }},
		{"one-per-tx/senders=256", 256, func(b *testing.B) *admitEnv {
			return openStoreAdmit(b, storePath, store.Options{MaxBatch: 1})
		}},
		{"naive/senders=256", 256, func(b *testing.B) *admitEnv { return openNaiveAdmit(b, naivePath) }},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			runAdmit(b, c.open(b), c.senders)
		})
	}
	// Latency at a fixed offered load is measured on a fresh copy of its
	// own, so it sees the steady state of that load and not the WAL and
	// checkpoint backlog the throughput rounds leave behind.
	b.Run("latency/group", func(b *testing.B) {
		runLatency(b, openStoreAdmit(b, storePath, store.Options{}), storePath)
	})
	b.Run("latency/naive", func(b *testing.B) {
		runLatency(b, openNaiveAdmit(b, naivePath), "")
	})
	b.Run("ratios", func(b *testing.B) {
		runRatios(b, storePath, naivePath)
	})
	b.Run("vfs", func(b *testing.B) {
		runVFSRatio(b, storePath)
	})
}

// ratioRoundShare is the fraction of a full round each configuration
// admits per turn in runTurns: a third keeps the three turns of a cycle
// under half a minute.
const ratioRoundShare = 3

// runRatios measures group commit, the naive schema and one command per
// transaction in turns (runTurns) and reports the ratios of their rates.
func runRatios(b *testing.B, storePath, naivePath string) {
	rates := runTurns(b,
		openStoreAdmit(b, storePath, store.Options{}),
		openNaiveAdmit(b, naivePath),
		openStoreAdmit(b, storePath, store.Options{MaxBatch: 1}),
	)
	b.ReportMetric(rates[0]/rates[1], "group/naive")
	b.ReportMetric(rates[0]/rates[2], "group/one-per-tx")
}

// runVFSRatio measures group commit through SQLite's own VFS and through
// the gathering one in turns (runTurns), and reports both rates and their
// ratio: the option's gain, with the VM's drift taken out.
func runVFSRatio(b *testing.B, storePath string) {
	rates := runTurns(b,
		openStoreAdmit(b, storePath, store.Options{}),
		openStoreAdmit(b, storePath, store.Options{WALBuffer: true}),
	)
	b.ReportMetric(rates[0], "stock-events/s")
	b.ReportMetric(rates[1], "walbuf-events/s")
	b.ReportMetric(rates[1]/rates[0], "walbuf/stock")
}

// runTurns measures envs in turns, a round of each per cycle with
// ratioSenders senders, and returns each one's events/s. Measured one
// configuration after another, ratios moved with the VM's speed, which
// drifts by a third within a run: one run measured group/naive at 2.58
// after 3.01 to 3.62 in the runs before it, its naive rounds having come in
// a fast spell. A turn ends once the store has merged its page-index tail,
// so a configuration's deferred work is paid in its own turn and not during
// the next one's.
func runTurns(b *testing.B, envs ...*admitEnv) []float64 {
	ctx := context.Background()
	sz := benchSizes()
	type arm struct {
		env     *admitEnv
		pl      *planner
		elapsed time.Duration
		events  int
	}
	arms := make([]*arm, len(envs))
	perSender := max(1, sz.admitEvents/ratioRoundShare/ratioSenders)
	maxTurn := sz.maxRound / ratioRoundShare
	for i, env := range envs {
		arms[i] = &arm{env: env, pl: newPlanner(env.targets)}
		warmUp(b, env, arms[i].pl, ratioSenders, perSender, maxTurn)
	}
	b.ResetTimer()
	for range b.N {
		for _, a := range arms {
			b.StopTimer()
			plans := a.pl.plan(ratioSenders, perSender)
			b.StartTimer()
			start := time.Now()
			_, n, err := runRound(ctx, a.env.adm, plans, maxTurn)
			if err == nil && a.env.settle != nil {
				err = a.env.settle(ctx)
			}
			if err != nil {
				b.Fatal(err)
			}
			a.elapsed += time.Since(start)
			a.events += n
		}
	}
	b.StopTimer()
	rates := make([]float64, len(arms))
	for i, a := range arms {
		rates[i] = float64(a.events) / a.elapsed.Seconds()
	}
	return rates
}

// ratioSenders is the concurrency the ratios are measured at.
const ratioSenders = 256

// planned is one event a sender will admit as a batch of one.
type planned struct {
	principal int
	id        string
	token     string
	in        journal.Inbound
}

// admitter admits one planned event and waits for its commit.
type admitter interface {
	admit(ctx context.Context, e planned) error
}

// storeAdmitter admits through the real store's principal views.
type storeAdmitter struct{ views []journal.PrincipalStore }

func (a storeAdmitter) admit(ctx context.Context, e planned) error {
	res, err := a.views[e.principal].AdmitBatch(ctx, []journal.Inbound{e.in}, e.token)
	if err != nil {
		return err
	}
	if res[0].Outcome != journal.Admitted {
		return fmt.Errorf("admit %s: %v %v", e.id, res[0].Outcome, res[0].Err)
	}
	return nil
}

// admitEnv is one admission run's private database and its instruments.
type admitEnv struct {
	adm     admitter
	wal     *walCounter
	targets [][]target // per principal index: existing messages to relate to
	// settle, when set, finishes the work admission deferred (the store's
	// page-index merge).
	settle func(context.Context) error
}

// target is an existing message an edit or reaction can point at.
type target struct {
	room, id, sender string
	ts               int64
}

// targetSample is about how many fixture messages are sampled as targets.
const targetSample = 4096

func openStoreAdmit(b testing.TB, fixture string, opts store.Options) *admitEnv {
	b.Helper()
	ctx := context.Background()
	dir := b.TempDir()
	if err := copyFile(fixture, sqlitefs.Path(dir), true); err != nil {
		b.Fatal(err)
	}
	opts.StorageDir = dir
	s, err := store.Open(ctx, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	views := make([]journal.PrincipalStore, admitPrincipals)
	for p := range views {
		if views[p], err = s.Principal(ctx, agentName(p), agentUser(p)); err != nil {
			b.Fatal(err)
		}
	}
	ids, err := principalIDs(ctx, s, admitPrincipals)
	if err != nil {
		b.Fatal(err)
	}
	// The copy must read back in page order before it is worth measuring.
	var inRoom int
	if err := s.DB().QueryPool().QueryRowContext(ctx, countInRoom, ids[0], roomID(0)).Scan(&inRoom); err != nil {
		b.Fatal(err)
	}
	if err := verifyConversation(ctx, s, views[0], ids[0], roomID(0), inRoom); err != nil {
		b.Fatalf("admission fixture does not read back: %v", err)
	}
	index := map[int64]int{}
	for p, id := range ids {
		index[id] = p
	}
	targets, err := sampleTargets(ctx, s.DB().QueryPool(),
		`SELECT r.principal, r.room_id, v.event_id, v.sender, v.created_ts
			FROM visible_messages v JOIN rooms r ON r.id = v.room WHERE v.seq % ? = 0`, index)
	if err != nil {
		b.Fatal(err)
	}
	wal, err := installWALCounter(ctx, s.DB().WriterPool(), s.DB().Path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(wal.close)
	settle := func(ctx context.Context) error {
		_, err := s.MergePageTail(ctx)
		return err
	}
	return &admitEnv{adm: storeAdmitter{views: views}, wal: wal, targets: targets, settle: settle}
}

func openNaiveAdmit(b *testing.B, fixture string) *admitEnv {
	b.Helper()
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "naive.db")
	if err := copyFile(fixture, path, true); err != nil {
		b.Fatal(err)
	}
	n, err := openNaive(ctx, path, admitPrincipals)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(n.close)
	index := map[int64]int{}
	for p := range admitPrincipals {
		index[int64(p+1)] = p
	}
	targets, err := sampleTargets(ctx, n.db,
		`SELECT principal, room_id, event_id, sender, created_ts FROM visible WHERE rowid % ? = 0`, index)
	if err != nil {
		b.Fatal(err)
	}
	wal, err := installWALCounter(ctx, n.db, path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(wal.close)
	return &admitEnv{adm: n, wal: wal, targets: targets}
}

// sampleTargets reads about targetSample existing messages, grouped by
// principal index. q takes the sampling modulus.
func sampleTargets(ctx context.Context, db *sql.DB, q string, index map[int64]int) ([][]target, error) {
	var total int
	if err := db.QueryRowContext(ctx, `SELECT max(1, count(*) / ?) FROM (`+q+`)`, targetSample, 1).Scan(&total); err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, q, total)
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

// planner generates the admission mix: ~80% ~300-byte text messages in a
// random room of the sender's principal, ~12% edits of an earlier message
// by its own author (half the time one this sender just admitted, half an
// old fixture message), ~8% reactions. Timestamps grow by 1 ms per event
// from the wall clock, so every edit is newer than its target and applies.
type planner struct {
	g       *gen
	targets [][]target
	recent  map[int][]target // per sender: its own latest messages
	base    int64
	tick    int64
}

const recentPerSender = 64

func newPlanner(targets [][]target) *planner {
	return &planner{
		g:       newGen(uint64(time.Now().UnixNano()), 7),
		targets: targets,
		recent:  map[int][]target{},
		base:    time.Now().UnixMilli(),
	}
}

// plan returns perSender events for each of senders senders; sender s
// speaks for principal s mod admitPrincipals.
func (pl *planner) plan(senders, perSender int) [][]planned {
	plans := make([][]planned, senders)
	for s := range plans {
		plans[s] = make([]planned, 0, perSender)
		for range perSender {
			plans[s] = append(plans[s], pl.next(s))
		}
	}
	return plans
}

func (pl *planner) next(s int) planned {
	p := s % admitPrincipals
	pl.tick++
	ts := pl.base + pl.tick
	id := pl.g.eventID()
	var (
		ev   mx.Ev
		room string
	)
	roll := pl.g.r.IntN(100)
	t, haveTarget := pl.pickTarget(s, p)
	switch {
	case roll < 80 || !haveTarget:
		room = roomID(pl.g.r.IntN(admitRooms))
		sender := userID(pl.g.r.IntN(numUsers))
		ev = mx.Message(id, sender, ts, pl.g.body())
		r := append(pl.recent[s], target{room: room, id: id, sender: sender, ts: ts})
		if len(r) > recentPerSender {
			r = r[1:]
		}
		pl.recent[s] = r
	case roll < 92:
		room = t.room
		ev = mx.Edit(id, t.sender, ts, t.id, pl.g.body())
	default:
		room = t.room
		ev = mx.Reaction(id, userID(pl.g.r.IntN(numUsers)), ts, t.id, "👍")
	}
	return planned{
		principal: p,
		id:        id,
		token:     fmt.Sprintf("s%d_%d", s, pl.tick),
		in:        journal.Inbound{RoomID: room, Provenance: journal.Live, Event: ev.JSON()},
	}
}

func (pl *planner) pickTarget(s, p int) (target, bool) {
	recent, old := pl.recent[s], pl.targets[p]
	switch {
	case len(recent) > 0 && (len(old) == 0 || pl.g.r.IntN(2) == 0):
		return recent[pl.g.r.IntN(len(recent))], true
	case len(old) > 0:
		return old[pl.g.r.IntN(len(old))], true
	}
	return target{}, false
}

// runRound starts one goroutine per sender, each admitting its events one
// at a time and awaiting each commit, until its plan is done or maxDur has
// passed; the cap keeps a slow configuration (one fsync per event on a
// busy disk) from stretching `make bench`. It returns the wall time until
// the last commit and the events admitted.
func runRound(ctx context.Context, adm admitter, plans [][]planned, maxDur time.Duration) (time.Duration, int, error) {
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
			for _, e := range plan {
				if time.Now().After(deadline) {
					return
				}
				if err := adm.admit(ctx, e); err != nil {
					errc <- err
					return
				}
				admitted.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errc)
	return elapsed, int(admitted.Load()), <-errc
}

// warmUp admits a tenth of a round of perSender events from each of
// senders, untimed, which warms SQLite's cache and the prepared statements
// so the measured rounds start in steady state.
func warmUp(b *testing.B, env *admitEnv, pl *planner, senders, perSender int, maxRound time.Duration) {
	b.Helper()
	if _, _, err := runRound(context.Background(), env.adm, pl.plan(senders, max(1, perSender/10)), maxRound/10); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
}

// runAdmit runs the throughput rounds against env and reports the
// metrics.
func runAdmit(b *testing.B, env *admitEnv, senders int) {
	ctx := context.Background()
	sz := benchSizes()
	pl := newPlanner(env.targets)
	perSender := max(1, sz.admitEvents/senders)

	warmUp(b, env, pl, senders, perSender, sz.maxRound)
	wal0, _, err := env.wal.sample()
	if err != nil {
		b.Fatal(err)
	}
	wchar0, haveIO := processWriteChars()
	var (
		elapsed time.Duration
		events  int
	)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		plans := pl.plan(senders, perSender) // generation is not admission
		b.StartTimer()
		d, n, err := runRound(ctx, env.adm, plans, sz.maxRound)
		if err != nil {
			b.Fatal(err)
		}
		elapsed += d
		events += n
	}
	b.StopTimer()
	wal1, pageSize, err := env.wal.sample()
	if err != nil {
		b.Fatal(err)
	}
	wchar1, _ := processWriteChars()

	rate := float64(events) / elapsed.Seconds()
	b.ReportMetric(rate, "events/s")
	b.ReportMetric(float64(events)/float64(b.N), "events")
	frames := wal1.Frames - wal0.Frames
	b.ReportMetric(float64(walBytes(frames, pageSize))/float64(events), "walB/ev")
	if haveIO {
		b.ReportMetric(float64(wchar1-wchar0)/float64(events), "wrB/ev")
	}
	if commits := wal1.Commits - wal0.Commits; commits > 0 {
		b.ReportMetric(float64(events)/float64(commits), "ev/commit")
	}
	b.ReportMetric(float64(wal1.Restarts-wal0.Restarts), "wal-restarts")
}

// runLatency offers a fixed load of offeredRate events/s: a warm-up of a
// sixth of latencyEvents, not measured, then latencyEvents per iteration.
// It reports p50 and p99 command latency over every measured command.
// With floorFixture set, each round is followed by a round of the I/O floor
// (iofloor_test.go) that replays the round's disk work, so that store and
// floor are measured in turns and p99/floor within one run.
func runLatency(b *testing.B, env *admitEnv, floorFixture string) {
	ctx := context.Background()
	sz := benchSizes()
	pl := newPlanner(env.targets)
	if _, err := offerLoad(ctx, env.adm, pl, max(1, sz.latencyEvents/6), offeredRate); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
	var floor *ioFloor
	if floorFixture != "" {
		floor = newIOFloor(b, floorFixture)
		env.wal.recordPages()
	}
	var (
		all, floorAll offered
		profiles      []ioProfile
	)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		before, _, err := env.wal.sample()
		if err != nil {
			b.Fatal(err)
		}
		o, err := offerLoad(ctx, env.adm, pl, sz.latencyEvents, offeredRate)
		if err != nil {
			b.Fatal(err)
		}
		all.add(o)
		if floor == nil {
			continue
		}
		b.StopTimer()
		prof, fo := floorRound(b, env, floor, pl, before, len(o.latency))
		profiles = append(profiles, prof)
		floorAll.add(fo)
		b.StartTimer()
	}
	b.StopTimer()
	reportMillis(b, all.latency, 50, "p50-ms")
	reportMillis(b, all.latency, 99, "p99-ms")
	// How late commands started, which their latency includes: the share of
	// the tail that the generator and the scheduler, not the writer, made.
	reportMillis(b, all.lateness, 99, "start-p99-ms")
	b.ReportMetric(float64(len(all.latency))/float64(b.N), "events")
	if floor != nil {
		reportMillis(b, floorAll.latency, 50, "floor-p50-ms")
		reportMillis(b, floorAll.latency, 99, "floor-p99-ms")
		b.ReportMetric(float64(percentile(all.latency, 99))/float64(percentile(floorAll.latency, 99)), "p99/floor")
		var walPerEvent, pagesPerEvent float64
		for _, p := range profiles {
			walPerEvent += p.framesPerEvent * float64(p.frameSize)
			pagesPerEvent += p.pagesPerEvent
		}
		b.ReportMetric(walPerEvent/float64(len(profiles)), "walB/ev")
		b.ReportMetric(pagesPerEvent/float64(len(profiles)), "ckpt-pages/ev")
	}
}

// floorRound follows a store round of events events, begun at WAL sample
// before, with a round of the I/O floor replaying its disk work, and
// returns the round's profile and what the floor measured.
func floorRound(b *testing.B, env *admitEnv, floor *ioFloor, pl *planner, before walStats, events int) (ioProfile, offered) {
	b.Helper()
	ctx := context.Background()
	prof, err := profileRound(env.wal, before, events)
	if err != nil {
		b.Fatal(err)
	}
	// The store's deferred work is done before the floor runs, so it does
	// not slow the floor's round; its pages are dropped, not the next
	// round's.
	if err := env.settle(ctx); err != nil {
		b.Fatal(err)
	}
	env.wal.takePages()
	adm, stop := floor.serve(prof)
	fo, err := offerLoad(ctx, adm, pl, events, offeredRate)
	if stopErr := stop(); err == nil {
		err = stopErr
	}
	if err != nil {
		b.Fatalf("io floor: %v", err)
	}
	return prof, fo
}

// reportMillis reports the pct-th percentile of d in milliseconds.
func reportMillis(b *testing.B, d []time.Duration, pct int, unit string) {
	b.ReportMetric(float64(percentile(d, pct).Microseconds())/1000, unit)
}

// percentile returns the pct-th percentile of d, sorting d in place.
func percentile(d []time.Duration, pct int) time.Duration {
	slices.Sort(d)
	return d[min(len(d)-1, len(d)*pct/100)]
}

// offered is what one offerLoad measured, per command: its latency from its
// scheduled time, and how late after that time its goroutine started.
type offered struct {
	latency, lateness []time.Duration
}

func (o *offered) add(more offered) {
	o.latency = append(o.latency, more.latency...)
	o.lateness = append(o.lateness, more.lateness...)
}

// offerLoad is an open-loop generator: it issues count commands at rate
// per second on a fixed schedule, each from its own goroutine, whether or
// not earlier ones have finished. Latency runs from a command's scheduled
// time (not from when the generator got round to it), so a stall in the
// generator or the writer shows up instead of being hidden.
func offerLoad(ctx context.Context, adm admitter, pl *planner, count, rate int) (offered, error) {
	// One event per principal in turn, the same mix as the rounds.
	perPrincipal := max(1, count/admitPrincipals)
	plans := pl.plan(admitPrincipals, perPrincipal)
	events := make([]planned, 0, perPrincipal*admitPrincipals)
	for k := range perPrincipal {
		for s := range plans {
			events = append(events, plans[s][k])
		}
	}
	interval := time.Second / time.Duration(rate)
	o := offered{latency: make([]time.Duration, len(events)), lateness: make([]time.Duration, len(events))}
	var (
		wg   sync.WaitGroup
		errc = make(chan error, len(events))
	)
	sleepUntil, release := newPacer()
	defer release()
	start := time.Now()
	for i, e := range events {
		due := start.Add(time.Duration(i) * interval)
		sleepUntil(due)
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.lateness[i] = time.Since(due)
			if err := adm.admit(ctx, e); err != nil {
				errc <- err
				return
			}
			o.latency[i] = time.Since(due)
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return offered{}, err
	}
	return o, nil
}
