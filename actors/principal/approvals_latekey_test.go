package principal_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
	"github.com/mindroomd/mindroomd/testsupport/logbuf"
)

// A person's vote on a tool-approval card in an encrypted room, whose
// room key reaches the agent only after the vote itself was synced: it is
// journaled awaiting its key, and once the key comes and the vote is
// decrypted it is judged as a vote a sync brought in the clear would be.
//
// The agent here has no Agent in the process: its work is taken through
// the agent API, so nothing but the principal's approvals loop judges a
// vote that becomes pending when its key comes (an in-process worker
// would judge it on meeting it). Everything else is real: Dendrite, the
// agent's olm account (e2ee.Machine), the person's devices, the megolm
// ciphertext and the olm to-device room key. Only the order is arranged:
// the agent's homeserver connection keeps the to-device messages from the
// principal while the vote is synced (lateRoomKeys), as a homeserver
// delivering the key late would.
func TestAnEncryptedVoteWhoseKeyComesAfterItIsJudgedOnceWhenTheKeyComes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*testDeadline)
	t.Cleanup(cancel)
	n := accounts.Add(1)
	aliceAcct := hs.Register(t, fmt.Sprintf("votealice%d", n), "votealice-password")
	w := &e2eeCrashWorld{t: t, ctx: ctx, dir: t.TempDir(),
		bot: hs.Register(t, fmt.Sprintf("votebot%d", n), "votebot-password"), alice: e2eeperson.New(t, hs, aliceAcct)}
	b := startLateKeyAgent(w)
	w.createRoom()

	// Alice asks; the agent, outside the process, asks her about a call,
	// and the principal posts the call's card into the room, encrypted.
	question := w.alice.SendText(w.room, "Mail bob the report?")
	b.await("the question pending", func() (bool, string) {
		ids := b.pendingIDs()
		return slices.Contains(ids, question), fmt.Sprintf("pending %v", ids)
	})
	if _, _, err := b.view.RequestApproval(ctx, journal.ApprovalRequest{EventID: question, CallID: "c1", Tool: "send_mail",
		Arguments: json.RawMessage(`{"to":"bob@example.org"}`), Approvers: []string{w.alice.UserID()},
		ExpiresMS: time.Now().Add(time.Hour).UnixMilli()}, journal.DefaultApprovalKeys); err != nil {
		t.Fatalf("request approval: %v", err)
	}
	card := b.acknowledged(journal.ApprovalDeliveryID("c1"), journal.StageInitial, "the card")

	// Alice answers from her phone, a device of her own that has sent
	// nothing yet: its vote goes out under a megolm session made for it,
	// whose key the phone sends the agent's device over olm just before
	// the vote. The key is kept from the principal.
	phone, err := e2eeperson.Open(ctx, hs.URL, aliceAcct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(phone.Close)
	b.keys.hold()
	vote, err := phone.SendMessage(ctx, w.room, map[string]any{
		"msgtype": "m.text", "body": "> <" + w.bot.UserID + "> send_mail?\n\napprove",
		"m.relates_to": map[string]any{"m.in_reply_to": map[string]any{"event_id": card}},
	})
	if err != nil {
		t.Fatal(err)
	}
	b.await("the vote journaled awaiting its key", func() (bool, string) {
		awaiting := b.awaitingIDs()
		return slices.Contains(awaiting, vote), fmt.Sprintf("awaiting %v", awaiting)
	})
	if c := b.call("c1"); c.State != journal.ApprovalOpen {
		t.Fatalf("before the vote's key came the call is %s by %q; want it open", c.State, c.DecidedBy)
	}
	if ids := b.pendingIDs(); !slices.Equal(ids, []string{question}) {
		t.Fatalf("before the vote's key came pending = %v; want only the question", ids)
	}

	// The key comes: the next sync brings it.
	held := b.keys.release()
	if held == 0 {
		t.Fatal("no to-device message was kept from the principal, yet the vote awaited its key")
	}
	b.await("the call decided by the vote", func() (bool, string) {
		c := b.call("c1")
		return c.State != journal.ApprovalOpen, fmt.Sprintf("the call is %s, pending %v, awaiting %v; the vote %s, its key come, was never judged",
			c.State, b.pendingIDs(), b.awaitingIDs(), vote)
	})
	if c := b.call("c1"); c.State != journal.ApprovalApproved || c.DecidedBy != w.alice.UserID() || c.DecisionEventID != vote {
		t.Fatalf("the call is %s by %q with %q; want it approved by %s's vote %s", c.State, c.DecidedBy, c.DecisionEventID,
			w.alice.UserID(), vote)
	}
	edit := b.acknowledged(journal.ApprovalDeliveryID("c1"), journal.StageFinal, "the card's edit")
	w.alice.AwaitDecrypted(ctx, w.room, e2eeperson.WithID(edit))

	if ids := b.pendingIDs(); !slices.Equal(ids, []string{question}) {
		t.Fatalf("after the vote pending = %v; want the vote settled and only the question, waiting for its agent", ids)
	}
	if awaiting := b.awaitingIDs(); len(awaiting) != 0 {
		t.Fatalf("after the key came %v still await it", awaiting)
	}
	log := b.log.String()
	if !strings.Contains(log, `"event_id":"`+vote+`","room_id":"`+w.room+`","outcome":"resolved"`) {
		t.Fatalf("the principal did not log the late key resolving the vote %s:\n%s", vote, log)
	}
	if n := strings.Count(log, `"message":"Call decided"`); n != 1 {
		t.Fatalf("the principal decided a call %d times; want once:\n%s", n, log)
	}
	var edits []string
	for _, d := range w.alice.DecryptedTimeline(w.room) {
		if rel, _ := d.Content["m.relates_to"].(map[string]any); rel["rel_type"] == "m.replace" && rel["event_id"] == card {
			edits = append(edits, d.EventID)
		}
	}
	if !slices.Equal(edits, []string{edit}) {
		t.Fatalf("the room shows the card's edits %v; want the one, %s", edits, edit)
	}
	t.Logf("the vote %s awaited its key (%d to-device messages kept back), then approved c1 once; card %s edited as %s",
		vote, held, card, edit)
}

