package principal_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/mindroomd/mindroomd/agent"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// testDeadline bounds every wait on the homeserver.
const testDeadline = 60 * time.Second

// hs is the package's homeserver: one real Dendrite for every test, each
// test with accounts and rooms of its own.
var hs *dendrite.Server

func TestMain(m *testing.M) { os.Exit(dendrite.RunTests(m, func(s *dendrite.Server) { hs = s })) }

var accounts atomic.Int64

// echo is the test Agent: it answers a text message with "echo: <body>",
// counts how often it was asked about each event, and can be told to fail.
type echo struct {
	mu    sync.Mutex
	asked map[string]int
	fail  map[string]bool
}

func newEcho() *echo { return &echo{asked: map[string]int{}, fail: map[string]bool{}} }

func (e *echo) Answer(_ context.Context, turn agent.Turn) (agent.Reply, error) {
	var ev struct {
		Type    string `json:"type"`
		Content struct {
			Body string `json:"body"`
		} `json:"content"`
	}
	if err := json.Unmarshal(turn.Event.Event, &ev); err != nil {
		return agent.Reply{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.asked[turn.Event.EventID]++
	if e.fail[ev.Content.Body] {
		return agent.Reply{}, fmt.Errorf("told to fail on %q", ev.Content.Body)
	}
	if turn.Event.Kind != journal.KindMessage {
		return agent.Reply{Ignore: true}, nil
	}
	content, _ := json.Marshal(map[string]string{"msgtype": "m.text", "body": "echo: " + ev.Content.Body})
	return agent.Reply{Content: content}, nil
}

func (e *echo) timesAsked(eventID string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.asked[eventID]
}

// fixture is one agent account with its journal, and a person talking to
// it in a room of their own.
type fixture struct {
	t   *testing.T
	ctx context.Context
	// homeserver is the URL the agent signs in to (the server, or a proxy
	// in front of it).
	homeserver string
	storage    string
	bot        dendrite.Account
	alice      *dendrite.User
	room       string
	agent      *echo

	// sender, when set, wraps the agent's outbox sender; transport its
	// transport.
	sender    func(outbox.Sender) outbox.Sender
	transport func(principal.Transport) principal.Transport
	// answer, when set, is the agent instead of agent; placeholder is the
	// principal's placeholder content.
	answer      agent.Agent
	placeholder json.RawMessage
	// journal, when set, wraps the journal view the principal is given.
	journal func(journal.PrincipalStore) journal.PrincipalStore

	system *actor.ActorSystem
	store  *store.Store
	view   journal.PrincipalStore
	client *matrix.Client
	pid    *actor.PID
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*testDeadline)
	t.Cleanup(cancel)
	n := accounts.Add(1)
	f := &fixture{t: t, ctx: ctx, homeserver: hs.URL, storage: t.TempDir(), agent: newEcho(), system: actors.NewSystem(zerolog.Nop())}
	f.bot = hs.Register(t, fmt.Sprintf("bot%d", n), "bot-password")
	f.alice = hs.User(t, hs.Register(t, fmt.Sprintf("alice%d", n), "alice-password"))
	f.room = f.alice.CreateRoom(f.bot.UserID)
	return f
}

// start opens the journal, signs the agent in and starts its principal.
func (f *fixture) start() {
	f.t.Helper()
	s, err := store.Open(f.ctx, store.Options{StorageDir: f.storage})
	if err != nil {
		f.t.Fatalf("open store: %v", err)
	}
	f.store = s
	if f.view, err = s.Principal(f.ctx, "echo", f.bot.UserID); err != nil {
		f.t.Fatal(err)
	}
	f.client, err = matrix.Login(f.ctx, matrix.Config{Homeserver: f.homeserver, UserID: f.bot.UserID, Password: f.bot.Password,
		Agent: "echo", StorageDir: f.storage, Log: zerolog.Nop()})
	if err != nil {
		f.t.Fatalf("login: %v", err)
	}
	var sender outbox.Sender = matrix.NewSender(f.client)
	if f.sender != nil {
		sender = f.sender(sender)
	}
	var transport principal.Transport = f.client
	if f.transport != nil {
		transport = f.transport(transport)
	}
	var agent agent.Agent = f.agent
	if f.answer != nil {
		agent = f.answer
	}
	view := f.view
	if f.journal != nil {
		view = f.journal(view)
	}
	f.pid = f.system.Root.Spawn(principal.Props(principal.Deps{
		Store: view, Transport: transport, Agent: agent, Placeholder: f.placeholder,
		Sender: sender, Reconciler: matrix.NewReconciler(f.client), DeviceID: f.client.DeviceID(),
		Hints: s.Hints(), AutoJoin: true, Log: testLog(f.t), SyncTimeout: time.Second,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		OnFault: func(err error) { f.t.Errorf("principal stopped: %v", err) },
	}))
	f.t.Cleanup(f.stop)
}

// stop stops the principal and closes the journal, as a daemon's shutdown
// does.
func (f *fixture) stop() {
	if f.pid == nil {
		return
	}
	if err := f.system.Root.StopFuture(f.pid).Wait(); err != nil {
		f.t.Errorf("stop principal: %v", err)
	}
	f.pid = nil
	if err := f.store.Close(); err != nil {
		f.t.Errorf("close store: %v", err)
	}
}

// body reads an event's sender and body.
func body(raw json.RawMessage) (sender, text string) {
	var ev struct {
		Sender  string `json:"sender"`
		Type    string `json:"type"`
		Content struct {
			Body       string          `json:"body"`
			NewContent json.RawMessage `json:"m.new_content"`
		} `json:"content"`
	}
	if json.Unmarshal(raw, &ev) != nil || ev.Type != "m.room.message" || ev.Content.NewContent != nil {
		return "", ""
	}
	return ev.Sender, ev.Content.Body
}

// awaitReply waits until alice's own sync shows the agent's answer to
// text.
func (f *fixture) awaitReply(text string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, testDeadline)
	defer cancel()
	f.alice.AwaitEvent(ctx, f.room, func(raw json.RawMessage) bool {
		sender, b := body(raw)
		return sender == f.bot.UserID && b == "echo: "+text
	})
}

