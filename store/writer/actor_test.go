package writer_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/mattn/go-sqlite3"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store/writer"
)

// testDeadline bounds every wait in these tests, so a deadlock fails the
// test instead of hanging it. It is generous: the race detector and fsync
// storms on a small machine are slow, but never this slow.
const testDeadline = 60 * time.Second

// harness is a writer actor over a real on-disk journal file with a small
// scratch table the test commands write to.
type harness struct {
	t      *testing.T
	ctx    context.Context
	db     *sqlitefs.DB
	root   *actor.RootContext
	pid    *actor.PID
	done   chan struct{} // closed by OnStopped
	stopMu sync.Mutex
	stop   error // OnStopped's argument
	hints  chan []hint.Hint
}

type harnessOptions struct {
	maxBatch, maxBatchBytes int
	// publish, when set, runs inside Publish before the hints are handed to
	// the test.
	publish func([]hint.Hint)
	// busyTimeout, when set, runs the writer on a pool of its own over the
	// same file whose connection waits this long for another connection's
	// lock, instead of the journal's ten seconds.
	busyTimeout time.Duration
	// onBusy and closing are the writer's Deps.OnBusy and Deps.Closing.
	onBusy  func(waited time.Duration)
	closing <-chan struct{}
}

func newHarness(t *testing.T, o harnessOptions) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	t.Cleanup(cancel)
	db, err := sqlitefs.Open(ctx, sqlitefs.Options{StorageDir: t.TempDir()})
	if err != nil {
		t.Fatalf("open journal file: %v", err)
	}
	if _, err := db.WriterPool().ExecContext(ctx, `CREATE TABLE scratch (k TEXT PRIMARY KEY)`); err != nil {
		t.Fatalf("create scratch table: %v", err)
	}
	writerDB := db.WriterPool()
	if o.busyTimeout > 0 {
		q := url.Values{"_txlock": {"immediate"}, "_busy_timeout": {fmt.Sprint(o.busyTimeout.Milliseconds())}}
		if writerDB, err = sql.Open("sqlite3", (&url.URL{Scheme: "file", Path: db.Path, RawQuery: q.Encode()}).String()); err != nil {
			t.Fatalf("open writer pool: %v", err)
		}
		writerDB.SetMaxOpenConns(1)
	}
	system := actors.NewSystem(zerolog.Nop())
	h := &harness{
		t: t, ctx: ctx, db: db, root: system.Root,
		done:  make(chan struct{}),
		hints: make(chan []hint.Hint, 64),
	}
	h.pid = system.Root.Spawn(writer.Props(writer.Deps{
		DB:      writerDB,
		Log:     zerolog.Nop(),
		IsFatal: sqlitefs.IsFatal,
		IsBusy:  sqlitefs.IsBusy,
		OnBusy:  o.onBusy,
		Closing: o.closing,
		Publish: func(hs []hint.Hint) {
			if o.publish != nil {
				o.publish(hs)
			}
			h.hints <- slices.Clone(hs)
		},
		OnStopped: func(err error) {
			h.stopMu.Lock()
			h.stop = err
			h.stopMu.Unlock()
			close(h.done)
		},
		MaxBatch:      o.maxBatch,
		MaxBatchBytes: o.maxBatchBytes,
	}))
	t.Cleanup(func() {
		select {
		case <-h.done:
		default:
			h.root.Poison(h.pid)
			select {
			case <-h.done:
			case <-time.After(testDeadline):
				t.Errorf("writer did not stop after Poison")
			}
		}
		if writerDB != db.WriterPool() {
			if err := writerDB.Close(); err != nil {
				t.Errorf("close writer pool: %v", err)
			}
		}
		if err := db.Close(); err != nil {
			t.Errorf("close journal file: %v", err)
		}
	})
	return h
}

// mustBeRunning fails t if the writer has stopped, after what.
func (h *harness) mustBeRunning(t *testing.T, after string) {
	t.Helper()
	select {
	case <-h.done:
		t.Fatalf("writer stopped after %s: %v", after, h.stopErr())
	default:
	}
}

// stopErr waits for the writer to stop and returns OnStopped's argument.
func (h *harness) stopErr() error {
	h.t.Helper()
	select {
	case <-h.done:
	case <-h.ctx.Done():
		h.t.Fatalf("writer did not stop: %v", h.ctx.Err())
	}
	h.stopMu.Lock()
	defer h.stopMu.Unlock()
	return h.stop
}

// send queues cmd in the writer's mailbox now (root.Send is synchronous
// enqueueing) and returns the channel its reply will arrive on.
func (h *harness) send(name string, run writer.Command) <-chan *writer.Executed {
	reply := make(chan *writer.Executed, 1)
	h.root.Send(h.pid, &writer.Execute{Name: name, Run: run, Reply: reply})
	return reply
}

// await returns the reply on ch or fails the test at the deadline.
func (h *harness) await(name string, ch <-chan *writer.Executed) *writer.Executed {
	h.t.Helper()
	select {
	case r := <-ch:
		return r
	case <-h.ctx.Done():
		h.t.Fatalf("no reply to %s: %v", name, h.ctx.Err())
		return nil
	}
}

