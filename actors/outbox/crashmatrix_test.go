package outbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/crash"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// The crash matrix kills a real process at named points of a turn's
// delivery and restarts it: the parent test re-executes this test binary
// as a child running TestCrashMatrixChild, reads "AT <point>" from its
// stdout, SIGKILLs it, restarts it without a kill point and waits for
// "DONE". Then it checks, as seen on the recording homeserver: nothing
// lost, nothing answered twice, no model call re-run.

// Environment of the child.
const (
	envCrashDir      = "MINDROOMD_CRASH_DIR"       // journal storage dir
	envCrashServer   = "MINDROOMD_CRASH_SERVER"    // recording homeserver file
	envCrashModelLog = "MINDROOMD_CRASH_MODEL_LOG" // one line per model call
	envCrashPoint    = "MINDROOMD_CRASH_POINT"     // kill point; "" runs to DONE
	envCrashTarget   = "MINDROOMD_CRASH_TARGET"    // delivery/stage the point applies to
)

// Kill points.
const (
	pointAfterRecord  = "after-record"  // the turn result is durable; its final not enqueued
	pointAfterEnqueue = "after-enqueue" // EnqueueAndSettle committed; not claimed
	pointAfterClaim   = "after-claim"   // attempted=1 committed; nothing sent
	pointAfterAccept  = "after-accept"  // the server recorded it; no ack committed
	pointAfterAck     = "after-ack"     // the ack committed
)

// The child's world: one principal, crashTurns source messages, one turn
// each; odd turns send an initial placeholder before calling the model.
const (
	crashTurns       = 5
	crashAgent       = "crash"
	crashUser        = "@crashbot:example.org"
	crashDevice      = "DEV"
	crashSourceToken = "sources-admitted"
	childDeadline    = 25 * time.Second
	matrixDeadline   = 55 * time.Second
)

func crashTurnID(i int) string         { return fmt.Sprintf("turn-%d", i) }
func crashSourceID(i int) string       { return fmt.Sprintf("$src-%d", i) }
func crashHasInitial(i int) bool       { return i%2 == 1 }
func crashAnswer(i int) string         { return fmt.Sprintf("answer to question %d", i) }
func stageKey(id, stage string) string { return id + "/" + stage }

func TestCrashMatrix(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), matrixDeadline)
	t.Cleanup(cancel) // after the parallel subtests
	targets := []string{stageKey(crashTurnID(1), "initial"), stageKey(crashTurnID(2), "final")}
	for _, point := range []string{pointAfterRecord, pointAfterEnqueue, pointAfterClaim, pointAfterAccept, pointAfterAck} {
		for _, target := range targets {
			t.Run(point+"/"+strings.ReplaceAll(target, "/", "-"), func(t *testing.T) {
				t.Parallel() // each case has its own directory and processes
				runCrashCase(ctx, t, point, target)
			})
		}
	}
}

// crashConfig is what the parent hands the child.
type crashConfig struct {
	dir, server, modelLog, point, target string
}

func (c crashConfig) env() []string {
	return append(os.Environ(),
		envCrashDir+"="+c.dir, envCrashServer+"="+c.server, envCrashModelLog+"="+c.modelLog,
		envCrashPoint+"="+c.point, envCrashTarget+"="+c.target)
}

func runCrashCase(ctx context.Context, t *testing.T, point, target string) {
	tmp := t.TempDir()
	cfg := crashConfig{
		dir:      filepath.Join(tmp, "data"),
		server:   filepath.Join(tmp, "homeserver.jsonl"),
		modelLog: filepath.Join(tmp, "model-calls.log"),
		point:    point,
		target:   target,
	}

	// First run: killed at the point.
	c := startCrashChild(t, cfg)
	c.WaitFor(ctx, t, "AT "+point)
	c.Kill(t)

	atKill := inspectAtKill(ctx, t, cfg)
	checkStateAtKill(t, cfg, atKill)

	// Second run: recovers and finishes.
	restart := cfg
	restart.point, restart.target = "", ""
	c = startCrashChild(t, restart)
	c.WaitFor(ctx, t, "DONE")
	c.Exit(t)

	checkFinished(ctx, t, cfg, atKill)
}

// killState is what the kill left behind.
type killState struct {
	target       journal.Delivery
	targetExists bool
	// finalExists and sourcePending describe the target's turn.
	finalExists   bool
	sourcePending bool
	onServer      map[string]serverRecord // by delivery/stage
	recorded      map[string]bool         // turns with a durable result
	modelCalls    map[string]int
	serverCount   int
}

