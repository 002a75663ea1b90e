package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// testDeadline bounds every wait, so a stuck actor fails the test instead of
// hanging it. It is generous: the race detector and fsyncs on a small
// machine are slow, but never this slow.
const testDeadline = 30 * time.Second

const (
	room   = "!room:example.org"
	alice  = "@alice:example.org"
	device = "DEV"
	// Short backoff keeps retries quick; tests never wait on it by sleeping.
	backoffBase = 4 * time.Millisecond
	backoffMax  = 32 * time.Millisecond
)

// fakeHomeserver is the Sender: fault injection a real homeserver cannot
// produce on demand. Every Send is handed to the test as a sendCall on
// calls, and the test answers it. Accepted sends are deduplicated per
// (device, transaction ID) as a homeserver does, the device being the one
// the client is signed in as now (never the row's record of it): the same
// transaction ID from the same device returns the same event ID and
// becomes visible only once. It is also the Reconciler, searching what it
// made visible for a delivery's marker.
type fakeHomeserver struct {
	name  string
	calls chan *sendCall

	mu       sync.Mutex
	device   string            // the device the client is signed in as
	byTxn    map[string]string // device + txn -> event ID
	visible  []visibleMessage
	attempts map[string]int // txn -> sends that reached the server
	searches int            // Find calls

	// afterSearch, when set, runs after each Find with the number of
	// searches so far: a send still landing can land between two.
	afterSearch func(searches int)
}

// visibleMessage is one event the fake server made visible.
type visibleMessage struct {
	EventID string
	TxnID   string
	Content json.RawMessage
	// ServerTS is the server's timestamp of the event.
	ServerTS int64
	// Redacted is set once someone else redacted it: its content, and
	// with it the delivery marker, is gone.
	Redacted bool
}

// fakeServerEpochMS is where the fake server's clock starts, a minute
// after the test journal's, so what it accepts is stamped after it was
// enqueued, as on a real server; each event it makes visible is one
// millisecond later than the last.
var fakeServerEpochMS = testsupport.DefaultNow.Add(time.Minute).UnixMilli()

func newFakeHomeserver(name string) *fakeHomeserver {
	return &fakeHomeserver{
		name:     name,
		calls:    make(chan *sendCall),
		device:   device,
		byTxn:    make(map[string]string),
		attempts: make(map[string]int),
	}
}

// forgetTransactions drops the server's memory of transaction IDs, as a
// homeserver that keeps it in memory does when it restarts.
func (f *fakeHomeserver) forgetTransactions() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.byTxn = make(map[string]string)
}

// signIn makes the client's later sends come from dev, as a re-login does.
func (f *fakeHomeserver) signIn(dev string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.device = dev
}

// Find implements outbox.Reconciler: the event that carries d's delivery
// marker, if the server made one visible, and otherwise the events someone
// redacted.
func (f *fakeHomeserver) Find(_ context.Context, d journal.Delivery) (journal.Search, error) {
	search, err := f.find(d)
	if f.afterSearch != nil {
		f.afterSearch(f.Searches())
	}
	return search, err
}

func (f *fakeHomeserver) find(d journal.Delivery) (journal.Search, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.searches++
	var search journal.Search
	for _, m := range f.visible {
		if m.Redacted {
			search.Redacted = append(search.Redacted, journal.RedactedSend{EventID: m.EventID, ServerTS: m.ServerTS})
			continue
		}
		var c map[string]json.RawMessage
		if err := json.Unmarshal(m.Content, &c); err != nil {
			return journal.Search{}, err
		}
		var marker struct {
			DeliveryID string `json:"delivery_id"`
			Stage      string `json:"stage"`
		}
		if json.Unmarshal(c[journal.DeliveryKey], &marker) == nil &&
			marker.DeliveryID == d.DeliveryID && marker.Stage == d.Stage.String() {
			return journal.Search{Copy: journal.Sent{EventID: m.EventID, ServerTS: m.ServerTS}, Found: true}, nil
		}
	}
	return search, nil
}

// redact has someone other than the agent redact the visible event with
// eventID.
func (f *fakeHomeserver) redact(eventID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.visible {
		if f.visible[i].EventID == eventID {
			f.visible[i].Redacted = true
		}
	}
}

// Searches returns how many times Find was called.
func (f *fakeHomeserver) Searches() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.searches
}

// sendCall is one Send waiting for the test's answer.
type sendCall struct {
	Delivery journal.Delivery
	Content  json.RawMessage
	// At is when the send reached the server.
	At time.Time

	srv      *fakeHomeserver
	reply    chan error
	returned chan time.Time // when Send returned to the actor
}