// lateKeyAgent is an agent account's principal with end-to-end
// encryption, wired as the daemon wires it, and no Agent.
type lateKeyAgent struct {
	t     *testing.T
	ctx   context.Context
	store *store.Store
	view  journal.PrincipalStore
	keys  *lateRoomKeys
	log   *logbuf.Buffer
}

// startLateKeyAgent signs w's agent in on w's storage and starts its
// principal, its to-device messages passing through lateRoomKeys.
func startLateKeyAgent(w *e2eeCrashWorld) *lateKeyAgent {
	t, ctx := w.t, w.ctx
	t.Helper()
	s, err := store.Open(ctx, store.Options{StorageDir: w.dir})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	view, err := s.Principal(ctx, "voter", w.bot.UserID)
	if err != nil {
		t.Fatal(err)
	}
	client, err := matrix.Login(ctx, matrix.Config{Homeserver: hs.URL, UserID: w.bot.UserID, Password: w.bot.Password,
		Agent: "voter", StorageDir: w.dir, Log: zerolog.Nop()})
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	pickleKey, err := e2ee.LoadPickleKey(filepath.Join(w.dir, "pickle.key"))
	if err != nil {
		t.Fatal(err)
	}
	cryptoStore, err := e2ee.OpenSQLite(ctx, filepath.Join(w.dir, e2ee.FileName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cryptoStore.Close(); err != nil {
			t.Errorf("close crypto store: %v", err)
		}
	})
	b := &lateKeyAgent{t: t, ctx: ctx, store: s, view: view,
		keys: &lateRoomKeys{Client: client}, log: &logbuf.Buffer{}}
	log := zerolog.New(b.log).With().Timestamp().Logger()
	machine, err := cryptoStore.Machine(ctx, e2ee.Options{Account: view.Principal().String(), Client: client,
		PickleKey: pickleKey, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(machine.Close)
	client.SetEncrypter(machine)
	reconciler := matrix.NewReconciler(client)
	reconciler.Open = machine.Open
	system := actors.NewSystem(zerolog.Nop())
	pid := system.Root.Spawn(principal.Props(principal.Deps{
		Store: view, Transport: b.keys, Sender: matrix.NewSender(client), Reconciler: reconciler,
		DeviceID: client.DeviceID(), Hints: s.Hints(), AutoJoin: true, Crypto: machine, Log: log,
		SyncTimeout: time.Second, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		OnFault: func(err error) { t.Errorf("principal stopped: %v", err) },
	}))
	t.Cleanup(func() {
		if err := system.Root.StopFuture(pid).Wait(); err != nil {
			t.Errorf("stop principal: %v", err)
		}
		if t.Failed() {
			t.Logf("the principal's log:\n%s", b.log)
		}
	})
	return b
}

// await waits until cond holds, reading again after each commit of the
// principal and at least every 100ms, for at most testDeadline; cond's
// text says what was seen instead.
func (b *lateKeyAgent) await(what string, cond func() (bool, string)) {
	b.t.Helper()
	sub := b.store.Hints().Subscribe(b.view.Principal().String())
	defer sub.Close()
	deadline := time.NewTimer(testDeadline)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, seen := cond()
		if ok {
			return
		}
		select {
		case <-sub.C():
		case <-tick.C:
		case <-deadline.C:
			b.t.Fatalf("waited %v for %s: %s", testDeadline, what, seen)
		}
	}
}

// acknowledged waits until the delivery id's stage is acknowledged and
// returns its event ID.
func (b *lateKeyAgent) acknowledged(id string, stage journal.Stage, what string) string {
	b.t.Helper()
	var d journal.Delivery
	b.await(what+" acknowledged", func() (bool, string) {
		var err error
		d, err = b.view.Delivery(b.ctx, id, stage)
		if err != nil && !errors.Is(err, journal.ErrNoDelivery) {
			b.t.Fatal(err)
		}
		return d.State == journal.DeliveryAcknowledged, fmt.Sprintf("%+v", d)
	})
	return d.EventID
}

// call is the approval callID.
func (b *lateKeyAgent) call(callID string) journal.Approval {
	b.t.Helper()
	a, _, found, err := b.view.Approval(b.ctx, callID)
	if err != nil || !found {
		b.t.Fatalf("approval %s: %v %v", callID, found, err)
	}
	return a
}

// pendingIDs are the events pending as work: what the agent API offers.
func (b *lateKeyAgent) pendingIDs() []string {
	b.t.Helper()
	page, err := b.view.Pending(b.ctx, 100, 0)
	if err != nil {
		b.t.Fatal(err)
	}
	var ids []string
	for _, e := range page.Events {
		ids = append(ids, e.EventID)
	}
	return ids
}

// awaitingIDs are the events journaled awaiting their key.
func (b *lateKeyAgent) awaitingIDs() []string {
	b.t.Helper()
	waits, err := b.view.KeyWaits(b.ctx, 100)
	if err != nil {
		b.t.Fatal(err)
	}
	var ids []string
	for _, w := range waits {
		events, err := b.view.AwaitingFor(b.ctx, w.RoomID, w.Session, 100)
		if err != nil {
			b.t.Fatal(err)
		}
		for _, e := range events {
			ids = append(ids, e.EventID)
		}
	}
	return ids
}

// lateRoomKeys is the agent's homeserver connection, delivering to-device
// messages (room keys among them) late: while it holds, every to-device
// message a sync brings is kept from the principal; after the release the
// next sync brings them all, before its own, and so does any sync fetched
// again from the same token until one from the following token shows that
// response admitted. Everything else is the real client's.
type lateRoomKeys struct {
	*matrix.Client

	mu      sync.Mutex
	holding bool
	held    []json.RawMessage
	// carrier is the next_batch of the response that brought the held
	// messages after the release.
	carrier string
}

func (l *lateRoomKeys) Sync(ctx context.Context, since string, timeout time.Duration) (*matrix.SyncBatch, error) {
	batch, err := l.Client.Sync(ctx, since, timeout)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.carrier != "" && since == l.carrier {
		l.held, l.carrier = nil, ""
	}
	if err != nil {
		return batch, err
	}
	switch {
	case l.holding:
		l.held = append(l.held, batch.Crypto.ToDevice...)
		batch.Crypto.ToDevice = nil
	case len(l.held) > 0:
		batch.Crypto.ToDevice = append(slices.Clone(l.held), batch.Crypto.ToDevice...)
		l.carrier = batch.NextBatch
	}
	return batch, nil
}

// hold keeps every to-device message from the principal from the next
// sync on.
func (l *lateRoomKeys) hold() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holding = true
}

// release lets the next sync bring what was held, and returns how many
// messages that is.
func (l *lateRoomKeys) release() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holding = false
	return len(l.held)
}
