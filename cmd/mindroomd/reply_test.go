package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// apiSent is what a test reads of an event as the homeserver serves it.
type apiSent struct {
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

// An outside agent answers a thread reply Element sent as
// io.element.thread (Dendrite advertises no spec version from v1.4 on):
// the work names its thread, the thread's page lists it, and the answer,
// markdown by default, goes out in the thread as a genuine reply with its
// sanitised HTML. An answer posted with format plain goes out without HTML.
func TestAnOutsideAgentsAnswersAreFormattedAndThreadedAsTheyAsk(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "formatted", "formatted-password-7e2b")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	const token = "api-token-for-the-formatted-agent"
	d := runInProcess(writeHTTPAgentConfig(t, hs.URL, bot, "formatted", token))
	defer d.stopCleanly(t)
	base := "http://" + daemonAddress(t, d.log) + "/v1/agents/formatted"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice.AwaitEvent(ctx, room, dendrite.Joined(bot.UserID, 1))

	root := alice.SendText(room, "the root")
	inThread := alice.Send(room, "m.room.message", map[string]any{
		"msgtype": "m.text", "body": "asked in the thread",
		"m.relates_to": map[string]any{"rel_type": "io.element.thread", "event_id": root,
			"is_falling_back": true, "m.in_reply_to": map[string]any{"event_id": root}},
	})
	type pendingEvent struct {
		EventID  string  `json:"event_id"`
		ThreadID *string `json:"thread_id"`
	}
	pending := map[string]pendingEvent{}
	after := "0"
	for pending[inThread].EventID == "" {
		var page struct {
			Events []struct {
				pendingEvent
				Position int64 `json:"position"`
			} `json:"events"`
			TimedOut bool `json:"timed_out"`
		}
		if code := apiCall(t, "GET", base+"/pending?wait=30s&after="+after, token, "", &page); code != http.StatusOK || page.TimedOut {
			t.Fatalf("pending: status %d, timed out %v", code, page.TimedOut)
		}
		for _, e := range page.Events {
			pending[e.EventID] = e.pendingEvent
			after = strconv.FormatInt(e.Position, 10)
		}
	}
	if th := pending[inThread].ThreadID; th == nil || *th != root {
		t.Fatalf("the thread reply is pending with thread %v, want %s", th, root)
	}
	var thread struct {
		Messages []struct {
			EventID string `json:"event_id"`
		} `json:"messages"`
	}
	if code := apiCall(t, "GET", base+"/rooms/"+url.PathEscape(room)+"/messages?thread="+url.QueryEscape(root), token, "", &thread); code != http.StatusOK {
		t.Fatalf("thread page: status %d", code)
	}
	listed := false
	for _, m := range thread.Messages {
		listed = listed || m.EventID == inThread
	}
	if !listed {
		t.Fatalf("the thread page lists %+v, not the thread reply %s", thread.Messages, inThread)
	}

	const markdown = "**bold** and `code` <script>alert(1)</script>"
	answer, _ := json.Marshal(map[string]string{"body": markdown})
	if code := apiCall(t, "POST", base+"/events/"+url.PathEscape(inThread)+"/reply", token, string(answer), nil); code != http.StatusOK {
		t.Fatalf("markdown reply: status %d", code)
	}
	plain, _ := json.Marshal(map[string]string{"body": "**not bold**", "format": "plain"})
	if code := apiCall(t, "POST", base+"/events/"+url.PathEscape(root)+"/reply", token, string(plain), nil); code != http.StatusOK {
		t.Fatalf("plain reply: status %d", code)
	}

	md := awaitSent(ctx, alice, room, bot.UserID, markdown)
	if rel := md.Content.RelatesTo; rel == nil || rel.RelType != "m.thread" || rel.EventID != root ||
		rel.InReplyTo == nil || rel.InReplyTo.EventID != inThread || rel.IsFallingBack == nil || *rel.IsFallingBack {
		t.Fatalf("the answer relates as %+v, want a genuine reply to %s in the thread of %s", rel, inThread, root)
	}
	if md.Content.Format != "org.matrix.custom.html" || !strings.Contains(md.Content.FormattedBody, "<strong>bold</strong>") ||
		!strings.Contains(md.Content.FormattedBody, "<code>code</code>") || strings.Contains(md.Content.FormattedBody, "script") {
		t.Fatalf("the markdown answer went out as format %q, formatted_body %q; want sanitised HTML with <strong> and <code>",
			md.Content.Format, md.Content.FormattedBody)
	}
	pl := awaitSent(ctx, alice, room, bot.UserID, "**not bold**")
	if pl.Content.Format != "" || pl.Content.FormattedBody != "" {
		t.Fatalf("the plain answer went out with format %q, formatted_body %q", pl.Content.Format, pl.Content.FormattedBody)
	}
}

// awaitSent waits until u's sync shows sender's message whose body is body.
func awaitSent(ctx context.Context, u *dendrite.User, room, sender, body string) apiSent {
	var ev apiSent
	u.AwaitEvent(ctx, room, func(raw json.RawMessage) bool {
		ev = apiSent{}
		return json.Unmarshal(raw, &ev) == nil && ev.Sender == sender && ev.Content.Body == body
	})
	return ev
}