// Send implements outbox.Sender.
func (f *fakeHomeserver) Send(ctx context.Context, d journal.Delivery, content json.RawMessage) (journal.Sent, error) {
	c := &sendCall{
		Delivery: d, Content: content, At: time.Now(), srv: f,
		reply: make(chan error, 1), returned: make(chan time.Time, 1),
	}
	f.mu.Lock()
	f.attempts[d.TxnID]++
	f.mu.Unlock()
	select {
	case f.calls <- c:
	case <-ctx.Done():
		return journal.Sent{}, ctx.Err()
	}
	var err error
	select {
	case err = <-c.reply:
	case <-ctx.Done():
		err = &journal.SendError{Err: ctx.Err()}
	}
	var rec journal.Sent
	if err == nil {
		rec = f.accept(d, content)
	}
	c.returned <- time.Now()
	return rec, err
}

// accept records a send on the server: a new transaction ID of the signed
// in device becomes a visible event; a repeated one returns the first
// event.
func (f *fakeHomeserver) accept(d journal.Delivery, content json.RawMessage) journal.Sent {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.device + "\x00" + d.TxnID
	if id, ok := f.byTxn[k]; ok {
		for _, m := range f.visible {
			if m.EventID == id {
				return journal.Sent{EventID: id, ServerTS: m.ServerTS}
			}
		}
	}
	id := fmt.Sprintf("$%s-%d:example.org", f.name, len(f.visible)+1)
	f.byTxn[k] = id
	ts := fakeServerEpochMS + int64(len(f.visible)) + 1
	f.visible = append(f.visible, visibleMessage{EventID: id, TxnID: d.TxnID, Content: content, ServerTS: ts})
	return journal.Sent{EventID: id, ServerTS: ts}
}

// Visible returns the events the server made visible, in order.
func (f *fakeHomeserver) Visible() []visibleMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]visibleMessage(nil), f.visible...)
}

// Attempts returns how many sends of a transaction ID reached the server.
func (f *fakeHomeserver) Attempts(txnID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts[txnID]
}

// next waits for the next send.
func (f *fakeHomeserver) next(ctx context.Context, t *testing.T) *sendCall {
	t.Helper()
	select {
	case c := <-f.calls:
		return c
	case <-ctx.Done():
		t.Fatalf("%s: no send arrived: %v", f.name, ctx.Err())
		return nil
	}
}

// answer replies to the call and returns when Send returned to the actor.
func (c *sendCall) answer(ctx context.Context, t *testing.T, err error) time.Time {
	t.Helper()
	c.reply <- err
	select {
	case at := <-c.returned:
		return at
	case <-ctx.Done():
		t.Fatalf("send of %s did not return: %v", c.Delivery.DeliveryID, ctx.Err())
		return time.Time{}
	}
}

// accept answers with success and returns the event ID the server gave.
func (c *sendCall) accept(ctx context.Context, t *testing.T) string {
	t.Helper()
	c.answer(ctx, t, nil)
	return c.srv.accept(c.Delivery, c.Content).EventID
}

// fail answers with err and returns when the failure reached the actor.
func (c *sendCall) fail(ctx context.Context, t *testing.T, err error) time.Time {
	t.Helper()
	return c.answer(ctx, t, err)
}

// manualClock is a clock the test advances; it drives the actor's backoff.
type manualClock struct{ ns atomic.Int64 }

func newManualClock() *manualClock {
	c := &manualClock{}
	c.ns.Store(testsupport.DefaultNow.UnixNano())
	return c
}

