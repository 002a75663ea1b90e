package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
	"github.com/mindroomd/mindroomd/testsupport/modelstub"
)

// streamedContent is what the streamed-answer test reads of a message's
// content, as the person decrypted it.
type streamedContent struct {
	Body       string `json:"body"`
	Status     string `json:"io.mindroom.stream_status"`
	NewContent *struct {
		Body     string `json:"body"`
		Status   string `json:"io.mindroom.stream_status"`
		Delivery *struct {
			Stage string `json:"stage"`
		} `json:"io.mindroomd.delivery"`
	} `json:"m.new_content"`
	RelatesTo *struct {
		RelType   string `json:"rel_type"`
		EventID   string `json:"event_id"`
		InReplyTo *struct {
			EventID string `json:"event_id"`
		} `json:"m.in_reply_to"`
	} `json:"m.relates_to"`
	Delivery *struct {
		Stage string `json:"stage"`
	} `json:"io.mindroomd.delivery"`
}

// readStreamed reads content; false when it is not an object of that shape.
func readStreamed(content map[string]any) (streamedContent, bool) {
	var c streamedContent
	b, err := json.Marshal(content)
	return c, err == nil && json.Unmarshal(b, &c) == nil
}

// replaces reports whether c is an edit of target.
func (c streamedContent) replaces(target string) bool {
	return c.RelatesTo != nil && c.RelatesTo.RelType == "m.replace" && c.RelatesTo.EventID == target && c.NewContent != nil
}

// inProgress reports whether c, an edit, still shows its answer being
// written.
func (c streamedContent) inProgress() bool {
	return c.NewContent != nil && journal.StreamInProgress(c.NewContent.Status)
}

// streamedPlaceholder is the placeholder the openai back-end has sent
// before a streamed answer.
func streamedPlaceholder(t *testing.T) streamedContent {
	t.Helper()
	raw := agent.NewOpenAI(agent.OpenAIOptions{BaseURL: "http://127.0.0.1:1/v1", Model: "stub-model", Stream: true}).Placeholder()
	var c streamedContent
	if err := json.Unmarshal(raw, &c); err != nil || c.Body == "" || !journal.StreamInProgress(c.Status) {
		t.Fatalf("the streamed back-end's placeholder %s: %v; want a body marked in progress", raw, err)
	}
	return c
}

// wireType is the type an event had on the wire, as the server sent it.
func wireType(raw json.RawMessage) string {
	var ev struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &ev)
	return ev.Type
}

// awaitSealedFrom waits until p reads a message from sender in room whose
// content match accepts, encrypted or not, and fails the test unless it
// came sealed, as m.room.encrypted, and p decrypted it. what names it.
func awaitSealedFrom(ctx context.Context, t *testing.T, p *e2eeperson.Person, room, sender, what string,
	match func(streamedContent) bool) (string, streamedContent) {
	t.Helper()
	var wire string
	id, content := p.AwaitDecrypted(ctx, room, func(typ string, content map[string]any, raw json.RawMessage) bool {
		c, ok := readStreamed(content)
		var ev struct {
			Sender string `json:"sender"`
		}
		if typ != "m.room.message" || !ok || json.Unmarshal(raw, &ev) != nil || ev.Sender != sender || !match(c) {
			return false
		}
		wire = wireType(raw)
		return true
	})
	if wire != "m.room.encrypted" {
		t.Fatalf("%s (%s) went out in the clear, as %s: in an encrypted room the agent sends only m.room.encrypted", what, id, wire)
	}
	c, _ := readStreamed(content)
	return id, c
}