// replies counts the agent's messages in the room's history, by body.
func (f *fixture) replies() map[string]int {
	f.t.Helper()
	out := map[string]int{}
	for _, raw := range f.alice.Messages(f.room) {
		if sender, b := body(raw); sender == f.bot.UserID {
			out[b]++
		}
	}
	return out
}

// awaitJoined waits until the agent has joined the room.
func (f *fixture) awaitJoined() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, testDeadline)
	defer cancel()
	f.alice.AwaitEvent(ctx, f.room, dendrite.Joined(f.bot.UserID, 1))
}

// screen waits until the conversation page satisfies want, re-reading
// after each commit of the principal.
func (f *fixture) screen(want func([]string) bool) []string {
	f.t.Helper()
	return f.page(journal.ReadRequest{RoomID: f.room, Limit: 100}, want)
}

func contains(xs []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, x := range xs {
			found = found || x == w
		}
		if !found {
			return false
		}
	}
	return true
}

func TestAUsersMessageIsAnsweredOnceAndBothAreOnTheConversationPage(t *testing.T) {
	f := newFixture(t)
	f.start()
	f.awaitJoined()
	q := f.alice.SendText(f.room, "hello")
	f.awaitReply("hello")
	if got := f.replies(); got["echo: hello"] != 1 || len(got) != 1 {
		t.Fatalf("the room shows the agent's messages %v, want one answer", got)
	}
	f.screen(func(s []string) bool { return contains(s, "hello", "echo: hello") })
	if n := f.agent.timesAsked(q); n != 1 {
		t.Fatalf("the agent was asked about the message %d times, want once", n)
	}
}