func inspectAtKill(ctx context.Context, t *testing.T, cfg crashConfig) killState {
	t.Helper()
	s, err := store.Open(ctx, store.Options{StorageDir: cfg.dir})
	if err != nil {
		t.Fatalf("reopen journal after the kill: %v", err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Errorf("close journal: %v", err)
		}
	}()
	v, err := s.Principal(ctx, crashAgent, crashUser)
	if err != nil {
		t.Fatalf("Principal: %v", err)
	}
	id, stage, _ := strings.Cut(cfg.target, "/")
	st := journal.StageFinal
	if stage == "initial" {
		st = journal.StageInitial
	}
	var ks killState
	ks.target, err = v.Delivery(ctx, id, st)
	if err != nil && !errors.Is(err, journal.ErrNoDelivery) {
		t.Fatalf("target %s after the kill: %v", cfg.target, err)
	}
	ks.targetExists = err == nil
	_, err = v.Delivery(ctx, id, journal.StageFinal)
	if err != nil && !errors.Is(err, journal.ErrNoDelivery) {
		t.Fatalf("final of %s after the kill: %v", id, err)
	}
	ks.finalExists = err == nil
	var turn int
	if _, err := fmt.Sscanf(id, "turn-%d", &turn); err != nil {
		t.Fatalf("target %s: %v", cfg.target, err)
	}
	page, err := v.Pending(ctx, 100, 0)
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	for _, ev := range page.Events {
		ks.sourcePending = ks.sourcePending || ev.EventID == crashSourceID(turn)
	}
	records := readServer(t, cfg.server)
	ks.serverCount = len(records)
	ks.onServer = map[string]serverRecord{}
	for _, r := range records {
		ks.onServer[r.key(t)] = r
	}
	turns, err := v.Turns(ctx, 100, "")
	if err != nil {
		t.Fatalf("Turns: %v", err)
	}
	ks.recorded = map[string]bool{}
	for _, tr := range turns {
		ks.recorded[tr.TurnID] = true
		if tr.TurnID == id && tr.State != journal.TurnResultRecorded && cfg.point == pointAfterRecord {
			t.Errorf("at %s: %s is %v, want result recorded", cfg.point, id, tr.State)
		}
	}
	ks.modelCalls = readModelCalls(t, cfg.modelLog)
	return ks
}

// checkStateAtKill proves the kill landed where its name says.
func checkStateAtKill(t *testing.T, cfg crashConfig, ks killState) {
	t.Helper()
	for turn, n := range ks.modelCalls {
		if n != 1 || !ks.recorded[turn] {
			t.Errorf("at the kill %s had %d model calls, recorded %v: the kill landed between a model call and its record",
				turn, n, ks.recorded[turn])
		}
	}
	if cfg.point == pointAfterRecord {
		// The result is durable, its final not enqueued, its source still
		// pending: recovery must enqueue the final without the model.
		turnID, _, _ := strings.Cut(cfg.target, "/")
		if !ks.recorded[turnID] || ks.finalExists || !ks.sourcePending {
			t.Errorf("at %s: %s recorded %v, final enqueued %v, source pending %v; want true, false, true",
				cfg.point, turnID, ks.recorded[turnID], ks.finalExists, ks.sourcePending)
		}
		return
	}
	want := map[string]struct {
		state    journal.DeliveryState
		onServer bool
	}{
		pointAfterEnqueue: {journal.DeliveryQueued, false},
		pointAfterClaim:   {journal.DeliveryAttempted, false},
		pointAfterAccept:  {journal.DeliveryAttempted, true},
		pointAfterAck:     {journal.DeliveryAcknowledged, true},
	}[cfg.point]
	_, onServer := ks.onServer[cfg.target]
	if !ks.targetExists || ks.target.State != want.state || onServer != want.onServer {
		t.Errorf("at %s: %s exists %v, is %v, on the server %v; want %v, on the server %v",
			cfg.point, cfg.target, ks.targetExists, ks.target.State, onServer, want.state, want.onServer)
	}
}