// gate queues a command that holds the writer inside its own batch until
// the returned release is called. When gate returns, the writer is inside
// that command, so everything sent afterwards waits in the mailbox and joins
// one later batch.
func (h *harness) gate() (release func(), reply <-chan *writer.Executed) {
	h.t.Helper()
	started, hold := make(chan struct{}), make(chan struct{})
	reply = h.send("gate", func(tx *writer.Tx) (any, error) {
		close(started)
		<-hold
		return tx, nil
	})
	select {
	case <-started:
	case <-h.ctx.Done():
		h.t.Fatalf("gate command never ran: %v", h.ctx.Err())
	}
	var once sync.Once
	release = func() { once.Do(func() { close(hold) }) }
	h.t.Cleanup(release)
	return release, reply
}

// present reports whether the scratch row k is visible to a reader, that
// is, committed.
func (h *harness) present(k string) bool {
	h.t.Helper()
	var n int
	if err := h.db.QueryPool().QueryRowContext(h.ctx, `SELECT count(*) FROM scratch WHERE k = ?`, k).Scan(&n); err != nil {
		h.t.Fatalf("read scratch row %q: %v", k, err)
	}
	return n == 1
}

func (h *harness) rowCount() int {
	h.t.Helper()
	var n int
	if err := h.db.QueryPool().QueryRowContext(h.ctx, `SELECT count(*) FROM scratch`).Scan(&n); err != nil {
		h.t.Fatalf("count scratch rows: %v", err)
	}
	return n
}

// insert is a command writing scratch row k. Its result is the batch's
// *writer.Tx: the writer creates one per transaction, and holding it in the
// result keeps it alive, so equal pointers mean a shared commit.
func insert(k string) writer.Command {
	return func(tx *writer.Tx) (any, error) {
		_, err := tx.Exec(`INSERT INTO scratch (k) VALUES (?)`, k)
		return tx, err
	}
}

func txOf(t *testing.T, name string, r *writer.Executed) *writer.Tx {
	t.Helper()
	tx, ok := r.Result.(*writer.Tx)
	if !ok {
		t.Fatalf("%s: result %T (err %v), want *writer.Tx", name, r.Result, r.Err)
	}
	return tx
}

func TestWriterFailingCommandRollsBackAloneInSharedBatch(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	release, gateReply := h.gate()

	errB := errors.New("command B refuses")
	a := h.send("A", insert("a"))
	b := h.send("B", func(tx *writer.Tx) (any, error) {
		if _, err := tx.Exec(`INSERT INTO scratch (k) VALUES ('b')`); err != nil {
			return nil, err
		}
		return tx, errB
	})
	c := h.send("C", insert("c"))
	release()

	gateTx := txOf(t, "gate", h.await("gate", gateReply))
	ra, rb, rc := h.await("A", a), h.await("B", b), h.await("C", c)
	if ra.Err != nil || rc.Err != nil {
		t.Fatalf("A, C errors: got %v, %v, want nil, nil", ra.Err, rc.Err)
	}
	if !errors.Is(rb.Err, errB) {
		t.Fatalf("B error: got %v, want %v", rb.Err, errB)
	}
	txA, txB, txC := txOf(t, "A", ra), txOf(t, "B", rb), txOf(t, "C", rc)
	if txA != txB || txB != txC {
		t.Fatalf("A, B, C ran in different transactions (%p, %p, %p); the test needs one batch", txA, txB, txC)
	}
	if txA == gateTx {
		t.Fatalf("A joined the gate's batch; want a later batch")
	}
	for k, want := range map[string]bool{"a": true, "b": false, "c": true} {
		if got := h.present(k); got != want {
			t.Errorf("row %q committed: got %v, want %v", k, got, want)
		}
	}
}

