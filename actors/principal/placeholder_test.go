package principal_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/mindroomd/mindroomd/agent"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// thinking is a streamed answer's placeholder, as the openai back-end
// sends it.
var thinking = json.RawMessage(`{"msgtype":"m.text","body":"Thinking…","io.mindroom.stream_status":"pending"}`)

// placeholderOut waits until the turn of eventID has no placeholder, or
// until the outbox has sent it.
func (f *fixture) placeholderOut(ctx context.Context, eventID string) error {
	sub := f.store.Hints().Subscribe(f.view.Principal().String())
	defer sub.Close()
	for {
		d, err := f.view.Delivery(ctx, journal.ReplyDeliveryID(eventID), journal.StageInitial)
		switch {
		case errors.Is(err, journal.ErrNoDelivery):
			return nil
		case err != nil:
			return err
		case d.State == journal.DeliveryAcknowledged:
			return nil
		}
		select {
		case <-sub.C():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// afterPlaceholder answers like echo, and ignores the message whose body is
// ignore, but only once its turn's placeholder, if it has one, is in the
// room: a turn that ends unanswered then has its placeholder shown, never
// still queued.
type afterPlaceholder struct {
	*echo
	f      *fixture
	ignore string
}

func (a afterPlaceholder) Answer(ctx context.Context, turn agent.Turn) (agent.Reply, error) {
	if err := a.f.placeholderOut(ctx, turn.Event.EventID); err != nil {
		return agent.Reply{}, err
	}
	reply, err := a.echo.Answer(ctx, turn)
	if _, b := body(turn.Event.Event); err == nil && a.ignore != "" && b == a.ignore {
		return agent.Reply{Ignore: true}, nil
	}
	return reply, err
}

// awaitInRoom waits until alice's own sync shows eventID: the room's
// history then holds everything sent before it.
func (f *fixture) awaitInRoom(eventID string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, testDeadline)
	defer cancel()
	f.alice.AwaitEvent(ctx, f.room, dendrite.WithID(eventID))
}

// awaitSettled waits until eventID, admitted, is no longer pending. A
// settlement wakes no subscriber, so the pending work is polled.
func (f *fixture) awaitSettled(eventID string) {
	f.t.Helper()
	deadline := time.Now().Add(testDeadline)
	for {
		page, err := f.view.Pending(f.ctx, 1000, 0)
		if err != nil {
			f.t.Fatal(err)
		}
		pending := false
		for _, e := range page.Events {
			pending = pending || e.EventID == eventID
		}
		if !pending {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s is still pending", eventID)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestReactionsAndRedactionsAreGivenNoPlaceholder(t *testing.T) {
	f := newFixture(t)
	f.placeholder = thinking
	f.answer = afterPlaceholder{echo: f.agent, f: f}
	f.start()
	f.awaitJoined()
	q := f.alice.SendText(f.room, "question")
	f.awaitDelivery(q)
	reaction := f.alice.React(f.room, q, "👍")
	redaction := f.alice.Redact(f.room, q)
	last := f.alice.SendText(f.room, "last")
	// Offered in receipt order, the reaction and the redaction were done
	// with before the last message was answered.
	final := f.awaitDelivery(last)
	for _, id := range []string{reaction, redaction} {
		if n := f.agent.timesAsked(id); n != 1 {
			t.Fatalf("the agent was asked about %s %d times, want once", id, n)
		}
		if d, err := f.view.Delivery(f.ctx, journal.ReplyDeliveryID(id), journal.StageInitial); !errors.Is(err, journal.ErrNoDelivery) {
			t.Fatalf("%s has a placeholder (%s as %s, %v), want none", id, d.State, d.EventID, err)
		}
	}
	f.awaitInRoom(final)
	if got, want := f.replies(), map[string]int{"Thinking…": 2}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the agent's messages in the room = %v, want %v: the two answered messages' placeholders, edited", got, want)
	}
}

func TestAnIgnoredMessagesPlaceholderIsRedacted(t *testing.T) {
	f := newFixture(t)
	f.placeholder = thinking
	f.answer = afterPlaceholder{echo: f.agent, f: f, ignore: "never mind"}
	f.start()
	f.awaitJoined()
	q := f.alice.SendText(f.room, "never mind")
	placeholder := f.awaitStage(q, journal.StageInitial)
	f.awaitSettled(q)
	// The placeholder is retracted before the event settles, so a message
	// sent now comes after the redaction in the room.
	next := f.alice.SendText(f.room, "next")
	f.awaitInRoom(next)

	var found bool
	for _, raw := range f.alice.Messages(f.room) {
		var ev struct {
			wireEvent
			Unsigned struct {
				RedactedBecause json.RawMessage `json:"redacted_because"`
			} `json:"unsigned"`
		}
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.EventID != placeholder {
			continue
		}
		found = true
		if ev.Content.Body != "" || ev.Unsigned.RedactedBecause == nil {
			t.Fatalf("the ignored message's placeholder = %s, want it redacted", raw)
		}
	}
	if !found {
		t.Fatalf("the placeholder %s is not in the room's history", placeholder)
	}
	if n := f.agent.timesAsked(q); n != 1 {
		t.Fatalf("the agent was asked about the ignored message %d times, want once", n)
	}
	if _, err := f.view.Delivery(f.ctx, journal.ReplyDeliveryID(q), journal.StageFinal); !errors.Is(err, journal.ErrNoDelivery) {
		t.Fatalf("the ignored message has a final reply (%v), want none", err)
	}
}

func TestNoProgressEditOfAnEndedMembershipIsSentAfterARejoin(t *testing.T) {
	f := newFixture(t)
	transport := &recordingTransport{attempted: make(chan struct{}, 8)}
	f.transport = func(tr principal.Transport) principal.Transport { transport.Transport = tr; return transport }
	// The progress edit after the rejoin is dropped at the membership's
	// check, which is a read of the room's epoch: the agent waits for it.
	epochRead := make(chan struct{}, 8)
	f.journal = func(v journal.PrincipalStore) journal.PrincipalStore { return epochReads{v, epochRead} }
	f.placeholder = thinking
	acknowledged, shown, rejoined, done := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	f.answer = agent.AgentFunc(func(ctx context.Context, turn agent.Turn) (agent.Reply, error) {
		if _, b := body(turn.Event.Event); b != "question" {
			return agent.Reply{Ignore: true}, nil
		}
		if !wait(ctx, acknowledged) {
			return agent.Reply{}, ctx.Err()
		}
		turn.Progress(ctx, "before the leave")
		if !wait(ctx, transport.attempted) {
			return agent.Reply{}, ctx.Err()
		}
		close(shown)
		if !wait(ctx, rejoined) {
			return agent.Reply{}, ctx.Err()
		}
		for len(epochRead) > 0 {
			<-epochRead
		}
		turn.Progress(ctx, "after the rejoin")
		if !wait(ctx, epochRead) {
			return agent.Reply{}, ctx.Err()
		}
		close(done)
		return agent.Reply{Content: json.RawMessage(`{"msgtype":"m.text","body":"too late"}`)}, nil
	})
	f.start()
	f.awaitJoined()
	q := f.alice.SendText(f.room, "question")
	f.awaitStage(q, journal.StageInitial)
	close(acknowledged)
	if !wait(f.ctx, shown) {
		t.Fatal("the agent never showed its progress")
	}
	if n := len(transport.sentIDs()); n != 1 {
		t.Fatalf("%d progress edits sent during the membership, want 1", n)
	}
	before, _, err := f.view.RoomEpoch(f.ctx, f.room)
	if err != nil {
		t.Fatal(err)
	}

	res, err := f.system.Root.RequestFuture(f.pid, &principal.Leave{RoomID: f.room}, testDeadline).Result()
	if err != nil || res.(*principal.Left).Err != nil {
		t.Fatalf("leave: %v %v", err, res)
	}
	f.awaitNoOwedReports()
	f.alice.Invite(f.room, f.bot.UserID)
	f.awaitJoinedAgain()
	f.awaitInAgain(before)
	close(rejoined)
	if !wait(f.ctx, done) {
		t.Fatal("the agent never finished its turn")
	}
	if sent := transport.sentIDs(); len(sent) != 1 {
		t.Fatalf("progress edits sent = %v, want only the one before the leave", sent)
	}
}

// epochReads tells read of each read of a room's epoch, once it is done.
type epochReads struct {
	journal.PrincipalStore
	read chan struct{}
}

func (s epochReads) RoomEpoch(ctx context.Context, roomID string) (int64, bool, error) {
	defer func() {
		select {
		case s.read <- struct{}{}:
		default:
		}
	}()
	return s.PrincipalStore.RoomEpoch(ctx, roomID)
}

// awaitInAgain waits until the journal has the principal back in the room
// under an epoch after before. A join wakes no subscriber, so the
// membership is polled.
func (f *fixture) awaitInAgain(before int64) {
	f.t.Helper()
	deadline := time.Now().Add(testDeadline)
	for {
		epoch, departed, err := f.view.RoomEpoch(f.ctx, f.room)
		if err != nil {
			f.t.Fatal(err)
		}
		if !departed && epoch > before {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the journal never had the principal back in the room (epoch %d, departed %v)", epoch, departed)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