func checkFinished(ctx context.Context, t *testing.T, cfg crashConfig, atKill killState) {
	t.Helper()
	records := readServer(t, cfg.server)
	byStage := map[string][]serverRecord{}
	for _, r := range records {
		byStage[r.key(t)] = append(byStage[r.key(t)], r)
	}
	want := map[string]bool{}
	for i := range crashTurns {
		want[stageKey(crashTurnID(i), "final")] = true
		if crashHasInitial(i) {
			want[stageKey(crashTurnID(i), "initial")] = true
		}
	}
	for k, rs := range byStage {
		if !want[k] {
			t.Errorf("server has %d unexpected message(s) for %s", len(rs), k)
		}
	}
	perStage := map[string]int{}
	for k := range want {
		if got := len(byStage[k]); got != 1 {
			t.Errorf("server has %d messages for %s, want exactly 1", got, k)
		}
		_, stage, _ := strings.Cut(k, "/")
		perStage[stage] += len(byStage[k])
	}

	s, err := store.Open(ctx, store.Options{StorageDir: cfg.dir})
	if err != nil {
		t.Fatalf("reopen journal: %v", err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Errorf("close journal: %v", err)
		}
	}()
	v, err := s.Principal(ctx, crashAgent, crashUser)
	if err != nil {
		t.Fatalf("Principal: %v", err)
	}
	for i := range crashTurns {
		turnID := crashTurnID(i)
		final := firstRecord(byStage[stageKey(turnID, "final")])
		tr, ok, err := v.Turn(ctx, turnID)
		if err != nil || !ok {
			t.Errorf("Turn(%s) = %v, %v", turnID, ok, err)
			continue
		}
		if tr.State != journal.TurnDelivered || tr.EventID != final.EventID {
			t.Errorf("%s = %v %q, want %v with the server's %q", turnID, tr.State, tr.EventID, journal.TurnDelivered, final.EventID)
		}
		stages := []journal.Stage{journal.StageFinal}
		if crashHasInitial(i) {
			stages = append(stages, journal.StageInitial)
		}
		for _, st := range stages {
			d, err := v.Delivery(ctx, turnID, st)
			if err != nil {
				t.Errorf("Delivery(%s/%s): %v", turnID, st, err)
				continue
			}
			onServer := firstRecord(byStage[stageKey(turnID, st.String())])
			if d.State != journal.DeliveryAcknowledged || d.EventID != onServer.EventID {
				t.Errorf("%s/%s = %v %q, want %v with the server's %q", turnID, st, d.State, d.EventID, journal.DeliveryAcknowledged, onServer.EventID)
			}
		}
		// The final edits its placeholder exactly when there is one.
		var c struct {
			RelatesTo struct {
				RelType string `json:"rel_type"`
				EventID string `json:"event_id"`
			} `json:"m.relates_to"`
			Body       string `json:"body"`
			NewContent struct {
				Body string `json:"body"`
			} `json:"m.new_content"`
		}
		if err := json.Unmarshal(final.Content, &c); err != nil {
			t.Errorf("%s final content: %v", turnID, err)
			continue
		}
		body := c.Body
		if crashHasInitial(i) {
			initial := firstRecord(byStage[stageKey(turnID, "initial")])
			if c.RelatesTo.RelType != "m.replace" || c.RelatesTo.EventID != initial.EventID {
				t.Errorf("%s final relates to %+v, want an m.replace of the initial %q", turnID, c.RelatesTo, initial.EventID)
			}
			body = c.NewContent.Body
		} else if c.RelatesTo.RelType != "" {
			t.Errorf("%s final relates to %+v, want a plain message", turnID, c.RelatesTo)
		}
		if want := crashAnswer(i); body != want {
			t.Errorf("%s final body = %q, want %q", turnID, body, want)
		}
	}

	calls := readModelCalls(t, cfg.modelLog)
	perTurn := make([]int, crashTurns)
	for i := range crashTurns {
		perTurn[i] = calls[crashTurnID(i)]
		if perTurn[i] != 1 {
			t.Errorf("%s: %d model calls, want exactly 1 (recorded before the kill: %v)", crashTurnID(i), perTurn[i], atKill.recorded[crashTurnID(i)])
		}
	}
	targetState := "absent"
	if atKill.targetExists {
		targetState = atKill.target.State.String()
	}
	t.Logf("%-13s %-15s | at kill: target %-12s, %d on server, %d turns recorded | after restart: initial msgs %d, final msgs %d, model calls per turn %v",
		cfg.point, cfg.target, targetState, atKill.serverCount, len(atKill.recorded), perStage["initial"], perStage["final"], perTurn)
}

func firstRecord(rs []serverRecord) serverRecord {
	if len(rs) == 0 {
		return serverRecord{}
	}
	return rs[0]
}

// startCrashChild runs the child process on cfg.
func startCrashChild(t *testing.T, cfg crashConfig) *crash.Process {
	t.Helper()
	return crash.StartProcess(t, cfg.env(), "-test.run=^TestCrashMatrixChild$", "-test.count=1")
}