func (c *manualClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *manualClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// observed is one Observe call of the actor.
type observed struct {
	point outbox.Point
	d     journal.Delivery
}

// harness is a journal on a real on-disk SQLite file and an actor system
// to run outbox actors in.
type harness struct {
	t      *testing.T
	ctx    context.Context
	store  *store.Store
	system *actor.ActorSystem
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	t.Cleanup(cancel)
	s, _ := testsupport.MustOpen(t)
	return &harness{t: t, ctx: ctx, store: s, system: actors.NewSystem(zerolog.Nop())}
}

// principal returns the view of (agent, user).
func (h *harness) principal(agent, user string) journal.PrincipalStore {
	h.t.Helper()
	v, err := h.store.Principal(h.ctx, agent, user)
	if err != nil {
		h.t.Fatalf("Principal(%q, %q): %v", agent, user, err)
	}
	return v
}

// running is one spawned outbox actor.
type running struct {
	h        *harness
	pid      *actor.PID
	sub      *hint.Subscription
	observed chan observed
	stopOnce sync.Once
}

// spawn starts an outbox actor for v sending through snd; tune adjusts its
// deps. The actor is stopped when the test ends, before the store closes.
func (h *harness) spawn(v journal.PrincipalStore, snd outbox.Sender, tune func(*outbox.Deps)) *running {
	h.t.Helper()
	r := &running{h: h, observed: make(chan observed, 1024)}
	r.sub = h.store.Hints().Subscribe(v.Principal().String())
	deps := outbox.Deps{
		Outbox:      v,
		Sender:      snd,
		DeviceID:    device,
		Hints:       r.sub,
		BackoffBase: backoffBase,
		BackoffMax:  backoffMax,
		Log:         zerolog.Nop(),
		Observe: func(p outbox.Point, d journal.Delivery) {
			select {
			case r.observed <- observed{p, d}:
			case <-h.ctx.Done():
			}
		},
	}
	if tune != nil {
		tune(&deps)
	}
	r.pid = h.system.Root.Spawn(outbox.Props(deps))
	h.t.Cleanup(r.stop)
	return r
}

// stop stops the actor and waits until it has stopped.
func (r *running) stop() {
	r.stopOnce.Do(func() {
		if err := r.h.system.Root.StopFuture(r.pid).Wait(); err != nil {
			r.h.t.Errorf("stop outbox actor: %v", err)
		}
		r.sub.Close()
	})
}

// waitFor consumes observations until the delivery stage reaches point,
// and returns every observation consumed, the matching one last.
func (r *running) waitFor(point outbox.Point, deliveryID string, stage journal.Stage) []observed {
	r.h.t.Helper()
	var seen []observed
	for {
		select {
		case o := <-r.observed:
			seen = append(seen, o)
			if o.point == point && o.d.DeliveryID == deliveryID && o.d.Stage == stage {
				return seen
			}
		case <-r.h.ctx.Done():
			r.h.t.Fatalf("%s/%s never reached %s: %v", deliveryID, stage, point, r.h.ctx.Err())
			return nil
		}
	}
}

// admit admits one actionable message from alice.
func (h *harness) admit(v journal.PrincipalStore, eventID string) {
	h.t.Helper()
	res, err := v.AdmitBatch(h.ctx, mx.Live(room, mx.Message(eventID, alice, 1000, "question "+eventID)), "")
	if err != nil {
		h.t.Fatalf("AdmitBatch(%s): %v", eventID, err)
	}
	if got, want := res[0].Outcome, journal.Admitted; got != want {
		h.t.Fatalf("AdmitBatch(%s) outcome = %v, want %v", eventID, got, want)
	}
}

// recordTurn makes a turn's model result durable, as a turn does before it
// enqueues its final.
func (h *harness) recordTurn(v journal.PrincipalStore, turnID string, sources ...string) {
	h.t.Helper()
	err := v.UpsertTurn(h.ctx, journal.TurnRecord{
		TurnID: turnID, RoomID: room, State: journal.TurnResultRecorded, Sources: sources,
		Record: json.RawMessage(`{"answer":"recorded"}`),
	})
	if err != nil {
		h.t.Fatalf("UpsertTurn(%s): %v", turnID, err)
	}
}

// enqueue hands a text reply to the outbox.
func (h *harness) enqueue(v journal.PrincipalStore, req journal.EnqueueRequest) journal.EnqueueResult {
	h.t.Helper()
	if req.RoomID == "" {
		req.RoomID = room
	}
	if req.Stage == 0 {
		req.Stage = journal.StageFinal
	}
	res, err := v.EnqueueAndSettle(h.ctx, req)
	if err != nil {
		h.t.Fatalf("EnqueueAndSettle(%s/%s): %v", req.DeliveryID, req.Stage, err)
	}
	return res
}

// delivery loads one stage.
func (h *harness) delivery(v journal.PrincipalStore, deliveryID string, stage journal.Stage) journal.Delivery {
	h.t.Helper()
	d, err := v.Delivery(h.ctx, deliveryID, stage)
	if err != nil {
		h.t.Fatalf("Delivery(%s/%s): %v", deliveryID, stage, err)
	}
	return d
}

// unacknowledged lists the delivery IDs the recovery scan still owes.
func (h *harness) unacknowledged(v journal.PrincipalStore) []string {
	h.t.Helper()
	rows, err := v.Unacknowledged(h.ctx, 1000, nil)
	if err != nil {
		h.t.Fatalf("Unacknowledged: %v", err)
	}
	ids := make([]string, len(rows))
	for i, d := range rows {
		ids[i] = d.DeliveryID + "/" + d.Stage.String()
	}
	return ids
}

func text(body string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"msgtype": "m.text", "body": body})
	return b
}

// wireContent decodes what a send put on the wire.
func wireContent(t *testing.T, raw json.RawMessage) map[string]any {
	t.Helper()
	var c map[string]any
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("sent content is not JSON: %v", err)
	}
	return c
}

