package principal_test

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/mindroomd/mindroomd/agent"
	"sync"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/journal"
)

// recordingTransport refuses the first fail sends, as a homeserver that
// is briefly unavailable, and records the event IDs of the sends it lets
// through; attempted, when set, hears of each send once it is done.
type recordingTransport struct {
	principal.Transport
	mu        sync.Mutex
	fail      int
	sent      []string
	attempted chan struct{}
}

func (r *recordingTransport) Send(ctx context.Context, room, eventType, txnID string, content json.RawMessage) (string, error) {
	if r.attempted != nil {
		defer func() { r.attempted <- struct{}{} }()
	}
	r.mu.Lock()
	if r.fail > 0 {
		r.fail--
		r.mu.Unlock()
		return "", errors.New("homeserver unavailable")
	}
	r.mu.Unlock()
	id, err := r.Transport.Send(ctx, room, eventType, txnID, content)
	if err == nil {
		r.mu.Lock()
		r.sent = append(r.sent, id)
		r.mu.Unlock()
	}
	return id, err
}

func (r *recordingTransport) sentIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.sent...)
}

// wait waits for ch to close, or to yield a value, or for ctx to end,
// reporting whether ch did.
func wait(ctx context.Context, ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// awaitStage waits until the stage of the reply to source is acknowledged
// and returns its event ID.
func (f *fixture) awaitStage(source string, stage journal.Stage) string {
	f.t.Helper()
	sub := f.store.Hints().Subscribe(f.view.Principal().String())
	defer sub.Close()
	deadline := time.After(testDeadline)
	for {
		d, err := f.view.Delivery(f.ctx, journal.ReplyDeliveryID(source), stage)
		if err == nil && d.State == journal.DeliveryAcknowledged {
			return d.EventID
		}
		select {
		case <-sub.C():
		case <-deadline:
			f.t.Fatalf("the %s of the reply to %s was never acknowledged (last: %+v, %v)", stage, source, d, err)
			return ""
		}
	}
}

// awaitAdmitted waits until the principal's sync has admitted each event.
func (f *fixture) awaitAdmitted(ids ...string) {
	f.t.Helper()
	sub := f.store.Hints().Subscribe(f.view.Principal().String())
	defer sub.Close()
	deadline := time.After(testDeadline)
	for _, id := range ids {
		for {
			_, ok, err := f.view.AdmittedEvent(f.ctx, id)
			if err != nil {
				f.t.Fatal(err)
			}
			if ok {
				break
			}
			select {
			case <-sub.C():
			case <-deadline:
				f.t.Fatalf("%s was never admitted", id)
			}
		}
	}
}

// wireEvent is an event of the room's history as the tests read it.
type wireEvent struct {
	EventID string `json:"event_id"`
	Sender  string `json:"sender"`
	Content struct {
		Body       string `json:"body"`
		Status     string `json:"io.mindroom.stream_status"`
		NewContent *struct {
			Body   string `json:"body"`
			Status string `json:"io.mindroom.stream_status"`
		} `json:"m.new_content"`
		RelatesTo struct {
			RelType string `json:"rel_type"`
			EventID string `json:"event_id"`
		} `json:"m.relates_to"`
		Delivery *struct {
			Stage string `json:"stage"`
		} `json:"io.mindroomd.delivery"`
	} `json:"content"`
}

func TestProgressEditsThePlaceholderInPassingAndOnlyTheAnswerStays(t *testing.T) {
	f := newFixture(t)
	transport := &recordingTransport{fail: 1, attempted: make(chan struct{}, 8)}
	f.transport = func(tr principal.Transport) principal.Transport { transport.Transport = tr; return transport }
	f.placeholder = json.RawMessage(`{"msgtype":"m.text","body":"Thinking","io.mindroom.stream_status":"pending"}`)
	acknowledged, shown, finish := make(chan struct{}), make(chan struct{}), make(chan struct{})
	f.answer = agent.AgentFunc(func(ctx context.Context, turn agent.Turn) (agent.Reply, error) {
		if turn.Progress == nil {
			return agent.Reply{}, errors.New("no progress for a turn with a placeholder")
		}
		if !wait(ctx, acknowledged) {
			return agent.Reply{}, ctx.Err()
		}
		// Each text waits for its edit: handed over at once, they would be
		// coalesced to the newest.
		for _, text := range []string{
			"The answer", // refused: logged and dropped
			"The answer is",
			"The answer is 4",
		} {
			turn.Progress(ctx, text)
			if !wait(ctx, transport.attempted) {
				return agent.Reply{}, ctx.Err()
			}
		}
		close(shown)
		if !wait(ctx, finish) {
			return agent.Reply{}, ctx.Err()
		}
		return agent.Reply{Content: json.RawMessage(`{"msgtype":"m.text","body":"The answer is 42","io.mindroom.stream_status":"completed"}`)}, nil
	})
	f.start()
	f.awaitJoined()
	q := f.alice.SendText(f.room, "question")
	placeholder := f.awaitStage(q, journal.StageInitial)
	close(acknowledged)
	select {
	case <-shown:
	case <-time.After(testDeadline):
		t.Fatal("the agent never showed its progress")
	}

	// The edits reached the room and came back through sync, and the page
	// still shows the placeholder: progress is never projected.
	progress := transport.sentIDs()
	if len(progress) != 2 {
		t.Fatalf("%d progress edits sent, want 2 (the first was refused)", len(progress))
	}
	f.awaitAdmitted(progress...)
	if got := f.screen(func([]string) bool { return true }); !contains(got, "question", "Thinking") || contains(got, "The answer is 4") {
		t.Fatalf("the page during the stream = %q, want the question and the placeholder", got)
	}
	close(finish)
	final := f.awaitStage(q, journal.StageFinal)
	f.screen(func(s []string) bool { return contains(s, "question", "The answer is 42") && !contains(s, "Thinking") })

	byID := map[string]wireEvent{}
	for _, raw := range f.alice.Messages(f.room) {
		var ev wireEvent
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatal(err)
		}
		byID[ev.EventID] = ev
	}
	if ph := byID[placeholder]; ph.Content.Body != "Thinking" || ph.Content.Status != "pending" {
		t.Fatalf("placeholder = %+v, want Thinking, pending", ph.Content)
	}
	for i, want := range []string{"The answer is", "The answer is 4"} {
		ev := byID[progress[i]]
		c := ev.Content
		if ev.Sender != f.bot.UserID || c.RelatesTo.RelType != "m.replace" || c.RelatesTo.EventID != placeholder ||
			c.NewContent == nil || c.NewContent.Body != want || c.NewContent.Status != "streaming" || c.Status != "streaming" ||
			c.Body != "* "+want || c.Delivery != nil {
			t.Fatalf("progress edit %d = %+v (new content %+v), want an edit of the placeholder to %q marked streaming "+
				"in both contents, with no delivery marker", i, c, c.NewContent, want)
		}
	}
	c := byID[final].Content
	if c.RelatesTo.RelType != "m.replace" || c.RelatesTo.EventID != placeholder || c.NewContent == nil ||
		c.NewContent.Body != "The answer is 42" || journal.StreamInProgress(c.NewContent.Status) || journal.StreamInProgress(c.Status) ||
		c.Delivery == nil || c.Delivery.Stage != "final" {
		t.Fatalf("final = %+v (new content %+v), want the answer replacing the placeholder, not in progress", c, c.NewContent)
	}
}