// TestCrashMatrixChild is the child process of TestCrashMatrix. Run
// directly, without the crash environment, it has nothing to do.
func TestCrashMatrixChild(t *testing.T) {
	cfg := crashConfig{
		dir: os.Getenv(envCrashDir), server: os.Getenv(envCrashServer), modelLog: os.Getenv(envCrashModelLog),
		point: os.Getenv(envCrashPoint), target: os.Getenv(envCrashTarget),
	}
	if cfg.dir == "" {
		return // not a child of TestCrashMatrix
	}
	ctx, cancel := context.WithTimeout(context.Background(), childDeadline)
	defer cancel()
	if err := runCrashChild(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// crashChildRun is the child's state.
type crashChildRun struct {
	cfg    crashConfig
	v      journal.PrincipalStore
	models *os.File
	// modelMu is held from a model call until its result is durable, and
	// forever by a halted child: a kill never lands between the two, where
	// losing the unrecorded result would rightly cost a second call.
	modelMu  sync.Mutex
	progress chan struct{}
}

func runCrashChild(ctx context.Context, cfg crashConfig) (err error) {
	s, err := store.Open(ctx, store.Options{StorageDir: cfg.dir})
	if err != nil {
		return fmt.Errorf("open journal: %w", err)
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	v, err := s.Principal(ctx, crashAgent, crashUser)
	if err != nil {
		return err
	}
	if err := admitCrashSources(ctx, v); err != nil {
		return err
	}
	srv, err := openRecordingServer(cfg.server)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, srv.Close()) }()
	models, err := os.OpenFile(cfg.modelLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, models.Close()) }()

	r := &crashChildRun{cfg: cfg, v: v, models: models, progress: make(chan struct{}, 1)}
	var ob journal.Outbox = v
	if cfg.point == pointAfterEnqueue {
		ob = claimGate{Outbox: v, hold: cfg.target, until: ctx}
	}
	system := actors.NewSystem(zerolog.Nop())
	sub := s.Hints().Subscribe(v.Principal().String())
	pid := system.Root.Spawn(outbox.Props(outbox.Deps{
		Outbox: ob, Sender: srv, DeviceID: crashDevice, Hints: sub,
		BackoffBase: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		Log: zerolog.Nop(), Observe: r.observe(ctx),
	}))
	defer func() {
		err = errors.Join(err, system.Root.StopFuture(pid).Wait())
		sub.Close()
	}()

	if err := r.runTurns(ctx); err != nil {
		return err
	}
	for {
		done, err := crashWorkDone(ctx, v)
		if err != nil {
			return err
		}
		if done {
			break
		}
		select {
		case <-r.progress:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the deliveries: %w", ctx.Err())
		}
	}
	fmt.Fprintln(os.Stdout, "DONE")
	return nil
}

func admitCrashSources(ctx context.Context, v journal.PrincipalStore) error {
	tok, err := v.SyncToken(ctx)
	if err != nil || tok == crashSourceToken {
		return err
	}
	evs := make([]mx.Ev, crashTurns)
	for i := range evs {
		evs[i] = mx.Message(crashSourceID(i), alice, int64(1000+i), fmt.Sprintf("question %d", i))
	}
	_, err = v.AdmitBatch(ctx, mx.Live(room, evs...), crashSourceToken)
	return err
}

// halt announces the kill point and waits to be killed.
func (r *crashChildRun) halt(ctx context.Context) {
	r.modelMu.Lock()
	fmt.Fprintf(os.Stdout, "AT %s\n", r.cfg.point)
	<-ctx.Done()
}

func (r *crashChildRun) observe(ctx context.Context) func(outbox.Point, journal.Delivery) {
	points := map[outbox.Point]string{
		outbox.Claimed: pointAfterClaim, outbox.Accepted: pointAfterAccept, outbox.Acknowledged: pointAfterAck,
	}
	return func(p outbox.Point, d journal.Delivery) {
		if points[p] == r.cfg.point && stageKey(d.DeliveryID, d.Stage.String()) == r.cfg.target {
			r.halt(ctx)
		}
		if p == outbox.Acknowledged {
			select {
			case r.progress <- struct{}{}:
			default:
			}
		}
	}
}