func TestDeliveryIsClaimedSentWithItsTxnIDAndAcknowledged(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	h.admit(v, "$q1")
	h.recordTurn(v, "turn-1", "$q1")
	res := h.enqueue(v, journal.EnqueueRequest{
		DeliveryID: "reply-1", TurnID: "turn-1", Content: text("the answer"), Sources: []string{"$q1"},
	})
	if got, want := res.TxnID, journal.TxnID(v.Principal(), "reply-1", journal.StageFinal); got != want {
		t.Fatalf("enqueue TxnID = %q, want %q", got, want)
	}

	a := h.spawn(v, srv, nil)
	c := srv.next(h.ctx, t)
	if got, want := c.Delivery.TxnID, res.TxnID; got != want {
		t.Errorf("sent TxnID = %q, want %q", got, want)
	}
	// The claim is committed before any network I/O.
	row := h.delivery(v, "reply-1", journal.StageFinal)
	if got, want := row.State, journal.DeliveryAttempted; got != want {
		t.Errorf("state while sending = %v, want %v", got, want)
	}
	if got, want := row.DeviceID, device; got != want {
		t.Errorf("device while sending = %q, want %q", got, want)
	}
	content := wireContent(t, c.Content)
	if got, want := content["body"], "the answer"; got != want {
		t.Errorf("sent body = %v, want %q", got, want)
	}
	marker, _ := content[journal.DeliveryKey].(map[string]any)
	if got, want := marker["delivery_id"], "reply-1"; got != want {
		t.Errorf("sent delivery marker = %v, want delivery_id %q", content[journal.DeliveryKey], want)
	}
	eventID := c.accept(h.ctx, t)

	var points []outbox.Point
	for _, o := range a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal) {
		points = append(points, o.point)
	}
	if got, want := fmt.Sprint(points), fmt.Sprint([]outbox.Point{outbox.Claimed, outbox.Accepted, outbox.Acknowledged}); got != want {
		t.Errorf("observed points = %s, want %s", got, want)
	}
	row = h.delivery(v, "reply-1", journal.StageFinal)
	if got, want := row.State, journal.DeliveryAcknowledged; got != want {
		t.Errorf("final state = %v, want %v", got, want)
	}
	if got, want := row.EventID, eventID; got != want {
		t.Errorf("acknowledged event ID = %q, want %q", got, want)
	}
	turn, ok, err := v.Turn(h.ctx, "turn-1")
	if err != nil || !ok {
		t.Fatalf("Turn(turn-1) = %v, %v", ok, err)
	}
	if turn.State != journal.TurnDelivered || turn.EventID != eventID {
		t.Errorf("turn = %v %q, want %v %q", turn.State, turn.EventID, journal.TurnDelivered, eventID)
	}
	page, err := v.Pending(h.ctx, 10, 0)
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	if got := len(page.Events); got != 0 {
		t.Errorf("pending events after enqueue-and-settle = %d, want 0", got)
	}
	if got := h.unacknowledged(v); len(got) != 0 {
		t.Errorf("unacknowledged = %v, want none", got)
	}
	if got, want := len(srv.Visible()), 1; got != want {
		t.Errorf("visible messages = %d, want %d", got, want)
	}
}

func TestRateLimitedSendWaitsTheServersRetryAfter(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Content: text("hello")})
	// The backoff alone would retry within backoffMax; only honouring
	// retry_after waits longer.
	const retryAfter = 150 * time.Millisecond
	a := h.spawn(v, srv, nil)

	first := srv.next(h.ctx, t)
	failedAt := first.fail(h.ctx, t, &journal.SendError{Status: 429, RetryAfter: retryAfter, Err: errors.New("M_LIMIT_EXCEEDED")})
	retry := srv.next(h.ctx, t)
	if gap := retry.At.Sub(failedAt); gap < retryAfter {
		t.Errorf("retried %v after the 429, want at least %v", gap, retryAfter)
	}
	if got, want := retry.Delivery.TxnID, first.Delivery.TxnID; got != want {
		t.Errorf("retry TxnID = %q, want %q", got, want)
	}
	eventID := retry.accept(h.ctx, t)
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	if got := h.delivery(v, "reply-1", journal.StageFinal); got.State != journal.DeliveryAcknowledged || got.EventID != eventID {
		t.Errorf("row = %v %q, want %v %q", got.State, got.EventID, journal.DeliveryAcknowledged, eventID)
	}
}