func TestWriterConcurrentSendersAllGetRepliesWithoutDeadlock(t *testing.T) {
	const senders, perSender = 256, 16
	h := newHarness(t, harnessOptions{})
	var (
		wg      sync.WaitGroup
		errs    = make(chan error, senders)
		mu      sync.Mutex
		batches = make(map[*writer.Tx]int)
	)
	for s := 0; s < senders; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perSender; i++ {
				k := fmt.Sprintf("s%d-%d", s, i)
				res, err := writer.Request(h.ctx, h.root, h.pid, &writer.Execute{Name: k, Run: insert(k)}, h.done)
				if err != nil {
					errs <- fmt.Errorf("%s: %w", k, err)
					return
				}
				mu.Lock()
				batches[res.(*writer.Tx)]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	if got, want := h.rowCount(), senders*perSender; got != want {
		t.Fatalf("committed rows: got %d, want %d", got, want)
	}
	for s := 0; s < senders; s++ {
		for i := 0; i < perSender; i++ {
			if k := fmt.Sprintf("s%d-%d", s, i); !h.present(k) {
				t.Fatalf("row %q missing", k)
			}
		}
	}
	largest := 0
	for _, n := range batches {
		largest = max(largest, n)
	}
	t.Logf("%d commands in %d commits, largest batch %d", senders*perSender, len(batches), largest)
}

func TestWriterReplyArrivesOnlyAfterReaderSeesCommit(t *testing.T) {
	const senders, perSender = 32, 8
	h := newHarness(t, harnessOptions{})
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for s := 0; s < senders; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perSender; i++ {
				k := fmt.Sprintf("s%d-%d", s, i)
				if _, err := writer.Request(h.ctx, h.root, h.pid, &writer.Execute{Name: k, Run: insert(k)}, h.done); err != nil {
					errs <- fmt.Errorf("%s: %w", k, err)
					return
				}
				var n int
				if err := h.db.QueryPool().QueryRowContext(h.ctx, `SELECT count(*) FROM scratch WHERE k = ?`, k).Scan(&n); err != nil {
					errs <- fmt.Errorf("read %s: %w", k, err)
					return
				}
				if n != 1 {
					errs <- fmt.Errorf("replied to %s before a reader could see its row", k)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestWriterRepliesToNoCommandBeforeItsWholeBatchCommits(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	release, _ := h.gate()

	a := h.send("A", insert("a"))
	b := h.send("B", insert("b"))
	lastStarted, lastHold := make(chan struct{}), make(chan struct{})
	var seenInside struct {
		replies  int
		aVisible bool
		readErr  error
	}
	last := h.send("last", func(tx *writer.Tx) (any, error) {
		// Running on the writer: A and B ran before this command in the same
		// transaction, and no reply may have gone out yet.
		seenInside.replies = len(a) + len(b)
		var n int
		seenInside.readErr = h.db.QueryPool().QueryRowContext(h.ctx, `SELECT count(*) FROM scratch WHERE k = 'a'`).Scan(&n)
		seenInside.aVisible = n > 0
		close(lastStarted)
		<-lastHold
		_, err := tx.Exec(`INSERT INTO scratch (k) VALUES ('last')`)
		return tx, err
	})
	release()
	select {
	case <-lastStarted:
	case <-h.ctx.Done():
		t.Fatalf("last command never ran: %v", h.ctx.Err())
	}
	// The writer is parked inside the batch: still no reply to A or B.
	if got := len(a) + len(b); got != 0 {
		t.Fatalf("replies while the batch is still open: got %d, want 0", got)
	}
	close(lastHold)
	ra, rb, rl := h.await("A", a), h.await("B", b), h.await("last", last)

	if seenInside.readErr != nil {
		t.Fatalf("reader inside batch: %v", seenInside.readErr)
	}
	if seenInside.replies != 0 {
		t.Errorf("replies sent before the batch's last command ran: got %d, want 0", seenInside.replies)
	}
	if seenInside.aVisible {
		t.Errorf("a reader saw A's row before the batch committed")
	}
	for name, r := range map[string]*writer.Executed{"A": ra, "B": rb, "last": rl} {
		if r.Err != nil {
			t.Errorf("%s: got error %v, want nil", name, r.Err)
		}
	}
	if txA, txB, txL := txOf(t, "A", ra), txOf(t, "B", rb), txOf(t, "last", rl); txA != txB || txB != txL {
		t.Fatalf("A, B, last ran in different transactions; the test needs one batch")
	}
	for _, k := range []string{"a", "b", "last"} {
		if !h.present(k) {
			t.Errorf("row %q not committed after its reply", k)
		}
	}
}

func TestWriterPanicFailsWholeBatchStopsAndLeavesFileUnlocked(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	release, gateReply := h.gate()

	a := h.send("A", func(tx *writer.Tx) (any, error) {
		_, err := tx.Exec(`INSERT INTO scratch (k) VALUES ('a')`)
		tx.Hint(hint.Hint{Principal: "p", Room: "a"})
		return nil, err
	})
	pStarted, pHold := make(chan struct{}), make(chan struct{})
	p := h.send("P", func(tx *writer.Tx) (any, error) {
		if _, err := tx.Exec(`INSERT INTO scratch (k) VALUES ('p')`); err != nil {
			return nil, err
		}
		close(pStarted)
		<-pHold
		panic("injected fault")
	})
	c := h.send("C", insert("c"))
	release()
	if r := h.await("gate", gateReply); r.Err != nil {
		t.Fatalf("gate: %v", r.Err)
	}
	select {
	case <-pStarted:
	case <-h.ctx.Done():
		t.Fatalf("panicking command never ran: %v", h.ctx.Err())
	}
	// Queued behind the failing batch: it must never run.
	behind := h.send("behind", insert("behind"))
	close(pHold)

	for _, tc := range []struct {
		name string
		ch   <-chan *writer.Executed
	}{{"A", a}, {"P", p}, {"C", c}} {
		r := h.await(tc.name, tc.ch)
		var fe *writer.FatalError
		if !errors.As(r.Err, &fe) {
			t.Errorf("%s: got error %v (%T), want *writer.FatalError", tc.name, r.Err, r.Err)
		}
	}
	stopErr := h.stopErr()
	if stopErr == nil {
		t.Fatalf("OnStopped: got nil, want the fault")
	}
	var fe *writer.FatalError
	if !errors.As(stopErr, &fe) {
		t.Errorf("OnStopped: got %v (%T), want *writer.FatalError", stopErr, stopErr)
	}

	// The writer has stopped, so whatever it published has been published.
	select {
	case hs := <-h.hints:
		t.Errorf("hints published from a failed batch: %v", hs)
	default:
	}
	select {
	case r := <-behind:
		if r.Err == nil {
			t.Errorf("command queued behind the failed batch: got success, want an error or no reply")
		}
	default:
	}

	// Later requests fail at once with ErrStopped.
	_, err := writer.Request(h.ctx, h.root, h.pid, &writer.Execute{Name: "later", Run: insert("later")}, h.done)
	if !errors.Is(err, writer.ErrStopped) {
		t.Errorf("request after the stop: got %v, want %v", err, writer.ErrStopped)
	}

	for _, k := range []string{"a", "p", "c", "behind", "later"} {
		if h.present(k) {
			t.Errorf("row %q committed by a failed or stopped writer", k)
		}
	}

	// A fresh connection, outside the writer's pool, can take the write lock
	// at once and write: the panic leaked no transaction.
	fresh, err := sql.Open("sqlite3", (&url.URL{Scheme: "file", Path: h.db.Path, RawQuery: "_txlock=immediate&_busy_timeout=2000"}).String())
	if err != nil {
		t.Fatalf("open fresh connection: %v", err)
	}
	defer fresh.Close()
	tx, err := fresh.BeginTx(h.ctx, nil)
	if err != nil {
		t.Fatalf("BEGIN IMMEDIATE on a fresh connection: %v", err)
	}
	if _, err := tx.ExecContext(h.ctx, `INSERT INTO scratch (k) VALUES ('fresh')`); err != nil {
		_ = tx.Rollback()
		t.Fatalf("write on a fresh connection: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit on a fresh connection: %v", err)
	}
	if !h.present("fresh") {
		t.Errorf("fresh connection's row not visible")
	}
}

func TestWriterOrderlyStopCommitsQueuedCommands(t *testing.T) {
	const queued = 10
	h := newHarness(t, harnessOptions{})
	release, _ := h.gate()
	replies := make([]<-chan *writer.Executed, queued)
	for i := range replies {
		replies[i] = h.send(fmt.Sprint(i), insert(fmt.Sprintf("q%d", i)))
	}
	// Poison is queued behind the commands, so they are drained first.
	stopped := h.root.PoisonFuture(h.pid)
	release()

	for i, ch := range replies {
		if r := h.await(fmt.Sprint(i), ch); r.Err != nil {
			t.Errorf("queued command %d: got %v, want nil", i, r.Err)
		}
	}
	if err := h.stopErr(); err != nil {
		t.Fatalf("OnStopped after an orderly stop: got %v, want nil", err)
	}
	if _, err := stopped.Result(); err != nil {
		t.Errorf("PoisonFuture: %v", err)
	}
	for i := range queued {
		if k := fmt.Sprintf("q%d", i); !h.present(k) {
			t.Errorf("row %q queued before the stop was not committed", k)
		}
	}
}

// batchSizes counts the commands of each transaction by *writer.Tx.
func batchSizes(t *testing.T, h *harness, names []string, replies []<-chan *writer.Executed) map[*writer.Tx]int {
	t.Helper()
	sizes := make(map[*writer.Tx]int)
	for i, ch := range replies {
		r := h.await(names[i], ch)
		if r.Err != nil {
			t.Fatalf("%s: %v", names[i], r.Err)
		}
		sizes[txOf(t, names[i], r)]++
	}
	return sizes
}

func TestWriterMaxBatchSplitsQueuedCommandsIntoSeveralCommits(t *testing.T) {
	const maxBatch, queued = 4, 20
	h := newHarness(t, harnessOptions{maxBatch: maxBatch})
	release, _ := h.gate()
	names := make([]string, queued)
	replies := make([]<-chan *writer.Executed, queued)
	for i := range replies {
		names[i] = fmt.Sprintf("q%d", i)
		replies[i] = h.send(names[i], insert(names[i]))
	}
	release()
	sizes := batchSizes(t, h, names, replies)
	if got, want := len(sizes), queued/maxBatch; got < want {
		t.Errorf("commits: got %d, want at least %d", got, want)
	}
	for _, n := range sizes {
		if n > maxBatch {
			t.Errorf("a commit held %d commands, want at most %d", n, maxBatch)
		}
	}
	if got := h.rowCount(); got != queued {
		t.Errorf("committed rows: got %d, want %d", got, queued)
	}
}

func TestWriterMaxBatchBytesClosesBatchOnceCapReached(t *testing.T) {
	const capBytes, cmdBytes, queued = 100, 40, 12
	h := newHarness(t, harnessOptions{maxBatchBytes: capBytes})
	release, _ := h.gate()
	names := make([]string, queued)
	replies := make([]<-chan *writer.Executed, queued)
	for i := range replies {
		names[i] = fmt.Sprintf("q%d", i)
		reply := make(chan *writer.Executed, 1)
		h.root.Send(h.pid, &writer.Execute{Name: names[i], Size: cmdBytes, Run: insert(names[i]), Reply: reply})
		replies[i] = reply
	}
	release()
	sizes := batchSizes(t, h, names, replies)
	// A batch closes as soon as its estimate reaches the cap: the command
	// that reaches it is the last one in.
	perBatch := (capBytes + cmdBytes - 1) / cmdBytes
	for _, n := range sizes {
		if n > perBatch {
			t.Errorf("a commit held %d commands of %d bytes, want at most %d under a %d-byte cap", n, cmdBytes, perBatch, capBytes)
		}
	}
	if got, want := len(sizes), (queued+perBatch-1)/perBatch; got < want {
		t.Errorf("commits: got %d, want at least %d", got, want)
	}
}

func TestWriterPublishesHintsAfterCommitWithoutRolledBackOnes(t *testing.T) {
	type publication struct {
		hints   []hint.Hint
		visible map[string]bool
	}
	var h *harness
	seen := make(chan publication, 16)
	h = newHarness(t, harnessOptions{publish: func(hs []hint.Hint) {
		// Runs on the writer, right after its commit.
		p := publication{hints: slices.Clone(hs), visible: make(map[string]bool)}
		for _, x := range hs {
			var n int
			err := h.db.QueryPool().QueryRow(`SELECT count(*) FROM scratch WHERE k = ?`, x.Room).Scan(&n)
			p.visible[x.Room] = err == nil && n == 1
		}
		seen <- p
	}})
	hinting := func(k string, fail error) writer.Command {
		return func(tx *writer.Tx) (any, error) {
			if _, err := tx.Exec(`INSERT INTO scratch (k) VALUES (?)`, k); err != nil {
				return nil, err
			}
			tx.Hint(hint.Hint{Principal: "p", Room: k, Position: 1})
			return tx, fail
		}
	}
	h.runABC(t, hinting)

	// Stopping the writer ends every Publish call, so the log below is
	// complete.
	h.root.Poison(h.pid)
	if err := h.stopErr(); err != nil {
		t.Fatalf("orderly stop: %v", err)
	}
	close(seen)
	var rooms []string
	for p := range seen {
		for _, x := range p.hints {
			rooms = append(rooms, x.Room)
			if !p.visible[x.Room] {
				t.Errorf("hint for %q published before a reader could see its commit", x.Room)
			}
		}
	}
	if want := []string{"a", "c"}; !slices.Equal(rooms, want) {
		t.Errorf("published hints: got rooms %v, want %v", rooms, want)
	}
}

// runABC sends commands A, B and C into one batch, B failing with an
// ordinary error, and waits for all three.
func (h *harness) runABC(t *testing.T, command func(k string, fail error) writer.Command) {
	t.Helper()
	release, _ := h.gate()
	errB := errors.New("B rolls back")
	a := h.send("A", command("a", nil))
	b := h.send("B", command("b", errB))
	c := h.send("C", command("c", nil))
	release()
	ra, rb, rc := h.await("A", a), h.await("B", b), h.await("C", c)
	if !errors.Is(rb.Err, errB) {
		t.Fatalf("B: got %v, want %v", rb.Err, errB)
	}
	if txOf(t, "A", ra) != txOf(t, "C", rc) || txOf(t, "A", ra) != txOf(t, "B", rb) {
		t.Fatalf("A, B, C ran in different transactions; the test needs one batch")
	}
}

func TestWriterPoisonedTransactionErrorFailsWholeBatchAndStops(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	release, _ := h.gate()
	diskFull := sqlite3.Error{Code: sqlite3.ErrFull}
	a := h.send("A", insert("a"))
	f := h.send("F", func(tx *writer.Tx) (any, error) {
		if _, err := tx.Exec(`INSERT INTO scratch (k) VALUES ('f')`); err != nil {
			return nil, err
		}
		return nil, diskFull
	})
	c := h.send("C", insert("c"))
	release()
	for _, tc := range []struct {
		name string
		ch   <-chan *writer.Executed
	}{{"A", a}, {"F", f}, {"C", c}} {
		r := h.await(tc.name, tc.ch)
		var fe *writer.FatalError
		if !errors.As(r.Err, &fe) {
			t.Errorf("%s: got error %v (%T), want *writer.FatalError", tc.name, r.Err, r.Err)
		}
		var se sqlite3.Error
		if !errors.As(r.Err, &se) || se.Code != sqlite3.ErrFull {
			t.Errorf("%s: got %v, want it to wrap SQLITE_FULL", tc.name, r.Err)
		}
	}
	if err := h.stopErr(); err == nil {
		t.Errorf("OnStopped: got nil, want the storage fault")
	}
	for _, k := range []string{"a", "f", "c"} {
		if h.present(k) {
			t.Errorf("row %q committed by a poisoned batch", k)
		}
	}
}

func TestWriterPanicAfterCommitStillStopsWithFault(t *testing.T) {
	h := newHarness(t, harnessOptions{publish: func([]hint.Hint) { panic("injected publish fault") }})
	r := h.await("A", h.send("A", func(tx *writer.Tx) (any, error) {
		_, err := tx.Exec(`INSERT INTO scratch (k) VALUES ('a')`)
		tx.Hint(hint.Hint{Principal: "p", Room: "a", Position: 1})
		return nil, err
	}))
	// A committed and was answered before the hints went out.
	if r.Err != nil {
		t.Fatalf("A: got %v, want nil", r.Err)
	}
	if !h.present("a") {
		t.Errorf("row %q answered but not committed", "a")
	}
	stopErr := h.stopErr()
	var fe *writer.FatalError
	if !errors.As(stopErr, &fe) {
		t.Fatalf("OnStopped: got %v (%T), want *writer.FatalError, not an orderly stop", stopErr, stopErr)
	}
	_, err := writer.Request(h.ctx, h.root, h.pid, &writer.Execute{Name: "later", Run: insert("later")}, h.done)
	if !errors.Is(err, writer.ErrStopped) {
		t.Errorf("request after the stop: got %v, want %v", err, writer.ErrStopped)
	}
}

// replyOrStop returns the reply on ch, failing t if the writer stopped
// without sending one.
func (h *harness) replyOrStop(t *testing.T, name string, ch <-chan *writer.Executed) *writer.Executed {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-h.done:
		select {
		case r := <-ch:
			return r
		default:
			t.Fatalf("%s: the writer stopped without answering it (%v)", name, h.stopErr())
		}
	case <-h.ctx.Done():
		t.Fatalf("no reply to %s: %v", name, h.ctx.Err())
	}
	return nil
}

func TestACommittedCommandIsAnsweredAsCommittedWhenAfterCommitWorkPanics(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	release, _ := h.gate()
	// A and B share one batch; A's after-commit work panics once it has
	// committed.
	a := h.send("A", func(tx *writer.Tx) (any, error) {
		tx.AfterCommit(func() { panic("injected after-commit fault") })
		_, err := tx.Exec(`INSERT INTO scratch (k) VALUES ('a')`)
		return tx, err
	})
	b := h.send("B", insert("b"))
	release()

	ra, rb := h.replyOrStop(t, "A", a), h.replyOrStop(t, "B", b)
	for name, r := range map[string]*writer.Executed{"A": ra, "B": rb} {
		if r.Err != nil {
			t.Errorf("%s: got %v, want nil: its batch committed", name, r.Err)
		}
	}
	if txOf(t, "A", ra) != txOf(t, "B", rb) {
		t.Fatalf("A and B ran in different transactions; the test needs one batch")
	}

	// The panic leaves the writer's cache state unknown: it stops, as a
	// fault.
	stopErr := h.stopErr()
	var fe *writer.FatalError
	if !errors.As(stopErr, &fe) {
		t.Fatalf("OnStopped: got %v (%T), want *writer.FatalError, not an orderly stop", stopErr, stopErr)
	}
	_, err := writer.Request(h.ctx, h.root, h.pid, &writer.Execute{Name: "later", Run: insert("later")}, h.done)
	if !errors.Is(err, writer.ErrStopped) {
		t.Errorf("request after the stop: got %v, want %v", err, writer.ErrStopped)
	}

	// What was answered as committed is in the file, for a connection
	// opened afresh after the writer stopped.
	fresh, err := sql.Open("sqlite3", (&url.URL{Scheme: "file", Path: h.db.Path, RawQuery: "mode=ro"}).String())
	if err != nil {
		t.Fatalf("open fresh connection: %v", err)
	}
	defer fresh.Close()
	for _, k := range []string{"a", "b"} {
		var n int
		if err := fresh.QueryRowContext(h.ctx, `SELECT count(*) FROM scratch WHERE k = ?`, k).Scan(&n); err != nil {
			t.Fatalf("read row %q afresh: %v", k, err)
		}
		if n != 1 {
			t.Errorf("row %q answered as committed but not in the file", k)
		}
	}
}

func TestWriterSkipsCommandWhoseCallerGaveUp(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	release, _ := h.gate()
	gaveUp, cancel := context.WithCancel(h.ctx)
	reply := make(chan *writer.Executed, 1)
	h.root.Send(h.pid, &writer.Execute{Ctx: gaveUp, Name: "abandoned", Run: insert("abandoned"), Reply: reply})
	kept := h.send("kept", insert("kept"))
	cancel()
	release()
	if r := h.await("abandoned", reply); !errors.Is(r.Err, context.Canceled) {
		t.Errorf("abandoned command: got %v, want %v", r.Err, context.Canceled)
	}
	if r := h.await("kept", kept); r.Err != nil {
		t.Errorf("kept command: got %v, want nil", r.Err)
	}
	if h.present("abandoned") {
		t.Errorf("a command whose caller gave up before it started was run")
	}
	if !h.present("kept") {
		t.Errorf("its batch neighbour was not committed")
	}
}

// maintain queues a Maintain in the writer's mailbox now, like send, and
// returns the channel Run's error will arrive on.
func (h *harness) maintain(name string, run func(conn *sql.Conn) error) <-chan error {
	reply := make(chan error, 1)
	h.root.Send(h.pid, &writer.Maintain{Name: name, Run: run, Reply: reply})
	return reply
}

// awaitErr returns the error on ch or fails the test at the deadline.
func (h *harness) awaitErr(name string, ch <-chan error) error {
	h.t.Helper()
	select {
	case err := <-ch:
		return err
	case <-h.ctx.Done():
		h.t.Fatalf("no reply to %s: %v", name, h.ctx.Err())
		return nil
	}
}

func TestMaintenanceRunsBetweenBatchesOutsideATransaction(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	release, gateReply := h.gate()

	// Mailbox: A, B, M, C. A and B open a batch whose flush marker lands
	// behind C, so only M can commit them before Run.
	a := h.send("A", insert("a"))
	b := h.send("B", insert("b"))
	var inside struct {
		conn                   *sql.Conn
		repliedA, repliedB     bool
		visibleA, visibleB     bool
		visibleC               bool
		beginErr, rollbackErr  error
		checkpointErr, readErr error
	}
	m := h.maintain("M", func(conn *sql.Conn) error {
		inside.conn = conn
		inside.repliedA, inside.repliedB = len(a) == 1, len(b) == 1
		for _, row := range []struct {
			k       string
			visible *bool
		}{{"a", &inside.visibleA}, {"b", &inside.visibleB}, {"c", &inside.visibleC}} {
			var n int
			if err := h.db.QueryPool().QueryRowContext(h.ctx, `SELECT count(*) FROM scratch WHERE k = ?`, row.k).Scan(&n); err != nil && inside.readErr == nil {
				inside.readErr = err
			}
			*row.visible = n == 1
		}
		// A checkpoint on a connection inside a transaction fails with
		// "database table is locked"; BEGIN inside one fails outright.
		_, inside.checkpointErr = sqlitefs.CheckpointOn(h.ctx, conn)
		if _, inside.beginErr = conn.ExecContext(h.ctx, `BEGIN`); inside.beginErr == nil {
			_, inside.rollbackErr = conn.ExecContext(h.ctx, `ROLLBACK`)
		}
		return nil
	})
	c := h.send("C", insert("c"))
	release()

	if r := h.await("gate", gateReply); r.Err != nil {
		t.Fatalf("gate: %v", r.Err)
	}
	if err := h.awaitErr("M", m); err != nil {
		t.Fatalf("maintenance: got %v, want nil", err)
	}
	ra, rb, rc := h.await("A", a), h.await("B", b), h.await("C", c)
	for name, r := range map[string]*writer.Executed{"A": ra, "B": rb, "C": rc} {
		if r.Err != nil {
			t.Fatalf("%s: got error %v, want nil", name, r.Err)
		}
	}

	if inside.readErr != nil {
		t.Fatalf("reader inside maintenance: %v", inside.readErr)
	}
	if !inside.repliedA || !inside.repliedB {
		t.Errorf("replies to A, B when maintenance ran: got %v, %v, want both sent", inside.repliedA, inside.repliedB)
	}
	if !inside.visibleA || !inside.visibleB {
		t.Errorf("A, B visible to a reader when maintenance ran: got %v, %v, want both committed", inside.visibleA, inside.visibleB)
	}
	if inside.visibleC {
		t.Errorf("C, sent after the maintenance, was committed before it ran")
	}
	if inside.checkpointErr != nil {
		t.Errorf("checkpoint inside maintenance: %v", inside.checkpointErr)
	}
	if inside.beginErr != nil || inside.rollbackErr != nil {
		t.Errorf("BEGIN/ROLLBACK inside maintenance: got %v, %v, want no transaction open", inside.beginErr, inside.rollbackErr)
	}

	txA, txB, txC := txOf(t, "A", ra), txOf(t, "B", rb), txOf(t, "C", rc)
	if txA != txB {
		t.Errorf("A and B ran in different transactions; want the one batch open when M arrived")
	}
	if txC == txA {
		t.Errorf("C joined the batch committed before the maintenance")
	}
	if inside.conn == nil || inside.conn != txC.Conn() {
		t.Errorf("maintenance ran on %p, want the writer's connection %p", inside.conn, txC.Conn())
	}
	for _, k := range []string{"a", "b", "c"} {
		if !h.present(k) {
			t.Errorf("row %q not committed", k)
		}
	}
	h.mustBeRunning(t, "a successful maintenance")
}

func TestAFatalMaintenanceErrorStopsTheWriter(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	if _, err := writer.Request(h.ctx, h.root, h.pid, &writer.Execute{Name: "before", Run: insert("before")}, h.done); err != nil {
		t.Fatalf("command before the maintenance: %v", err)
	}

	ioErr := sqlite3.Error{Code: sqlite3.ErrIoErr}
	if !sqlitefs.IsFatal(ioErr) {
		t.Fatalf("test setup: IsFatal(%v) is false", ioErr)
	}
	err := writer.RequestMaintenance(h.ctx, h.root, h.pid, &writer.Maintain{
		Name: "checkpoint",
		Run:  func(*sql.Conn) error { return ioErr },
	}, h.done)
	var fe *writer.FatalError
	if !errors.As(err, &fe) {
		t.Fatalf("RequestMaintenance: got %v (%T), want *writer.FatalError", err, err)
	}
	var se sqlite3.Error
	if !errors.As(err, &se) || se.Code != sqlite3.ErrIoErr {
		t.Errorf("RequestMaintenance: got %v, want it to wrap SQLITE_IOERR", err)
	}

	stopErr := h.stopErr()
	if !errors.As(stopErr, &fe) {
		t.Fatalf("OnStopped: got %v (%T), want *writer.FatalError, not an orderly stop", stopErr, stopErr)
	}
	if !errors.As(stopErr, &se) || se.Code != sqlite3.ErrIoErr {
		t.Errorf("OnStopped: got %v, want it to wrap SQLITE_IOERR", stopErr)
	}

	_, err = writer.Request(h.ctx, h.root, h.pid, &writer.Execute{Name: "later", Run: insert("later")}, h.done)
	if !errors.Is(err, writer.ErrStopped) && !errors.As(err, &fe) {
		t.Errorf("command after the fatal maintenance: got %v, want %v or a *writer.FatalError", err, writer.ErrStopped)
	}
	if !h.present("before") {
		t.Errorf("row committed before the maintenance is gone")
	}
	if h.present("later") {
		t.Errorf("a stopped writer committed a command")
	}
}

func TestAnOrdinaryMaintenanceErrorIsOnlyItsReply(t *testing.T) {
	h := newHarness(t, harnessOptions{})

	refused := errors.New("maintenance refused")
	err := writer.RequestMaintenance(h.ctx, h.root, h.pid, &writer.Maintain{
		Name: "refuses",
		Run:  func(*sql.Conn) error { return refused },
	}, h.done)
	if !errors.Is(err, refused) {
		t.Fatalf("RequestMaintenance: got %v, want %v", err, refused)
	}
	var fe *writer.FatalError
	if errors.As(err, &fe) {
		t.Fatalf("RequestMaintenance: got a *writer.FatalError %v for an ordinary error", err)
	}

	// A statement that fails in SQLite but does not poison anything.
	err = writer.RequestMaintenance(h.ctx, h.root, h.pid, &writer.Maintain{
		Name: "bad statement",
		Run: func(conn *sql.Conn) error {
			_, err := conn.ExecContext(h.ctx, `DELETE FROM no_such_table`)
			return err
		},
	}, h.done)
	var se sqlite3.Error
	if !errors.As(err, &se) || sqlitefs.IsFatal(err) {
		t.Fatalf("RequestMaintenance: got %v, want an ordinary SQLite error", err)
	}
	if errors.As(err, &fe) {
		t.Fatalf("RequestMaintenance: got a *writer.FatalError %v for an ordinary SQLite error", err)
	}

	if _, err := writer.Request(h.ctx, h.root, h.pid, &writer.Execute{Name: "after", Run: insert("after")}, h.done); err != nil {
		t.Fatalf("command after the failed maintenance: %v", err)
	}
	if !h.present("after") {
		t.Errorf("row %q not committed after the failed maintenance", "after")
	}
	if err := writer.RequestMaintenance(h.ctx, h.root, h.pid, &writer.Maintain{
		Name: "checkpoint",
		Run: func(conn *sql.Conn) error {
			_, err := sqlitefs.CheckpointOn(h.ctx, conn)
			return err
		},
	}, h.done); err != nil {
		t.Errorf("maintenance after the failed one: %v", err)
	}
	h.mustBeRunning(t, "an ordinary maintenance error")
}

func TestMaintenanceAfterTheWriterFailedRepliesTheFailureWithoutRunning(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	release, _ := h.gate()

	// Mailbox: F, M. F opens a batch whose flush marker lands behind M, so
	// M's own flush commits F's batch, which fails the writer before Run.
	f := h.send("F", func(tx *writer.Tx) (any, error) {
		return nil, sqlite3.Error{Code: sqlite3.ErrFull}
	})
	ran := false
	m := h.maintain("M", func(*sql.Conn) error {
		ran = true
		return nil
	})
	release()

	rf := h.await("F", f)
	var fe *writer.FatalError
	if !errors.As(rf.Err, &fe) {
		t.Fatalf("F: got %v (%T), want *writer.FatalError", rf.Err, rf.Err)
	}
	err := h.awaitErr("M", m)
	if !errors.Is(err, rf.Err) {
		t.Errorf("maintenance after the failure: got %v, want the writer's failure %v", err, rf.Err)
	}
	if ran {
		t.Errorf("maintenance ran on a failed writer")
	}
	if stopErr := h.stopErr(); !errors.Is(stopErr, rf.Err) {
		t.Errorf("OnStopped: got %v, want the writer's failure %v", stopErr, rf.Err)
	}
}

func TestAPanickingMaintenanceStopsTheWriterWithAFault(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	err := writer.RequestMaintenance(h.ctx, h.root, h.pid, &writer.Maintain{
		Name: "panics",
		Run:  func(*sql.Conn) error { panic("injected maintenance fault") },
	}, h.done)
	var fe *writer.FatalError
	if !errors.As(err, &fe) {
		t.Errorf("RequestMaintenance: got %v, want the *writer.FatalError of the panic", err)
	}
	if stopErr := h.stopErr(); !errors.As(stopErr, &fe) {
		t.Fatalf("OnStopped: got %v (%T), want *writer.FatalError, not an orderly stop", stopErr, stopErr)
	}
}

func TestAfterCommitWorkRunsInOrderOnceCommittedWithoutRolledBackOnes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	var ran []string // appended on the writer, read after its replies
	recording := func(k string, fail error) writer.Command {
		return func(tx *writer.Tx) (any, error) {
			if _, err := tx.Exec(`INSERT INTO scratch (k) VALUES (?)`, k); err != nil {
				return nil, err
			}
			tx.AfterCommit(func() {
				var n int
				if err := h.db.QueryPool().QueryRow(`SELECT count(*) FROM scratch WHERE k = ?`, k).Scan(&n); err != nil || n != 1 {
					t.Errorf("after-commit work for %q ran before a reader could see its commit", k)
				}
				ran = append(ran, k)
			})
			return tx, fail
		}
	}
	h.runABC(t, recording)
	// The replies go out before the after-commit work; a later command's
	// batch begins only once that work is done.
	if _, err := writer.Request(h.ctx, h.root, h.pid, &writer.Execute{Name: "after", Run: insert("after")}, h.done); err != nil {
		t.Fatalf("command after the batch: %v", err)
	}
	if want := []string{"a", "c"}; !slices.Equal(ran, want) {
		t.Errorf("after-commit work ran for %v, want %v", ran, want)
	}
}

func TestAfterCommitWorkOfABatchThatFailsNeverRuns(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	release, _ := h.gate()
	ran := make(chan string, 4)
	a := h.send("A", func(tx *writer.Tx) (any, error) {
		tx.AfterCommit(func() { ran <- "a" })
		_, err := tx.Exec(`INSERT INTO scratch (k) VALUES ('a')`)
		return nil, err
	})
	f := h.send("F", func(tx *writer.Tx) (any, error) {
		tx.AfterCommit(func() { ran <- "f" })
		return nil, sqlite3.Error{Code: sqlite3.ErrIoErr}
	})
	release()
	for name, ch := range map[string]<-chan *writer.Executed{"A": a, "F": f} {
		var fe *writer.FatalError
		if r := h.await(name, ch); !errors.As(r.Err, &fe) {
			t.Errorf("%s: got %v, want *writer.FatalError", name, r.Err)
		}
	}
	if err := h.stopErr(); err == nil {
		t.Fatal("OnStopped: got nil, want the storage fault")
	}
	close(ran)
	for k := range ran {
		t.Errorf("after-commit work of %q ran though its batch rolled back", k)
	}
}