// runTurns answers every pending source. A source whose turn result is
// already durable only has its final enqueued: recovery never reruns a
// finished model call.
func (r *crashChildRun) runTurns(ctx context.Context) error {
	var after int64
	for {
		page, err := r.v.Pending(ctx, 100, after)
		if err != nil {
			return err
		}
		if len(page.Unreadable) > 0 {
			return fmt.Errorf("unreadable pending rows: %v", page.Unreadable)
		}
		for _, ev := range page.Events {
			if err := r.runTurn(ctx, ev); err != nil {
				return err
			}
		}
		if !page.More {
			return nil
		}
		after = page.Next
	}
}

func (r *crashChildRun) runTurn(ctx context.Context, ev journal.PendingEvent) error {
	var i int
	if _, err := fmt.Sscanf(ev.EventID, "$src-%d", &i); err != nil {
		return fmt.Errorf("pending %s: %w", ev.EventID, err)
	}
	turnID := crashTurnID(i)
	rec, ok, err := r.v.TurnForEvent(ctx, ev.EventID)
	if err != nil {
		return err
	}
	switch {
	case ok && rec.State != journal.TurnResultRecorded:
		return fmt.Errorf("%s is %v while its source is pending", turnID, rec.State)
	case !ok:
		if crashHasInitial(i) {
			if err := r.enqueue(ctx, journal.EnqueueRequest{
				DeliveryID: turnID, Stage: journal.StageInitial, RoomID: room, Content: text("thinking…"),
			}); err != nil {
				return err
			}
		}
		if rec, err = r.callModel(ctx, i, ev.EventID); err != nil {
			return err
		}
		if target, _, _ := strings.Cut(r.cfg.target, "/"); r.cfg.point == pointAfterRecord && target == turnID {
			r.halt(ctx)
		}
	}
	var result struct{ Answer string }
	if err := json.Unmarshal(rec.Record, &result); err != nil {
		return fmt.Errorf("%s record: %w", turnID, err)
	}
	return r.enqueue(ctx, journal.EnqueueRequest{
		DeliveryID: turnID, Stage: journal.StageFinal, RoomID: room, TurnID: turnID,
		Content: text(result.Answer), Sources: []string{ev.EventID},
	})
}

// callModel "calls the model", logging the call durably, and makes the
// result durable as a turn record.
func (r *crashChildRun) callModel(ctx context.Context, i int, source string) (journal.TurnRecord, error) {
	r.modelMu.Lock()
	defer r.modelMu.Unlock()
	turnID := crashTurnID(i)
	if _, err := fmt.Fprintf(r.models, "MODEL %s\n", turnID); err != nil {
		return journal.TurnRecord{}, err
	}
	if err := r.models.Sync(); err != nil {
		return journal.TurnRecord{}, err
	}
	record, _ := json.Marshal(map[string]string{"answer": crashAnswer(i)})
	rec := journal.TurnRecord{
		TurnID: turnID, RoomID: room, State: journal.TurnResultRecorded, Sources: []string{source}, Record: record,
	}
	return rec, r.v.UpsertTurn(ctx, rec)
}

func (r *crashChildRun) enqueue(ctx context.Context, req journal.EnqueueRequest) error {
	if _, err := r.v.EnqueueAndSettle(ctx, req); err != nil {
		return fmt.Errorf("enqueue %s/%s: %w", req.DeliveryID, req.Stage, err)
	}
	if r.cfg.point == pointAfterEnqueue && stageKey(req.DeliveryID, req.Stage.String()) == r.cfg.target {
		r.halt(ctx)
	}
	return nil
}

// claimGate holds the claim of one delivery stage until the child is
// killed, so "after-enqueue" finds the row enqueued and unclaimed.
type claimGate struct {
	journal.Outbox
	hold  string
	until context.Context
}

func (g claimGate) Claim(ctx context.Context, deliveryID string, stage journal.Stage, deviceID string) (journal.Delivery, error) {
	if stageKey(deliveryID, stage.String()) == g.hold {
		<-g.until.Done()
		return journal.Delivery{}, g.until.Err()
	}
	return g.Outbox.Claim(ctx, deliveryID, stage, deviceID)
}

// crashWorkDone reports whether every source is settled, every delivery
// acknowledged and every turn delivered.
func crashWorkDone(ctx context.Context, v journal.PrincipalStore) (bool, error) {
	page, err := v.Pending(ctx, 1, 0)
	if err != nil || len(page.Events)+len(page.Unreadable) > 0 {
		return false, err
	}
	rows, err := v.Unacknowledged(ctx, 1, nil)
	if err != nil || len(rows) > 0 {
		return false, err
	}
	for i := range crashTurns {
		tr, ok, err := v.Turn(ctx, crashTurnID(i))
		if err != nil || !ok || tr.State != journal.TurnDelivered {
			return false, err
		}
	}
	return true, nil
}