func TestServerAndNetworkErrorsRetryWithBackoffUnderTheSameTxnID(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	res := h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Content: text("hello")})
	a := h.spawn(v, srv, nil)

	failures := []struct {
		err       error
		lastError string // what the row records afterwards
	}{
		{&journal.SendError{Status: 500, Err: errors.New("M_UNKNOWN")}, "status 500"},
		{&journal.SendError{Status: 0, Err: io.ErrUnexpectedEOF}, "status 0"},
		{&journal.SendError{Status: 502, Err: errors.New("bad gateway")}, "status 502"},
		{errors.New("connection reset by peer"), "connection reset"},
	}
	var failedAt time.Time
	for i, f := range failures {
		c := srv.next(h.ctx, t)
		if got, want := c.Delivery.TxnID, res.TxnID; got != want {
			t.Errorf("attempt %d TxnID = %q, want %q", i+1, got, want)
		}
		if i > 0 {
			// Full jitter over an exponential ceiling never waits less than
			// half the ceiling.
			ceiling := min(backoffBase<<(i-1), backoffMax)
			if gap := c.At.Sub(failedAt); gap < ceiling/2 {
				t.Errorf("attempt %d came %v after the failure, want at least %v", i+1, gap, ceiling/2)
			}
			row := h.delivery(v, "reply-1", journal.StageFinal)
			if !strings.Contains(row.LastError, failures[i-1].lastError) {
				t.Errorf("last error before attempt %d = %q, want it to mention %q", i+1, row.LastError, failures[i-1].lastError)
			}
			if got, want := row.State, journal.DeliveryAttempted; got != want {
				t.Errorf("state before attempt %d = %v, want %v", i+1, got, want)
			}
		}
		failedAt = c.fail(h.ctx, t, f.err)
	}
	c := srv.next(h.ctx, t)
	if got, want := c.Delivery.TxnID, res.TxnID; got != want {
		t.Errorf("last attempt TxnID = %q, want %q", got, want)
	}
	eventID := c.accept(h.ctx, t)
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)

	row := h.delivery(v, "reply-1", journal.StageFinal)
	if row.State != journal.DeliveryAcknowledged || row.EventID != eventID {
		t.Errorf("row = %v %q, want %v %q", row.State, row.EventID, journal.DeliveryAcknowledged, eventID)
	}
	if got, want := row.Attempts, len(failures)+1; got != want {
		t.Errorf("attempts = %d, want %d", got, want)
	}
	if got, want := len(srv.Visible()), 1; got != want {
		t.Errorf("visible messages = %d, want %d", got, want)
	}
}

// A permanent failure is recorded on the row, which leaves recovery: the
// actor moves on to the rows behind it and never sends it again.
func TestAPermanentFailureIsRecordedAndNeverResent(t *testing.T) {
	cases := []struct {
		name   string
		server string
		// answer ends the first send the way the case fails it.
		answer func(ctx context.Context, t *testing.T, c *sendCall)
		// lastError is what the failed row's last error must mention.
		lastError string
	}{
		{
			name:   "forbidden",
			server: "srv",
			answer: func(ctx context.Context, t *testing.T, c *sendCall) {
				c.fail(ctx, t, &journal.SendError{Status: 403, Err: errors.New("M_FORBIDDEN")})
			},
			lastError: "403",
		},
		{
			// The server accepts, but its event IDs carry a space, which no
			// Matrix event ID does: the answer cannot be recorded, and a
			// resend would bring it back.
			name:   "accepted without a valid event ID",
			server: "broken server",
			answer: func(ctx context.Context, t *testing.T, c *sendCall) {
				if id := c.accept(ctx, t); journal.ValidEventID(id) {
					t.Fatalf("the server answered %q, a valid event ID", id)
				}
			},
			lastError: "broken server-1",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			v := h.principal("helper", "@bot:example.org")
			srv := newFakeHomeserver(tc.server)
			res := h.enqueue(v, journal.EnqueueRequest{DeliveryID: "doomed", Content: text("hello")})
			a := h.spawn(v, srv, nil)

			c := srv.next(h.ctx, t)
			// Enqueued while the doomed send is in flight: the actor reaches
			// it only after it has recorded the failure.
			h.enqueue(v, journal.EnqueueRequest{DeliveryID: "sentinel", Content: text("still here")})
			tc.answer(h.ctx, t, c)

			next := srv.next(h.ctx, t)
			if got, want := next.Delivery.DeliveryID, "sentinel"; got != want {
				t.Fatalf("send after the failure was %q, want %q", got, want)
			}
			next.answer(h.ctx, t, nil)
			a.waitFor(outbox.Accepted, "sentinel", journal.StageFinal)
			h.system.Root.Send(a.pid, &outbox.DeliverPending{})
			h.enqueue(v, journal.EnqueueRequest{DeliveryID: "sentinel-2", Content: text("and here")})
			next = srv.next(h.ctx, t)
			if got, want := next.Delivery.DeliveryID, "sentinel-2"; got != want {
				t.Fatalf("send after a rescan was %q, want %q", got, want)
			}
			next.answer(h.ctx, t, nil)
			a.waitFor(outbox.Accepted, "sentinel-2", journal.StageFinal)

			row := h.delivery(v, "doomed", journal.StageFinal)
			if got, want := row.State, journal.DeliveryFailed; got != want {
				t.Errorf("state = %v, want %v", got, want)
			}
			if !strings.Contains(row.LastError, tc.lastError) {
				t.Errorf("last error = %q, want it to mention %q", row.LastError, tc.lastError)
			}
			if row.EventID != "" {
				t.Errorf("event ID = %q, want none recorded", row.EventID)
			}
			if got := h.unacknowledged(v); slices.Contains(got, "doomed/"+journal.StageFinal.String()) {
				t.Errorf("unacknowledged = %v, want the failed row gone from recovery", got)
			}
			if got, want := srv.Attempts(res.TxnID), 1; got != want {
				t.Errorf("sends of the doomed delivery = %d, want %d", got, want)
			}
		})
	}
}

