package principal_test

import (
	"context"
	"encoding/json"
	"github.com/mindroomd/mindroomd/agent"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// sent is what a test reads of an event as the homeserver serves it.
type sent struct {
	EventID string `json:"event_id"`
	Sender  string `json:"sender"`
	Content struct {
		Body          string `json:"body"`
		Format        string `json:"format"`
		FormattedBody string `json:"formatted_body"`
		RelatesTo     *struct {
			RelType       string `json:"rel_type"`
			EventID       string `json:"event_id"`
			IsFallingBack *bool  `json:"is_falling_back"`
			InReplyTo     *struct {
				EventID string `json:"event_id"`
			} `json:"m.in_reply_to"`
		} `json:"m.relates_to"`
	} `json:"content"`
}

// awaitAnswer waits until alice's sync shows the agent's message whose
// body is body, and returns it as the homeserver sent it.
func (f *fixture) awaitAnswer(body string) sent {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, testDeadline)
	defer cancel()
	var ev sent
	f.alice.AwaitEvent(ctx, f.room, func(raw json.RawMessage) bool {
		ev = sent{}
		return json.Unmarshal(raw, &ev) == nil && ev.Sender == f.bot.UserID && ev.Content.Body == body
	})
	return ev
}

// page waits until the conversation page req reads satisfies want, and
// returns its bodies.
func (f *fixture) page(req journal.ReadRequest, want func([]string) bool) []string {
	f.t.Helper()
	sub := f.store.Hints().Subscribe(f.view.Principal().String())
	defer sub.Close()
	deadline := time.After(testDeadline)
	for {
		page, err := f.view.Read(f.ctx, req)
		if err != nil {
			f.t.Fatal(err)
		}
		var got []string
		for _, m := range page.Messages {
			var c struct {
				Body string `json:"body"`
			}
			_ = json.Unmarshal(m.Content, &c)
			got = append(got, c.Body)
		}
		if want(got) {
			return got
		}
		select {
		case <-sub.C():
		case <-deadline:
			f.t.Fatalf("the page never reached the expected state; last page: %q", got)
			return nil
		}
	}
}

// Element sends a thread reply as io.element.thread to a homeserver that
// advertises no spec version from v1.4 on, as Dendrite 0.13 does. It is a
// thread reply all the same: answered in the thread, on the thread's page,
// not on the room's.
func TestAThreadReplyUnderTheUnstableRelationIsAnsweredInItsThread(t *testing.T) {
	f := newFixture(t)
	f.start()
	f.awaitJoined()
	root := f.alice.SendText(f.room, "root")
	f.awaitReply("root")
	question := f.alice.Send(f.room, "m.room.message", map[string]any{
		"msgtype": "m.text", "body": "in the thread",
		"m.relates_to": map[string]any{"rel_type": "io.element.thread", "event_id": root,
			"is_falling_back": true, "m.in_reply_to": map[string]any{"event_id": root}},
	})

	answer := f.awaitAnswer("echo: in the thread")
	rel := answer.Content.RelatesTo
	if rel == nil || rel.RelType != journal.RelThread || rel.EventID != root || rel.InReplyTo == nil || rel.InReplyTo.EventID != question {
		t.Fatalf("the answer relates as %+v, want a reply to %s in the thread of %s", rel, question, root)
	}
	thread := f.page(journal.ReadRequest{RoomID: f.room, Thread: &root, Limit: 100}, func(s []string) bool {
		return contains(s, "root", "in the thread", "echo: in the thread")
	})
	room := f.page(journal.ReadRequest{RoomID: f.room, Limit: 100}, func(s []string) bool { return contains(s, "root", "echo: root") })
	if contains(room, "in the thread") || contains(room, "echo: in the thread") {
		t.Fatalf("the room page lists the thread's messages: %q (thread page %q)", room, thread)
	}
}

// A reply in a thread answers the event it names: its m.in_reply_to is the
// real reply, not the fallback for clients without threads.
func TestAnAnswerInAThreadIsAGenuineReplyNotAFallback(t *testing.T) {
	f := newFixture(t)
	f.start()
	f.awaitJoined()
	root := f.alice.SendText(f.room, "root")
	f.awaitReply("root")
	question := f.alice.ThreadReply(f.room, root, "asked in the thread")

	answer := f.awaitAnswer("echo: asked in the thread")
	rel := answer.Content.RelatesTo
	if rel == nil || rel.RelType != journal.RelThread || rel.InReplyTo == nil || rel.InReplyTo.EventID != question {
		t.Fatalf("the answer relates as %+v, want a reply to %s in the thread", rel, question)
	}
	if rel.IsFallingBack == nil || *rel.IsFallingBack {
		t.Fatalf("the answer's is_falling_back = %v, want false", rel.IsFallingBack)
	}
}

// LLM agents answer in markdown; the answer goes out with its sanitised
// HTML, so clients show the formatting, while an answer of plain text goes
// out as it is.
func TestAMarkdownAnswerIsSentWithSanitisedHTMLAndPlainTextWithout(t *testing.T) {
	const markdown = "**bold** and `code` <script>alert(1)</script>"
	f := newFixture(t)
	f.answer = agent.AgentFunc(func(_ context.Context, turn agent.Turn) (agent.Reply, error) {
		var ev struct {
			Content struct {
				Body string `json:"body"`
			} `json:"content"`
		}
		_ = json.Unmarshal(turn.Event.Event, &ev)
		body := "plain words, no markup"
		if ev.Content.Body == "markdown please" {
			body = markdown
		}
		content, err := json.Marshal(map[string]string{"msgtype": "m.text", "body": body})
		return agent.Reply{Content: content}, err
	})
	f.start()
	f.awaitJoined()
	f.alice.SendText(f.room, "markdown please")
	f.alice.SendText(f.room, "plain please")

	md := f.awaitAnswer(markdown)
	if md.Content.Format != "org.matrix.custom.html" || !strings.Contains(md.Content.FormattedBody, "<strong>bold</strong>") ||
		!strings.Contains(md.Content.FormattedBody, "<code>code</code>") || strings.Contains(md.Content.FormattedBody, "script") {
		t.Fatalf("the markdown answer went out as format %q, formatted_body %q; want sanitised HTML with <strong> and <code>",
			md.Content.Format, md.Content.FormattedBody)
	}
	plain := f.awaitAnswer("plain words, no markup")
	if plain.Content.Format != "" || plain.Content.FormattedBody != "" {
		t.Fatalf("the plain answer gained format %q, formatted_body %q", plain.Content.Format, plain.Content.FormattedBody)
	}
}