func TestEditsAndRedactionsReachThePageAndARedactedBodyIsNeverServed(t *testing.T) {
	f := newFixture(t)
	f.start()
	f.awaitJoined()
	first := f.alice.SendText(f.room, "first draft")
	second := f.alice.SendText(f.room, "secret words")
	f.awaitReply("secret words")
	f.alice.Edit(f.room, first, "first, edited")
	f.alice.Redact(f.room, second)
	got := f.screen(func(s []string) bool { return contains(s, "first, edited") && !contains(s, "secret words") })
	for _, b := range got {
		if strings.Contains(b, "secret") && !strings.HasPrefix(b, "echo: ") {
			t.Fatalf("the page still serves the redacted words: %q", got)
		}
	}
}

func TestARestartAnswersWhatCameMeanwhileAndNothingTwice(t *testing.T) {
	f := newFixture(t)
	f.start()
	f.awaitJoined()
	f.alice.SendText(f.room, "one")
	f.awaitReply("one")
	device := f.client.DeviceID()
	f.stop()

	f.alice.SendText(f.room, "two")
	f.alice.SendText(f.room, "three")
	f.start()
	f.awaitReply("two")
	f.awaitReply("three")
	if got := f.client.DeviceID(); got != device {
		t.Fatalf("device after the restart = %q, want the same %q", got, device)
	}
	f.alice.SendText(f.room, "four")
	f.awaitReply("four")
	want := map[string]int{"echo: one": 1, "echo: two": 1, "echo: three": 1, "echo: four": 1}
	if got := f.replies(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("answers in the room = %v, want %v", got, want)
	}
}

func TestAFailingTurnIsRetriedWhileTheNextMessageIsAnswered(t *testing.T) {
	f := newFixture(t)
	f.agent.fail["flaky"] = true
	f.start()
	f.awaitJoined()
	flaky := f.alice.SendText(f.room, "flaky")
	f.alice.SendText(f.room, "steady")
	f.awaitReply("steady")
	f.agent.mu.Lock()
	asked := f.agent.asked[flaky]
	f.agent.fail["flaky"] = false
	f.agent.mu.Unlock()
	if asked == 0 {
		t.Fatalf("the failing turn was never offered")
	}
	f.awaitReply("flaky")
	if got := f.replies(); got["echo: flaky"] != 1 || got["echo: steady"] != 1 {
		t.Fatalf("answers = %v, want one each", got)
	}
}

func TestNothingOfAnEndedMembershipIsAnsweredAfterARejoin(t *testing.T) {
	f := newFixture(t)
	f.agent.fail["before the leave"] = true // it stays pending through the leave
	f.start()
	f.awaitJoined()
	f.alice.SendText(f.room, "before the leave")
	f.alice.SendText(f.room, "answered")
	f.awaitReply("answered")

	res, err := f.system.Root.RequestFuture(f.pid, &principal.Leave{RoomID: f.room}, testDeadline).Result()
	if err != nil || res.(*principal.Left).Err != nil {
		t.Fatalf("leave: %v %v", err, res)
	}
	f.awaitNoOwedReports() // the sync echo of the leave consumed what the fence owed
	f.agent.mu.Lock()
	f.agent.fail["before the leave"] = false
	f.agent.mu.Unlock()
	f.alice.Invite(f.room, f.bot.UserID)
	f.awaitJoinedAgain()
	f.alice.SendText(f.room, "after the rejoin")
	f.awaitReply("after the rejoin")
	if got := f.replies(); got["echo: before the leave"] != 0 || got["echo: after the rejoin"] != 1 || got["echo: answered"] != 1 {
		t.Fatalf("answers = %v, want none for the old membership's pending work", got)
	}
}