func TestRestartResendsAnAcceptedUnacknowledgedSendWithItsTxnID(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	res := h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Content: text("hello")})

	first := h.spawn(v, srv, nil)
	c := srv.next(h.ctx, t)
	// The server accepts the event, but the actor stops before it hears so.
	eventID := srv.accept(c.Delivery, c.Content).EventID
	first.stop()
	select {
	case <-c.returned:
	case <-h.ctx.Done():
		t.Fatalf("the send of the stopped actor never returned: %v", h.ctx.Err())
	}
	row := h.delivery(v, "reply-1", journal.StageFinal)
	if row.State != journal.DeliveryAttempted || row.EventID != "" {
		t.Fatalf("row after stop = %v %q, want %v and no event ID", row.State, row.EventID, journal.DeliveryAttempted)
	}

	second := h.spawn(v, srv, nil)
	retry := srv.next(h.ctx, t)
	if got, want := retry.Delivery.TxnID, res.TxnID; got != want {
		t.Errorf("recovered TxnID = %q, want %q", got, want)
	}
	if got := retry.accept(h.ctx, t); got != eventID {
		t.Errorf("server returned %q for the repeated TxnID, want %q", got, eventID)
	}
	second.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	row = h.delivery(v, "reply-1", journal.StageFinal)
	if row.State != journal.DeliveryAcknowledged || row.EventID != eventID {
		t.Errorf("row = %v %q, want %v %q", row.State, row.EventID, journal.DeliveryAcknowledged, eventID)
	}
	if got, want := len(srv.Visible()), 1; got != want {
		t.Errorf("visible messages = %d, want %d", got, want)
	}
	if got, want := srv.Attempts(res.TxnID), 2; got != want {
		t.Errorf("sends of the TxnID = %d, want %d", got, want)
	}
}

func TestRestartSendsARowClaimedButNeverAcknowledged(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Content: text("hello")})
	// An earlier process claimed the row, sent it and died before the ack.
	claimed, err := v.Claim(h.ctx, "reply-1", journal.StageFinal, device)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	wire, err := journal.WireContent(claimed)
	if err != nil {
		t.Fatalf("WireContent: %v", err)
	}
	eventID := srv.accept(claimed, wire).EventID

	a := h.spawn(v, srv, nil)
	c := srv.next(h.ctx, t)
	if got, want := c.Delivery.TxnID, claimed.TxnID; got != want {
		t.Errorf("recovered TxnID = %q, want %q", got, want)
	}
	if got, want := string(c.Content), string(wire); got != want {
		t.Errorf("recovered content = %s, want the frozen %s", got, want)
	}
	if got := c.accept(h.ctx, t); got != eventID {
		t.Errorf("server returned %q for the repeated TxnID, want %q", got, eventID)
	}
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	row := h.delivery(v, "reply-1", journal.StageFinal)
	if row.State != journal.DeliveryAcknowledged || row.EventID != eventID {
		t.Errorf("row = %v %q, want %v %q", row.State, row.EventID, journal.DeliveryAcknowledged, eventID)
	}
	if got, want := row.Attempts, 2; got != want {
		t.Errorf("attempts = %d, want %d", got, want)
	}
	if got, want := len(srv.Visible()), 1; got != want {
		t.Errorf("visible messages = %d, want %d", got, want)
	}
}

func TestABlockedPrincipalNeverDelaysAnother(t *testing.T) {
	h := newHarness(t)
	slow := h.principal("slow", "@slow:example.org")
	fast := h.principal("fast", "@fast:example.org")
	slowSrv, fastSrv := newFakeHomeserver("slow"), newFakeHomeserver("fast")
	h.enqueue(slow, journal.EnqueueRequest{DeliveryID: "s-1", Content: text("stuck")})
	h.spawn(slow, slowSrv, nil)
	// The slow principal's send hangs until the test ends.
	hung := slowSrv.next(h.ctx, t)

	f := h.spawn(fast, fastSrv, nil)
	for _, id := range []string{"f-1", "f-2"} {
		h.enqueue(fast, journal.EnqueueRequest{DeliveryID: id, Content: text("quick")})
		c := fastSrv.next(h.ctx, t)
		if got := c.Delivery.DeliveryID; got != id {
			t.Fatalf("fast principal sent %q, want %q", got, id)
		}
		c.accept(h.ctx, t)
		f.waitFor(outbox.Acknowledged, id, journal.StageFinal)
	}
	select {
	case <-hung.returned:
		t.Fatalf("the slow principal's send returned before the test ended")
	default:
	}
	if got, want := h.delivery(slow, "s-1", journal.StageFinal).State, journal.DeliveryAttempted; got != want {
		t.Errorf("slow row state = %v, want %v", got, want)
	}
	if got := h.unacknowledged(fast); len(got) != 0 {
		t.Errorf("fast principal unacknowledged = %v, want none", got)
	}
}

