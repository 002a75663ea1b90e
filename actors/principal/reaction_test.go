package principal_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/journal"
)

// reactTo answers like echo, but with a reaction of key to the message
// whose body is body, once its turn's placeholder, if it has one, is in
// the room.
type reactTo struct {
	afterPlaceholder
	body, key string
}

func (r reactTo) Answer(ctx context.Context, turn agent.Turn) (agent.Reply, error) {
	reply, err := r.afterPlaceholder.Answer(ctx, turn)
	if _, b := body(turn.Event.Event); err == nil && b == r.body {
		return agent.Reply{React: r.key}, nil
	}
	return reply, err
}

// reactionEvent is an m.reaction as the homeserver serves it.
type reactionEvent struct {
	EventID string `json:"event_id"`
	Type    string `json:"type"`
	Sender  string `json:"sender"`
	Content struct {
		RelatesTo struct {
			RelType string `json:"rel_type"`
			EventID string `json:"event_id"`
			Key     string `json:"key"`
		} `json:"m.relates_to"`
	} `json:"content"`
	Unsigned struct {
		RedactedBecause json.RawMessage `json:"redacted_because"`
	} `json:"unsigned"`
}

// agentEvents reads the room's history: the agent's reactions, and its
// messages by event ID.
func (f *fixture) agentEvents() (reactions []reactionEvent, messages map[string]reactionEvent) {
	f.t.Helper()
	messages = map[string]reactionEvent{}
	for _, raw := range f.alice.Messages(f.room) {
		var ev reactionEvent
		if err := json.Unmarshal(raw, &ev); err != nil {
			f.t.Fatal(err)
		}
		switch {
		case ev.Sender != f.bot.UserID:
		case ev.Type == journal.TypeReaction:
			reactions = append(reactions, ev)
		case ev.Type == "m.room.message":
			messages[ev.EventID] = ev
		}
	}
	return reactions, messages
}

// awaitReaction waits until alice's own sync shows the agent's reaction
// to eventID.
func (f *fixture) awaitReaction(eventID string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, testDeadline)
	defer cancel()
	f.alice.AwaitEvent(ctx, f.room, func(raw json.RawMessage) bool {
		var ev reactionEvent
		return json.Unmarshal(raw, &ev) == nil && ev.Sender == f.bot.UserID && ev.Type == journal.TypeReaction &&
			ev.Content.RelatesTo.EventID == eventID
	})
}

// awaitTurnDelivered waits until the turn of source is delivered, and
// returns its record.
func (f *fixture) awaitTurnDelivered(source string) journal.TurnRecord {
	f.t.Helper()
	sub := f.store.Hints().Subscribe(f.view.Principal().String())
	defer sub.Close()
	deadline := time.After(testDeadline)
	for {
		rec, ok, err := f.view.TurnForEvent(f.ctx, source)
		if err != nil {
			f.t.Fatal(err)
		}
		if ok && rec.State == journal.TurnDelivered {
			return rec
		}
		select {
		case <-sub.C():
		case <-deadline:
			f.t.Fatalf("the turn of %s was never delivered (last: %+v, %v)", source, rec, ok)
		}
	}
}

func TestAReactionAnswersTheMessageWithOneReactionAndSettlesIt(t *testing.T) {
	f := newFixture(t)
	f.answer = reactTo{afterPlaceholder: afterPlaceholder{echo: f.agent, f: f}, body: "nice work", key: "👍"}
	f.start()
	f.awaitJoined()
	q := f.alice.SendText(f.room, "nice work")
	f.awaitSettled(q)
	f.awaitReaction(q)
	// A message after it, answered: the turn of the first is long over,
	// and nothing more of it comes.
	f.alice.SendText(f.room, "next")
	f.awaitReply("next")

	reactions, messages := f.agentEvents()
	if len(reactions) != 1 {
		t.Fatalf("the agent reacted %d times, want once: %+v", len(reactions), reactions)
	}
	if rel := reactions[0].Content.RelatesTo; rel.RelType != journal.RelAnnotation || rel.EventID != q || rel.Key != "👍" {
		t.Fatalf("the reaction relates as %+v, want 👍 to %s", rel, q)
	}
	if got := f.replies(); len(got) != 1 || got["echo: next"] != 1 || len(messages) != 1 {
		t.Fatalf("the agent's messages = %v, want only the answer to the next message", got)
	}
	if n := f.agent.timesAsked(q); n != 1 {
		t.Fatalf("the agent was asked %d times, want once", n)
	}
	if rec := f.awaitTurnDelivered(q); rec.EventID != reactions[0].EventID {
		t.Fatalf("turn record = %+v, want it delivered as the reaction %s", rec, reactions[0].EventID)
	}
}

// The reaction is the answer: the placeholder shown while the agent was
// asked is redacted, as for a message ignored, not edited into anything.
func TestAReactionAnswersAMessageWhosePlaceholderIsThenRedacted(t *testing.T) {
	f := newFixture(t)
	f.placeholder = thinking
	f.answer = reactTo{afterPlaceholder: afterPlaceholder{echo: f.agent, f: f}, body: "nice work", key: "🎉"}
	f.start()
	f.awaitJoined()
	q := f.alice.SendText(f.room, "nice work")
	placeholder := f.awaitStage(q, journal.StageInitial)
	f.awaitSettled(q)
	f.awaitReaction(q)
	next := f.alice.SendText(f.room, "next")
	f.awaitInRoom(next)

	reactions, messages := f.agentEvents()
	if len(reactions) != 1 || reactions[0].Content.RelatesTo.EventID != q || reactions[0].Content.RelatesTo.Key != "🎉" {
		t.Fatalf("the agent's reactions = %+v, want 🎉 to %s once", reactions, q)
	}
	ph, ok := messages[placeholder]
	if !ok || ph.Unsigned.RedactedBecause == nil {
		t.Fatalf("the placeholder %s = %+v (in the room: %v), want it redacted", placeholder, ph, ok)
	}
	if _, err := f.view.Delivery(f.ctx, journal.ReplyDeliveryID(q), journal.StageFinal); err == nil {
		t.Fatal("the reacted-to message has a final message too")
	}
}