func TestAStreamedAnswerInAnEncryptedRoomIsSealedFromPlaceholderToFinalEdit(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "model", "model-password-7c3e")
	alice := e2eeperson.New(t, hs, hs.Register(t, "alice", "alice-password"))
	questions := []string{"Is the placeholder sealed?", "And every edit after it?"}
	// Each answer's stream stops after its first word until alice has read
	// its placeholder (so the placeholder is acknowledged before progress
	// is due); then a word comes every 150 ms: the dozen words left take
	// longer than agent.ProgressInterval, so the answer is shown while it
	// is written.
	read := map[string]chan struct{}{}
	for _, q := range questions {
		read[q] = make(chan struct{})
	}
	model := startModelStub(t, func(r modelstub.Request) modelstub.Reply {
		placeholderRead := read[r.Question()]
		return modelstub.Reply{Text: answerTo(r.Question()), Delay: 150 * time.Millisecond,
			OnChunk: func(ctx context.Context, n int) {
				if n == 1 && placeholderRead != nil {
					select {
					case <-placeholderRead:
					case <-ctx.Done():
					}
				}
			}}
	})
	const token = "api-token-of-the-sealed-model"
	d := runInProcess(writeOpenAIConfig(t, hs.URL, bot, model.URL, token))
	t.Cleanup(func() { d.stopCleanly(t) })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the daemon's log:\n%s", d.log)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	room := alice.CreateEncryptedRoom(bot.UserID)
	alice.AwaitDecrypted(ctx, room, joinedBy(bot.UserID))
	placeholder := streamedPlaceholder(t)

	for _, q := range questions {
		asked := alice.SendText(room, q)
		shown, c := awaitSealedFrom(ctx, t, alice, room, bot.UserID, "the placeholder of "+q, func(c streamedContent) bool {
			return c.RelatesTo != nil && c.RelatesTo.InReplyTo != nil && c.RelatesTo.InReplyTo.EventID == asked
		})
		if c.Body != placeholder.Body || c.Status != placeholder.Status || c.NewContent != nil {
			t.Fatalf("the first message answering %q = %+v, want the placeholder %q marked %q", q, c, placeholder.Body, placeholder.Status)
		}
		close(read[q])

		final, c := awaitSealedFrom(ctx, t, alice, room, bot.UserID, "the final answer to "+q, func(c streamedContent) bool {
			return c.replaces(shown) && !c.inProgress()
		})
		if c.NewContent.Body != answerTo(q) || c.NewContent.Status != agent.StreamCompleted ||
			c.Delivery == nil || c.Delivery.Stage != "final" {
			t.Fatalf("the final edit %s of the placeholder of %q = %+v, want the model's whole answer %q marked %q",
				final, q, c.NewContent, answerTo(q), agent.StreamCompleted)
		}

		// Alice read the final after every edit the agent sent before it:
		// each came sealed, showed the answer as far as it was written,
		// and only one edit ended the stream.
		progress, finals := 0, 0
		for _, e := range alice.DecryptedTimeline(room) {
			c, ok := readStreamed(e.Content)
			if e.Sender != bot.UserID || e.Type != "m.room.message" || !ok || !c.replaces(shown) {
				continue
			}
			if !e.Encrypted {
				t.Fatalf("edit %s of the placeholder of %q went out in the clear, as %s", e.EventID, q, wireType(e.Raw))
			}
			if !c.inProgress() {
				finals++
				continue
			}
			progress++
			if c.Status != "streaming" || c.Delivery != nil || !strings.HasPrefix(answerTo(q), c.NewContent.Body) {
				t.Fatalf("progress edit %s of %q = %+v (new content %+v), want a start of %q marked streaming, without a delivery marker",
					e.EventID, q, c, c.NewContent, answerTo(q))
			}
		}
		if progress == 0 {
			t.Fatalf("the answer to %q was never shown in progress", q)
		}
		if finals != 1 {
			t.Fatalf("the placeholder of %q was ended by %d edits, want 1", q, finals)
		}
	}

	// Nothing the agent put into the room went out in the clear, and alice
	// decrypted all of it; each question has exactly one final answer.
	finals := map[string]int{}
	for _, e := range alice.DecryptedTimeline(room) {
		var ev struct {
			StateKey *string `json:"state_key"`
		}
		if e.Sender != bot.UserID || json.Unmarshal(e.Raw, &ev) != nil || ev.StateKey != nil {
			continue
		}
		if !e.Encrypted || e.Err != nil {
			t.Fatalf("the agent's %s (%s, %s on the wire) is not one alice decrypted: %v", e.EventID, e.Type, wireType(e.Raw), e.Err)
		}
		if c, ok := readStreamed(e.Content); ok && c.Delivery != nil && c.Delivery.Stage == "final" && c.NewContent != nil {
			finals[c.NewContent.Body]++
		}
	}
	for _, q := range questions {
		if finals[answerTo(q)] != 1 {
			t.Fatalf("final answers = %v, want %q answered once", finals, q)
		}
	}

	// The agent joins a room it is invited to only once it has admitted
	// the sync batch that brought the invite, and the echo of the last
	// final came in that batch or an earlier one: once alice sees it join,
	// the daemon's projection holds every final answer.
	other := alice.CreateEncryptedRoom(bot.UserID)
	alice.AwaitDecrypted(ctx, other, joinedBy(bot.UserID))

	// The agent API shows the conversation as alice reads it: each question
	// and its whole answer, nothing of the placeholders or the progress.
	var page struct {
		Messages []struct {
			Content struct {
				Body   string `json:"body"`
				Status string `json:"io.mindroom.stream_status"`
			} `json:"content"`
		} `json:"messages"`
	}
	u := "http://" + daemonAddress(t, d.log) + "/v1/agents/model/rooms/" + url.PathEscape(room) + "/messages?limit=50"
	if code := apiCall(t, "GET", u, token, "", &page); code != http.StatusOK {
		t.Fatalf("messages: status %d", code)
	}
	got := map[string]int{}
	for _, m := range page.Messages {
		if journal.StreamInProgress(m.Content.Status) || m.Content.Body == placeholder.Body {
			t.Fatalf("the conversation shows %q (%q), still in progress", m.Content.Body, m.Content.Status)
		}
		got[m.Content.Body]++
	}
	for _, q := range questions {
		if got[q] != 1 || got[answerTo(q)] != 1 {
			t.Fatalf("the conversation = %v, want %q and its answer once each", got, q)
		}
	}
	if len(page.Messages) != 2*len(questions) {
		t.Fatalf("the conversation = %v, want only the questions and one answer each", got)
	}
}