func TestAFailingDeliveryDoesNotBlockTheRestOfThePrincipal(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	for _, id := range []string{"stuck", "next-1", "next-2"} {
		h.enqueue(v, journal.EnqueueRequest{DeliveryID: id, Content: text(id)})
	}
	// After one failure the stuck row waits at least half an hour.
	a := h.spawn(v, srv, func(d *outbox.Deps) { d.BackoffBase, d.BackoffMax = time.Hour, 2*time.Hour })

	c := srv.next(h.ctx, t)
	if got, want := c.Delivery.DeliveryID, "stuck"; got != want {
		t.Fatalf("first send = %q, want the oldest row %q", got, want)
	}
	c.fail(h.ctx, t, &journal.SendError{Status: 503, Err: errors.New("unavailable")})
	for _, id := range []string{"next-1", "next-2"} {
		c := srv.next(h.ctx, t)
		if got := c.Delivery.DeliveryID; got != id {
			t.Fatalf("send = %q, want %q", got, id)
		}
		c.accept(h.ctx, t)
		a.waitFor(outbox.Acknowledged, id, journal.StageFinal)
	}
	if got, want := fmt.Sprint(h.unacknowledged(v)), "[stuck/final]"; got != want {
		t.Errorf("unacknowledged = %s, want %s", got, want)
	}
}

func TestMoreDeliveriesThanOneScanPageAreAllSent(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	const rows, scanLimit = 10, 3
	ids := make([]string, rows)
	for i := range ids {
		ids[i] = fmt.Sprintf("bulk-%02d", i)
		h.enqueue(v, journal.EnqueueRequest{DeliveryID: ids[i], Content: text(ids[i])})
	}
	// The oldest rows, more than a page, are rate limited for an hour of
	// the actor's clock: the rest are reachable only past the first page.
	limited := map[string]bool{ids[0]: true, ids[1]: true, ids[2]: true, ids[3]: true}
	clock := newManualClock()
	a := h.spawn(v, srv, func(d *outbox.Deps) { d.ScanLimit, d.Now = scanLimit, clock.Now })

	acked := map[string]string{}
	// answerUntil answers sends until n rows in total are acknowledged.
	answerUntil := func(n int) {
		t.Helper()
		for len(acked) < n {
			c := srv.next(h.ctx, t)
			id := c.Delivery.DeliveryID
			if limited[id] {
				delete(limited, id)
				c.fail(h.ctx, t, &journal.SendError{Status: 429, RetryAfter: time.Hour, Err: errors.New("M_LIMIT_EXCEEDED")})
				continue
			}
			acked[id] = c.accept(h.ctx, t)
			a.waitFor(outbox.Acknowledged, id, journal.StageFinal)
		}
	}
	answerUntil(rows - 4)
	if got, want := len(limited), 0; got != want {
		t.Errorf("rate-limited rows never attempted = %d, want %d", got, want)
	}
	if got, want := fmt.Sprint(h.unacknowledged(v)), "[bulk-00/final bulk-01/final bulk-02/final bulk-03/final]"; got != want {
		t.Errorf("unacknowledged while rate limited = %s, want %s", got, want)
	}
	clock.Advance(time.Hour + time.Second)
	h.system.Root.Send(a.pid, &outbox.DeliverPending{})
	answerUntil(rows)

	for _, id := range ids {
		row := h.delivery(v, id, journal.StageFinal)
		if row.State != journal.DeliveryAcknowledged || row.EventID != acked[id] {
			t.Errorf("%s = %v %q, want %v %q", id, row.State, row.EventID, journal.DeliveryAcknowledged, acked[id])
		}
	}
	visible := srv.Visible()
	txns := map[string]bool{}
	for _, m := range visible {
		txns[m.TxnID] = true
	}
	if len(visible) != rows || len(txns) != rows {
		t.Errorf("visible messages = %d with %d distinct TxnIDs, want %d of each", len(visible), len(txns), rows)
	}
}

