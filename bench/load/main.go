// Command load puts one journal under a chat's sustained load and reports
// how it held: principals' sync loops admitting batches at a fixed rate,
// readers paging conversations, exporters walking whole ones, and every
// actionable event answered through the outbox, all at once on one store.
// It is a journal load test: there is no homeserver, and a stand-in Sender
// acknowledges each send at once with a server timestamp.
//
// The run fails (exit 1) on any lock error (SQLITE_BUSY, "database is
// locked", a busy wait of the writer), found by store.Options.OnBusy, in
// any error an operation returned, or in any line the store, the actors or
// the outbox logged; on any other error; on a page out of order; and when
// the outbox does not drain. `make load` runs it with the defaults,
// `make load-smoke` with -short.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
)

// config is one run's knobs; the flags set them.
type config struct {
	rate       float64
	duration   time.Duration
	principals int
	rooms      int
	readers    int
	exporters  int
	// history is the messages each room holds before the live load.
	history int
	// syncEvery is how often a principal's sync loop admits what arrived.
	syncEvery    time.Duration
	readPause    time.Duration
	exportPause  time.Duration
	drainTimeout time.Duration
	// storage is the storage root; a temporary directory, removed after
	// the run, when empty.
	storage string
	seed    uint64

	// afterOpen, when set, runs once the store is open, and onBusy each
	// time the writer meets a write lock held elsewhere: a test takes such
	// a lock in one and lets it go in the other.
	afterOpen func(dbPath string)
	onBusy    func()
}

// parseFlags reads the command line. -short shrinks the run to a smoke
// test unless the duration or history is given as well.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Float64Var(&cfg.rate, "rate", 300, "live events per second, over all principals")
	fs.DurationVar(&cfg.duration, "duration", 60*time.Second, "how long the live load runs")
	fs.IntVar(&cfg.principals, "principals", 20, "principals (agents) on the journal")
	fs.IntVar(&cfg.rooms, "rooms", 10, "rooms per principal")
	fs.IntVar(&cfg.readers, "readers", 8, "goroutines paging conversations")
	fs.IntVar(&cfg.exporters, "exporters", 2, "goroutines exporting whole conversations")
	fs.IntVar(&cfg.history, "history", 500, "messages each room holds before the live load (its first sync)")
	fs.DurationVar(&cfg.syncEvery, "sync", 100*time.Millisecond, "how often a principal's sync loop admits what arrived")
	fs.DurationVar(&cfg.readPause, "read-pause", 10*time.Millisecond, "a reader's pause after each page")
	fs.DurationVar(&cfg.exportPause, "export-pause", 100*time.Millisecond, "an exporter's pause between exports")
	fs.DurationVar(&cfg.drainTimeout, "drain-timeout", 2*time.Minute, "the longest the outbox may take to drain after admission")
	fs.StringVar(&cfg.storage, "storage", "", "storage root (default: a temporary directory, removed afterwards)")
	fs.Uint64Var(&cfg.seed, "seed", 1, "seed of the generated traffic")
	short := fs.Bool("short", false, "smoke run: 5 s of load over 50 history messages a room")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if *short {
		set := make(map[string]bool)
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["duration"] {
			cfg.duration = 5 * time.Second
		}
		if !set["history"] {
			cfg.history = 50
		}
	}
	switch {
	case cfg.rate <= 0, cfg.duration <= 0, cfg.syncEvery <= 0, cfg.drainTimeout <= 0:
		return config{}, errors.New("-rate, -duration, -sync and -drain-timeout must be positive")
	case cfg.principals <= 0, cfg.rooms <= 0:
		return config{}, errors.New("-principals and -rooms must be positive")
	case cfg.readers < 0, cfg.exporters < 0, cfg.history < 0:
		return config{}, errors.New("-readers, -exporters and -history must not be negative")
	}
	return cfg, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
	res.print(os.Stdout)
	if len(res.failures) > 0 {
		os.Exit(1)
	}
}

// memorySampleEvery spaces the samples of the resident set's parts.
const memorySampleEvery = 250 * time.Millisecond

// principalLoad is one principal's part of the run.
type principalLoad struct {
	view    journal.PrincipalStore
	traffic *traffic
	outbox  *actor.PID
	hints   *hint.Subscription
}