// readModelCalls counts the MODEL lines per turn.
func readModelCalls(t *testing.T, path string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("read model log: %v", err)
	}
	calls := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if turn, ok := strings.CutPrefix(line, "MODEL "); ok {
			calls[turn]++
		} else if line != "" {
			t.Fatalf("model log line %q", line)
		}
	}
	return calls
}

// serverRecord is one event the recording homeserver accepted.
type serverRecord struct {
	Device  string          `json:"device"`
	TxnID   string          `json:"txn_id"`
	EventID string          `json:"event_id"`
	Content json.RawMessage `json:"content"`
}

// key names the message by the delivery marker in its content, as the
// homeserver sees it.
func (r serverRecord) key(t *testing.T) string {
	t.Helper()
	var c map[string]json.RawMessage
	var marker struct {
		DeliveryID string `json:"delivery_id"`
		Stage      string `json:"stage"`
	}
	if err := json.Unmarshal(r.Content, &c); err != nil {
		t.Fatalf("server event %s content: %v", r.EventID, err)
	}
	if err := json.Unmarshal(c[journal.DeliveryKey], &marker); err != nil {
		t.Fatalf("server event %s has no delivery marker: %v", r.EventID, err)
	}
	return stageKey(marker.DeliveryID, marker.Stage)
}

func readServer(t *testing.T, path string) []serverRecord {
	t.Helper()
	records, _, err := loadServerRecords(path)
	if err != nil {
		t.Fatalf("read recording homeserver: %v", err)
	}
	return records
}

// loadServerRecords reads the server's append-only file. It also returns
// the length of its whole lines: a line torn by the kill was never
// answered, so the server never accepted it.
func loadServerRecords(path string) ([]serverRecord, int64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	whole := bytes.LastIndexByte(b, '\n') + 1
	var out []serverRecord
	for _, line := range bytes.Split(b[:whole], []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var r serverRecord
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, 0, fmt.Errorf("server line %q: %w", line, err)
		}
		out = append(out, r)
	}
	return out, int64(whole), nil
}

// crashServerEpochMS is where the crash server's clock starts: its n-th
// recorded event carries this plus n.
const crashServerEpochMS = 1_700_000_000_000

// recordingServer is a homeserver stand-in for the crash child: it accepts
// a send by appending it to a file, fsynced before it answers, and
// deduplicates transaction IDs per device across restarts, the device being
// the one the child is signed in as.
type recordingServer struct {
	mu     sync.Mutex
	f      *os.File
	device string
	byTxn  map[string]string // device + txn -> event ID
	events int               // records so far: the server's clock
}

func openRecordingServer(path string) (*recordingServer, error) {
	records, whole, err := loadServerRecords(path)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(whole); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	if _, err := f.Seek(whole, io.SeekStart); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	s := &recordingServer{f: f, device: crashDevice, byTxn: make(map[string]string), events: len(records)}
	for _, r := range records {
		s.byTxn[r.Device+"\x00"+r.TxnID] = r.EventID
	}
	return s, nil
}

// Send implements outbox.Sender.
func (s *recordingServer) Send(ctx context.Context, d journal.Delivery, content json.RawMessage) (journal.Sent, error) {
	if err := ctx.Err(); err != nil {
		return journal.Sent{}, &journal.SendError{Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.device + "\x00" + d.TxnID
	if id, ok := s.byTxn[k]; ok {
		return journal.Sent{EventID: id}, nil // its timestamp unknown: the echo orders it
	}
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return journal.Sent{}, err
	}
	r := serverRecord{Device: s.device, TxnID: d.TxnID, EventID: "$" + hex.EncodeToString(rnd[:]) + ":crash.example.org", Content: content}
	line, err := json.Marshal(r)
	if err != nil {
		return journal.Sent{}, &journal.SendError{Status: 400, Err: err}
	}
	if _, err := s.f.Write(append(line, '\n')); err != nil {
		return journal.Sent{}, &journal.SendError{Status: 500, Err: err}
	}
	if err := s.f.Sync(); err != nil {
		return journal.Sent{}, &journal.SendError{Status: 500, Err: err}
	}
	s.byTxn[k] = r.EventID
	s.events++
	return journal.Sent{EventID: r.EventID, ServerTS: crashServerEpochMS + int64(s.events)}, nil
}

// Close closes the server's file.
func (s *recordingServer) Close() error { return s.f.Close() }