func TestFinalIsSentAsAnEditOfItsAcknowledgedInitial(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	h.admit(v, "$q1")
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Stage: journal.StageInitial, Content: text("thinking…")})
	a := h.spawn(v, srv, nil)

	c := srv.next(h.ctx, t)
	if c.Delivery.Stage != journal.StageInitial || c.Delivery.ReplacesEventID != "" {
		t.Fatalf("first send = %s replacing %q, want the initial replacing nothing", c.Delivery.Stage, c.Delivery.ReplacesEventID)
	}
	initialID := c.accept(h.ctx, t)
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageInitial)

	h.recordTurn(v, "turn-1", "$q1")
	h.enqueue(v, journal.EnqueueRequest{
		DeliveryID: "reply-1", TurnID: "turn-1", Content: text("the answer"), Sources: []string{"$q1"},
	})
	c = srv.next(h.ctx, t)
	if got, want := c.Delivery.Stage, journal.StageFinal; got != want {
		t.Fatalf("second send stage = %v, want %v", got, want)
	}
	if got, want := c.Delivery.ReplacesEventID, initialID; got != want {
		t.Errorf("final replaces %q, want the initial %q", got, want)
	}
	content := wireContent(t, c.Content)
	rel, _ := content["m.relates_to"].(map[string]any)
	if rel["rel_type"] != "m.replace" || rel["event_id"] != initialID {
		t.Errorf("final m.relates_to = %v, want an m.replace of %q", content["m.relates_to"], initialID)
	}
	newContent, _ := content["m.new_content"].(map[string]any)
	if got, want := newContent["body"], "the answer"; got != want {
		t.Errorf("final m.new_content body = %v, want %q", got, want)
	}
	finalID := c.accept(h.ctx, t)
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)

	if got := h.delivery(v, "reply-1", journal.StageFinal); got.State != journal.DeliveryAcknowledged || got.EventID != finalID {
		t.Errorf("final row = %v %q, want %v %q", got.State, got.EventID, journal.DeliveryAcknowledged, finalID)
	}
	turn, ok, err := v.Turn(h.ctx, "turn-1")
	if err != nil || !ok {
		t.Fatalf("Turn(turn-1) = %v, %v", ok, err)
	}
	if turn.State != journal.TurnDelivered || turn.EventID != finalID {
		t.Errorf("turn = %v %q, want %v %q", turn.State, turn.EventID, journal.TurnDelivered, finalID)
	}
	if got, want := len(srv.Visible()), 2; got != want {
		t.Errorf("visible messages = %d, want %d (the initial and its edit)", got, want)
	}
}

func TestFinalWaitsForItsUnacknowledgedInitial(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Stage: journal.StageInitial, Content: text("thinking…")})
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Content: text("the answer")})
	a := h.spawn(v, srv, nil)

	c := srv.next(h.ctx, t)
	if got, want := c.Delivery.Stage, journal.StageInitial; got != want {
		t.Fatalf("first send stage = %v, want %v", got, want)
	}
	c.fail(h.ctx, t, &journal.SendError{Status: 500, Err: errors.New("M_UNKNOWN")})
	// The initial's outcome is unknown, so the final may not go first: it
	// would not know whether to edit.
	c = srv.next(h.ctx, t)
	if got, want := c.Delivery.Stage, journal.StageInitial; got != want {
		t.Fatalf("send after the initial failed = %v, want the %v again", got, want)
	}
	initialID := c.accept(h.ctx, t)
	c = srv.next(h.ctx, t)
	if c.Delivery.Stage != journal.StageFinal || c.Delivery.ReplacesEventID != initialID {
		t.Errorf("next send = %v replacing %q, want the final replacing %q", c.Delivery.Stage, c.Delivery.ReplacesEventID, initialID)
	}
	c.accept(h.ctx, t)
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	if got := h.unacknowledged(v); len(got) != 0 {
		t.Errorf("unacknowledged = %v, want none", got)
	}
}

// failingClaims is the store's outbox with its first claims failing, as a
// busy or briefly unavailable database answers.
type failingClaims struct {
	journal.Outbox
	failures atomic.Int32
}

func (f *failingClaims) Claim(ctx context.Context, deliveryID string, stage journal.Stage, deviceID string) (journal.Delivery, error) {
	if f.failures.Add(-1) >= 0 {
		return journal.Delivery{}, errors.New("database is locked")
	}
	return f.Outbox.Claim(ctx, deliveryID, stage, deviceID)
}

func TestAFailedClaimIsRetriedWithoutAnotherCommit(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Content: text("hello")})
	flaky := &failingClaims{Outbox: v}
	flaky.failures.Store(2)
	// No commit follows the enqueue, so no hint wakes the actor: only its
	// own retry timer can bring the row back.
	a := h.spawn(v, srv, func(d *outbox.Deps) { d.Outbox, d.Hints = flaky, nil })

	c := srv.next(h.ctx, t)
	if got, want := c.Delivery.DeliveryID, "reply-1"; got != want {
		t.Fatalf("sent %q, want %q", got, want)
	}
	eventID := c.accept(h.ctx, t)
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	if got := h.delivery(v, "reply-1", journal.StageFinal); got.State != journal.DeliveryAcknowledged || got.EventID != eventID {
		t.Errorf("row = %v %q, want %v %q", got.State, got.EventID, journal.DeliveryAcknowledged, eventID)
	}
	if got, want := 2-flaky.failures.Load(), int32(3); got != want {
		t.Errorf("claims = %d, want %d (two failed, one succeeded)", got, want)
	}
}