// awaitNoOwedReports waits until the principal owes no departure echo.
func (f *fixture) awaitNoOwedReports() {
	f.t.Helper()
	sub := f.store.Hints().Subscribe(f.view.Principal().String())
	defer sub.Close()
	deadline := time.After(testDeadline)
	for {
		rooms, err := f.view.RoomsOwingDepartureReports(f.ctx)
		if err != nil {
			f.t.Fatal(err)
		}
		if len(rooms) == 0 {
			return
		}
		select {
		case <-sub.C():
		case <-deadline:
			f.t.Fatalf("departure reports still owed for %v", rooms)
		}
	}
}

// awaitJoinedAgain waits for the agent's second join of the room.
func (f *fixture) awaitJoinedAgain() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, testDeadline)
	defer cancel()
	f.alice.AwaitEvent(ctx, f.room, dendrite.Joined(f.bot.UserID, 2))
}

// testLog writes the principal's log into the test's output when
// MINDROOMD_TEST_LOG is set.
func testLog(t *testing.T) zerolog.Logger {
	if os.Getenv("MINDROOMD_TEST_LOG") == "" {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
}

// lostAcks sends through the real sender, then reports a network failure:
// the reply is in the room, but the process never learns it.
type lostAcks struct {
	outbox.Sender
	sent chan string
}

func (l lostAcks) Send(ctx context.Context, d journal.Delivery, content json.RawMessage) (journal.Sent, error) {
	rec, err := l.Sender.Send(ctx, d, content)
	if err == nil {
		select {
		case l.sent <- rec.EventID:
		default:
		}
		err = &journal.SendError{Err: errors.New("connection reset after the send")}
	}
	return journal.Sent{}, err
}

// awaitDelivery waits until the reply to source is acknowledged and
// returns its event ID.
func (f *fixture) awaitDelivery(source string) string {
	f.t.Helper()
	sub := f.store.Hints().Subscribe(f.view.Principal().String())
	defer sub.Close()
	deadline := time.After(testDeadline)
	for {
		d, err := f.view.Delivery(f.ctx, journal.ReplyDeliveryID(source), journal.StageFinal)
		if err == nil && d.State == journal.DeliveryAcknowledged {
			return d.EventID
		}
		select {
		case <-sub.C():
		case <-deadline:
			f.t.Fatalf("the reply to %s was never acknowledged (last: %+v, %v)", source, d, err)
			return ""
		}
	}
}

func TestAReplySentBeforeAReloginOnANewDeviceIsShownOnce(t *testing.T) {
	f := newFixture(t)
	sent := make(chan string, 1)
	f.sender = func(s outbox.Sender) outbox.Sender { return lostAcks{Sender: s, sent: sent} }
	f.start()
	f.awaitJoined()
	q := f.alice.SendText(f.room, "question")
	var first string
	select {
	case first = <-sent:
	case <-time.After(testDeadline):
		t.Fatal("the reply was never sent")
	}
	oldDevice := f.client.DeviceID()
	f.stop()

	// A new login: the stored session is gone, so the password login gets
	// a device of its own, on which the server's transaction memory is new.
	if err := os.RemoveAll(filepath.Join(f.storage, "matrix")); err != nil {
		t.Fatal(err)
	}
	f.sender = nil
	f.start()
	if f.client.DeviceID() == oldDevice {
		t.Fatalf("the new login kept device %s; the test needs a new one", oldDevice)
	}
	if got := f.awaitDelivery(q); got != first {
		t.Fatalf("acknowledged as %s, want the reply already in the room, %s", got, first)
	}
	f.alice.SendText(f.room, "next")
	f.awaitReply("next")
	if got := f.replies(); got["echo: question"] != 1 || got["echo: next"] != 1 {
		t.Fatalf("answers = %v, want each once", got)
	}
}

// blocking is an agent that never answers until released; asked learns
// when it was first asked.
type blocking struct{ asked, release chan struct{} }

func (b blocking) Answer(ctx context.Context, _ agent.Turn) (agent.Reply, error) {
	select {
	case b.asked <- struct{}{}:
	default:
	}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return agent.Reply{}, errors.New("released without an answer")
}

func TestOneAgentThatNeverAnswersDoesNotHoldUpAnother(t *testing.T) {
	f := newFixture(t) // the answering agent, on f's journal
	f.start()
	f.awaitJoined()

	// A second agent account on the same journal, whose agent hangs.
	stuckAcct := hs.Register(t, fmt.Sprintf("stuck%d", accounts.Add(1)), "stuck-password")
	stuckRoom := f.alice.CreateRoom(stuckAcct.UserID)
	view, err := f.store.Principal(f.ctx, "stuck", stuckAcct.UserID)
	if err != nil {
		t.Fatal(err)
	}
	client, err := matrix.Login(f.ctx, matrix.Config{Homeserver: hs.URL, UserID: stuckAcct.UserID, Password: stuckAcct.Password,
		Agent: "stuck", StorageDir: f.storage, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	agent := blocking{asked: make(chan struct{}, 1), release: make(chan struct{})}
	pid := f.system.Root.Spawn(principal.Props(principal.Deps{
		Store: view, Transport: client, Agent: agent, Sender: matrix.NewSender(client), Reconciler: matrix.NewReconciler(client),
		DeviceID: client.DeviceID(), Hints: f.store.Hints(), AutoJoin: true, Log: testLog(t), SyncTimeout: time.Second,
	}))
	// Registered after f's cleanup, so it runs first: the stuck principal
	// stops before the journal closes.
	t.Cleanup(func() {
		close(agent.release)
		_ = f.system.Root.StopFuture(pid).Wait()
	})

	f.alice.SendText(stuckRoom, "are you there?")
	select {
	case <-agent.asked: // the stuck agent now holds its turn
	case <-time.After(testDeadline):
		t.Fatal("the stuck agent was never asked")
	}
	f.alice.SendText(f.room, "hello")
	f.awaitReply("hello")
	f.alice.SendText(f.room, "again")
	f.awaitReply("again")
}

// gated answers like echo once open is closed, so a test can look at the
// room in between.
type gated struct {
	*echo
	open chan struct{}
}

func (g gated) Answer(ctx context.Context, turn agent.Turn) (agent.Reply, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return agent.Reply{}, ctx.Err()
	}
	return g.echo.Answer(ctx, turn)
}

func TestAPlaceholderIsSentFirstAndTheAnswerReplacesIt(t *testing.T) {
	f := newFixture(t)
	open := make(chan struct{})
	f.answer = gated{echo: f.agent, open: open}
	f.placeholder = json.RawMessage(`{"msgtype":"m.notice","body":"thinking"}`)
	f.start()
	f.awaitJoined()
	f.alice.SendText(f.room, "question")

	ctx, cancel := context.WithTimeout(f.ctx, testDeadline)
	defer cancel()
	ph := f.alice.AwaitEvent(ctx, f.room, func(raw json.RawMessage) bool {
		sender, b := body(raw)
		return sender == f.bot.UserID && b == "thinking"
	})
	var placeholder struct {
		EventID string `json:"event_id"`
	}
	if err := json.Unmarshal(ph, &placeholder); err != nil {
		t.Fatal(err)
	}
	close(open)
	edit := f.alice.AwaitEvent(ctx, f.room, func(raw json.RawMessage) bool {
		var ev struct {
			Content struct {
				NewContent struct {
					Body string `json:"body"`
				} `json:"m.new_content"`
				RelatesTo struct {
					RelType string `json:"rel_type"`
					EventID string `json:"event_id"`
				} `json:"m.relates_to"`
			} `json:"content"`
		}
		return json.Unmarshal(raw, &ev) == nil && ev.Content.RelatesTo.RelType == "m.replace" &&
			ev.Content.NewContent.Body == "echo: question"
	})
	var e struct {
		Content struct {
			RelatesTo struct {
				EventID string `json:"event_id"`
			} `json:"m.relates_to"`
		} `json:"content"`
	}
	if err := json.Unmarshal(edit, &e); err != nil || e.Content.RelatesTo.EventID != placeholder.EventID {
		t.Fatalf("the answer edits %q, want the placeholder %q", e.Content.RelatesTo.EventID, placeholder.EventID)
	}
	got := f.screen(func(s []string) bool { return contains(s, "echo: question") })
	if contains(got, "thinking") {
		t.Fatalf("the page still shows the placeholder: %q", got)
	}
	if got := f.replies(); got["thinking"] != 1 || len(got) != 1 {
		t.Fatalf("the agent's messages = %v, want the placeholder once (then edited)", got)
	}
}

// A room the agent is invited to holds what was said before: the timeline
// of the sync after the join opens with it. None of it is answered; what
// comes after the invite is, once.
func TestWhatARoomSaidBeforeTheAgentWasInvitedIsNeverAnswered(t *testing.T) {
	f := newFixture(t)
	f.room = f.alice.CreateRoom()
	for i := range 3 {
		f.alice.SendText(f.room, fmt.Sprintf("before the join %d", i))
	}
	f.alice.Invite(f.room, f.bot.UserID)
	f.alice.SendText(f.room, "after the invite")
	f.start()
	f.awaitJoined()
	f.alice.SendText(f.room, "after the join")
	f.awaitReply("after the join")
	got := f.replies()
	for i := range 3 {
		if n := got[fmt.Sprintf("echo: before the join %d", i)]; n != 0 {
			t.Fatalf("the agent answered history: %v", got)
		}
	}
	if got["echo: after the join"] != 1 || got["echo: after the invite"] != 1 {
		t.Fatalf("answers = %v, want the messages after the invite answered once each", got)
	}
	page, err := f.view.Pending(f.ctx, 100, 0)
	if err != nil || len(page.Events) != 0 {
		t.Fatalf("pending = %d events (%v), want none", len(page.Events), err)
	}
	// History is still shown.
	f.screen(func(got []string) bool {
		return contains(got, "before the join 0", "after the join", "echo: after the join")
	})
}

// rateLimited refuses the sync once with a 429 asking for wait, then
// passes every call through; it records when each sync was asked.
type rateLimited struct {
	principal.Transport
	wait    time.Duration
	mu      sync.Mutex
	refused int // the index of the refused call, -1 before it
	calls   []time.Time
}

func (r *rateLimited) Sync(ctx context.Context, since string, timeout time.Duration) (*matrix.SyncBatch, error) {
	r.mu.Lock()
	r.calls = append(r.calls, time.Now())
	refuse := r.refused < 0 && since != ""
	if refuse {
		r.refused = len(r.calls) - 1
	}
	r.mu.Unlock()
	if refuse {
		return nil, &matrix.HTTPError{Status: 429, ErrCode: "M_LIMIT_EXCEEDED", RetryAfter: r.wait}
	}
	return r.Transport.Sync(ctx, since, timeout)
}

func TestASyncRefusedWith429WaitsAsLongAsTheServerAsksBeforeTryingAgain(t *testing.T) {
	f := newFixture(t)
	limited := &rateLimited{wait: 700 * time.Millisecond, refused: -1}
	f.transport = func(t principal.Transport) principal.Transport {
		limited.Transport = t
		return limited
	}
	f.start()
	f.awaitJoined()
	f.alice.SendText(f.room, "after the limit")
	f.awaitReply("after the limit")
	limited.mu.Lock()
	defer limited.mu.Unlock()
	r := limited.refused
	if r < 0 || r+1 >= len(limited.calls) {
		t.Fatalf("the sync was never refused and asked again: calls at %v", limited.calls)
	}
	if gap := limited.calls[r+1].Sub(limited.calls[r]); gap < limited.wait {
		t.Fatalf("the sync after the 429 came %v later, want at least the %v the server asked (the backoff alone is at most 200ms)", gap, limited.wait)
	}
}