// harness is one run's shared state.
type harness struct {
	cfg        config
	logs       *logCapture
	errs       *errorTally
	log        zerolog.Logger
	system     *actor.ActorSystem
	store      *store.Store
	principals []*principalLoad
	// start is when the live load began.
	start time.Time

	historyEvents atomic.Int64
	admitted      admitCounts
	admitLatency  samples
	readLatency   samples
	exportLatency samples
	commitTook    samples

	// live is set once the live load begins; commits before it (the
	// first sync) are not counted.
	live               atomic.Bool
	busyWaits          atomic.Int64
	commits, commands  atomic.Int64
	enqueued, acked    atomic.Int64
	sends              atomic.Int64
	lastAck            atomic.Int64 // unix ns
	passes             atomic.Int64 // turn passes in progress
	pages, pageRows    atomic.Int64
	owed, disorder     atomic.Int64
	exports            atomic.Int64
	exportPages        atomic.Int64
	exportRows         atomic.Int64
	exportDisorder     atomic.Int64
	wake               chan struct{}
	storageDir, dbPath string
}

// poke wakes the drain check.
func (h *harness) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// run does one load run and returns what it measured. An error means the
// run could not be set up or torn down; failures of the journal under load
// are in the result.
func run(ctx context.Context, cfg config, progress io.Writer) (*result, error) {
	h := &harness{cfg: cfg, logs: newLogCapture(), errs: newErrorTally(), wake: make(chan struct{}, 1)}
	h.log = zerolog.New(h.logs).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	h.storageDir = cfg.storage
	if h.storageDir == "" {
		dir, err := os.MkdirTemp("", "mindroomd-load-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		h.storageDir = dir
	}
	h.system = actors.NewSystem(h.log)
	s, err := store.Open(ctx, store.Options{StorageDir: h.storageDir, Log: h.log, System: h.system,
		OnBusy: func(time.Duration) {
			h.busyWaits.Add(1)
			if cfg.onBusy != nil {
				cfg.onBusy()
			}
		},
		OnCommit: func(commands int, took time.Duration) {
			if !h.live.Load() {
				return // the first sync is not the load
			}
			h.commits.Add(1)
			h.commands.Add(int64(commands))
			h.commitTook.add(took)
		}})
	if err != nil {
		return nil, err
	}
	h.store, h.dbPath = s, s.DB().Path
	var mem memorySampler
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	var sampling sync.WaitGroup
	sampling.Go(func() { mem.run(sampleCtx, memorySampleEvery) })
	if cfg.afterOpen != nil {
		cfg.afterOpen(h.dbPath)
	}
	closed := false
	defer func() {
		if !closed {
			_ = s.Close()
		}
	}()

	res := &result{cfg: cfg, storage: h.storageDir}
	setupStart := time.Now()
	for p := range cfg.principals {
		view, err := s.Principal(ctx, agentName(p), agentUser(p))
		if err != nil {
			return nil, fmt.Errorf("register principal: %w", err)
		}
		h.principals = append(h.principals, &principalLoad{view: view, traffic: newTraffic(cfg.seed, p, cfg.rooms)})
	}
	if err := h.parallel(ctx, cfg.principals, h.seedHistory); err != nil {
		return nil, fmt.Errorf("first sync: %w", err)
	}
	res.setup = time.Since(setupStart)
	res.historyEvents = h.historyEvents.Load()

	// The outbox actors and the turn workers run until the outbox has
	// drained; readers and exporters beside them.
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	var workers, lookers sync.WaitGroup
	lookCtx, stopLooking := context.WithCancel(ctx)
	defer stopLooking()
	for p, pl := range h.principals {
		pl.hints = s.Hints().Subscribe(pl.view.Principal().String())
		pl.outbox = h.system.Root.Spawn(outbox.Props(outbox.Deps{Outbox: pl.view, Sender: ackSender{h},
			DeviceID: "LOADDEVICE", Hints: pl.hints, Observe: h.observe,
			Log: h.log.With().Str("actor", "outbox").Str("agent", agentName(p)).Logger()}))
		workers.Go(func() { h.turnLoop(workCtx, pl) })
	}
	for i := range cfg.readers {
		rng := rand.New(rand.NewPCG(cfg.seed, uint64(1000+i)))
		lookers.Go(func() { h.reader(lookCtx, rng) })
	}
	for i := range cfg.exporters {
		rng := rand.New(rand.NewPCG(cfg.seed, uint64(2000+i)))
		lookers.Go(func() { h.exporter(lookCtx, rng) })
	}

	userBefore, sysBefore, cpuErr := cpuTime()
	h.start = time.Now()
	h.live.Store(true)
	end := h.start.Add(cfg.duration)
	var syncs sync.WaitGroup
	for p := range cfg.principals {
		syncs.Go(func() { h.syncLoop(ctx, p, end) })
	}
	h.reportProgress(ctx, &syncs, progress)
	admissionEnd := time.Now()
	res.admission = admissionEnd.Sub(h.start)

	drain, drainErr := h.awaitDrain(ctx, admissionEnd)
	res.drain, res.drainErr = drain, drainErr

	if userAfter, sysAfter, err := cpuTime(); err == nil && cpuErr == nil {
		res.cpuUser, res.cpuSys, res.cpuWall = userAfter-userBefore, sysAfter-sysBefore, time.Since(h.start)
	}
	stopLooking()
	lookers.Wait()
	stopWork()
	workers.Wait()
	for _, pl := range h.principals {
		if err := h.system.Root.StopFuture(pl.outbox).Wait(); err != nil {
			h.errs.add(ctx, "stop outbox", err)
		}
		pl.hints.Close()
	}
	// What the run left: no work owed and nothing unacknowledged.
	if drainErr == nil {
		if ok, err := h.drained(ctx); err != nil || !ok {
			res.drainErr = fmt.Errorf("after the run: drained=%v: %v", ok, err)
		}
	}
	res.dbBytes, res.walBytes = fileSize(h.dbPath), fileSize(h.dbPath+"-wal")
	stopSampling()
	sampling.Wait()
	res.anonPeak, res.filePeak, res.memErr = mem.peaks()
	closed = true
	if err := s.Close(); err != nil {
		h.errs.add(context.Background(), "close", err)
	}
	if err := s.Fatal(); err != nil {
		h.errs.add(context.Background(), "store fatal", err)
	}
	h.collect(res)
	return res, nil
}

// parallel runs fn for each of n principals at once and returns the first
// error.
func (h *harness) parallel(ctx context.Context, n int, fn func(context.Context, int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for p := range n {
		wg.Go(func() { errs[p] = fn(ctx, p) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// reportProgress prints a line every 10 s while the sync loops run and
// returns once they have all stopped.
func (h *harness) reportProgress(ctx context.Context, syncs *sync.WaitGroup, w io.Writer) {
	done := make(chan struct{})
	go func() {
		syncs.Wait()
		close(done)
	}()
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			<-done
			return
		case <-t.C:
			fmt.Fprintf(w, "  %3.0fs  %s events admitted, %s answers acknowledged, %s pages read, %s exports\n",
				time.Since(h.start).Seconds(), commas(h.admitted.events.Load()), commas(h.acked.Load()),
				commas(h.pages.Load()), commas(h.exports.Load()))
		}
	}
}

// awaitDrain waits, after admission ended, until every actionable event
// was answered and every answer acknowledged, and returns the time from
// the end of admission to the last acknowledgement.
func (h *harness) awaitDrain(ctx context.Context, admissionEnd time.Time) (time.Duration, error) {
	deadline := time.NewTimer(h.cfg.drainTimeout)
	defer deadline.Stop()
	h.poke()
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-deadline.C:
			return 0, fmt.Errorf("outbox not drained %s after admission: %d answers enqueued, %d acknowledged",
				h.cfg.drainTimeout, h.enqueued.Load(), h.acked.Load())
		case <-h.wake:
		}
		if h.passes.Load() != 0 || h.enqueued.Load() != h.acked.Load() {
			continue // a turn pass or an acknowledgement will wake us
		}
		ok, err := h.drained(ctx)
		if err != nil {
			return 0, err
		}
		if ok {
			last := time.Unix(0, h.lastAck.Load())
			return max(last.Sub(admissionEnd), 0), nil
		}
	}
}

// drained reports whether no principal has pending work or an
// unacknowledged delivery.
func (h *harness) drained(ctx context.Context) (bool, error) {
	for _, pl := range h.principals {
		page, err := pl.view.Pending(ctx, 1, 0)
		if err != nil {
			return false, fmt.Errorf("pending: %w", err)
		}
		if len(page.Events) > 0 || len(page.Unreadable) > 0 {
			return false, nil
		}
		rows, err := pl.view.Unacknowledged(ctx, 1, nil)
		if err != nil {
			return false, fmt.Errorf("unacknowledged: %w", err)
		}
		if len(rows) > 0 {
			return false, nil
		}
	}
	return true, nil
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// result is what one run measured.
type result struct {
	cfg           config
	storage       string
	setup         time.Duration
	historyEvents int64
	admission     time.Duration
	drain         time.Duration
	drainErr      error

	batches, events, actionable int64
	byKind                      [numKinds]int64
	admit, read, export, commit spread
	enqueued, acked, sends      int64
	pages, pageRows, owed       int64
	exports, exportPages        int64
	exportRows, exportDisorder  int64
	disorder                    int64
	commits, commands           int64
	busyWaits                   int64
	dbBytes, walBytes           int64
	// peakRSS is VmHWM; anonPeak and filePeak the largest anonymous and
	// mapped-file parts sampled while the store was open.
	peakRSS, anonPeak, filePeak int64
	memErr                      error
	// cpuUser and cpuSys are the process's CPU time from the start of the
	// live load until the outbox drained, cpuWall the time that took.
	cpuUser, cpuSys, cpuWall time.Duration
	logs                     logSummary
	errs                     errorSummary
	// lockErrors adds every sighting of a lock error: OnBusy calls, errors
	// returned and log lines.
	lockErrors int64
	failures   []string
}

// collect fills res from the harness's counters and decides the verdict.
func (h *harness) collect(res *result) {
	res.batches, res.events, res.actionable = h.admitted.batches.Load(), h.admitted.events.Load(), h.admitted.actionable.Load()
	for k := range res.byKind {
		res.byKind[k] = h.admitted.byKind[k].Load()
	}
	res.admit, res.read, res.export, res.commit = h.admitLatency.spread(), h.readLatency.spread(), h.exportLatency.spread(), h.commitTook.spread()
	res.enqueued, res.acked, res.sends = h.enqueued.Load(), h.acked.Load(), h.sends.Load()
	res.pages, res.pageRows, res.owed, res.disorder = h.pages.Load(), h.pageRows.Load(), h.owed.Load(), h.disorder.Load()
	res.exports, res.exportPages, res.exportRows, res.exportDisorder = h.exports.Load(), h.exportPages.Load(), h.exportRows.Load(), h.exportDisorder.Load()
	res.commits, res.commands, res.busyWaits = h.commits.Load(), h.commands.Load(), h.busyWaits.Load()
	if m, err := readMemory(); err != nil {
		res.memErr = err
	} else {
		res.peakRSS = m.Peak
	}
	res.logs, res.errs = h.logs.summary(), h.errs.summary()
	res.lockErrors = res.busyWaits + int64(res.errs.Locks) + int64(res.logs.Locks)

	fail := func(format string, args ...any) { res.failures = append(res.failures, fmt.Sprintf(format, args...)) }
	if res.lockErrors > 0 {
		fail("%d lock errors (OnBusy %d, returned %d, logged %d)", res.lockErrors, res.busyWaits, res.errs.Locks, res.logs.Locks)
	}
	if res.errs.Total > 0 {
		fail("%d errors returned", res.errs.Total)
	}
	if res.disorder+res.exportDisorder > 0 {
		fail("%d pages and %d exports out of order", res.disorder, res.exportDisorder)
	}
	if res.drainErr != nil {
		fail("drain: %v", res.drainErr)
	}
	if res.enqueued != res.acked || res.sends != res.acked {
		fail("%d answers enqueued, %d sent, %d acknowledged", res.enqueued, res.sends, res.acked)
	}
	// Only a redaction settles an actionable event without its turn here
	// (nobody leaves a room, the agent ignores nothing).
	if res.enqueued > res.actionable || res.actionable-res.enqueued > res.byKind[kindRedaction] {
		fail("%d actionable events but %d answers enqueued, with %d redactions", res.actionable, res.enqueued, res.byKind[kindRedaction])
	}
	if n := res.logs.ByLevel["error"] + res.logs.ByLevel["fatal"] + res.logs.ByLevel["panic"]; n > 0 {
		fail("%d error lines logged", n)
	}
}

// print writes the report.
func (r *result) print(w io.Writer) {
	c := r.cfg
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
	secs := r.admission.Seconds()
	p("mindroomd load: the journal alone, no homeserver (a stand-in Sender acknowledges each send at once with a server timestamp)\n")
	p("config      %d principals × %d rooms, %.0f events/s offered for %s, a sync batch every %s; %d readers (limit %d, %s after each page), %d exporters (%s between exports)\n",
		c.principals, c.rooms, c.rate, c.duration, c.syncEvery, c.readers, pageLimit, c.readPause, c.exporters, c.exportPause)
	where := "a temporary directory, removed afterwards"
	if c.storage != "" {
		where = r.storage
	}
	p("setup       journal in %s; first sync: %s history events (%d a room) in %.1f s\n", where, commas(r.historyEvents), c.history, r.setup.Seconds())
	var kinds []string
	for k, n := range r.byKind {
		kinds = append(kinds, commas(n)+" "+kindNames[k])
	}
	p("admission   %s events in %s batches over %.1f s (%.1f events/s): %s; %s actionable\n",
		commas(r.events), commas(r.batches), secs, float64(r.events)/secs, strings.Join(kinds, ", "), commas(r.actionable))
	p("            per AdmitBatch p50 %s, p99 %s, max %s\n", ms(r.admit.P50), ms(r.admit.P99), ms(r.admit.Max))
	p("commits     %s commits of %.1f commands on average; transaction p50 %s, p99 %s, max %s\n",
		commas(r.commits), float64(r.commands)/float64(max(r.commits, 1)), ms(r.commit.P50), ms(r.commit.P99), ms(r.commit.Max))
	p("outbox      %s answers enqueued with their turn records, %s sent, %s acknowledged; unanswered, their redaction having settled them while pending: %s\n",
		commas(r.enqueued), commas(r.sends), commas(r.acked), commas(r.actionable-r.enqueued))
	switch {
	case r.drainErr == nil && r.drain == 0:
		p("            drained: the last answer was acknowledged before admission ended\n")
	case r.drainErr == nil:
		p("            drained %s after the end of admission (to the last acknowledgement)\n", ms(r.drain))
	default:
		p("            NOT DRAINED: %v\n", r.drainErr)
	}
	p("reads       %s pages (%s messages, %s owed refetches listed); page p50 %s, p99 %s, max %s; %d out of order\n",
		commas(r.pages), commas(r.pageRows), commas(r.owed), ms(r.read.P50), ms(r.read.P99), ms(r.read.Max), r.disorder)
	p("exports     %s conversations (%s pages, %s messages); export p50 %s, p99 %s, max %s; %d out of order\n",
		commas(r.exports), commas(r.exportPages), commas(r.exportRows), ms(r.export.P50), ms(r.export.P99), ms(r.export.Max), r.exportDisorder)
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	if r.memErr != nil {
		p("memory      peak RSS unknown: %v\n", r.memErr)
	} else {
		p("memory      peak RSS (VmHWM) %.1f MiB; sampled every %s, at most %.1f MiB anonymous and %.1f MiB of mapped files (the binary and the journal's memory map)\n",
			mib(r.peakRSS), memorySampleEvery, mib(r.anonPeak), mib(r.filePeak))
	}
	if r.cpuWall > 0 {
		p("cpu         %.1f s user, %.1f s system from the start of the load to the drain: %.2f cores on average\n",
			r.cpuUser.Seconds(), r.cpuSys.Seconds(), (r.cpuUser+r.cpuSys).Seconds()/r.cpuWall.Seconds())
	}
	p("files       journal %.1f MiB, WAL %.1f MiB before close\n", mib(r.dbBytes), mib(r.walBytes))
	p("lock errors %d (OnBusy %d, in returned errors %d, in log lines %d)\n", r.lockErrors, r.busyWaits, r.errs.Locks, r.logs.Locks)
	p("errors      %d returned%s\n", r.errs.Total, byKey(r.errs.ByOp))
	p("log         %d lines%s\n", r.logs.Lines, byKey(r.logs.ByLevel))
	for _, e := range r.errs.Kept {
		p("  error: %s\n", e)
	}
	for _, l := range r.logs.Kept {
		p("  log: %s\n", l)
	}
	if len(r.failures) == 0 {
		p("PASS\n")
		return
	}
	p("FAIL: %s\n", strings.Join(r.failures, "; "))
}

// byKey formats counts as " (k n, k n)", keys sorted; "" when empty.
func byKey(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		name := k
		if name == "" {
			name = "unlevelled"
		}
		parts[i] = fmt.Sprintf("%s %d", name, m[k])
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// commas formats n with thousands separators.
func commas(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + commas(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
