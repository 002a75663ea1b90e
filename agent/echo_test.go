package agent_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/journal"
)

func TestEchoAnswersATextMessageWithItsBody(t *testing.T) {
	for _, c := range []struct {
		name, event string
		kind        journal.Kind
		want        string // "" for an ignored turn
	}{
		{"Text", `{"content":{"body":"hi","msgtype":"m.text"},"type":"m.room.message"}`, journal.KindMessage, "echo: hi"},
		{"OnlyTheExactKeyCounts", `{"CONTENT":{"body":"not this"},"content":{"body":"this"}}`, journal.KindMessage, "echo: this"},
		{"NoBody", `{"content":{"msgtype":"m.text"}}`, journal.KindMessage, "echo: "},
		{"AReactionIsIgnored", `{"content":{}}`, journal.KindReaction, ""},
		{"MediaIsIgnored", `{"content":{"body":"photo.png"}}`, journal.KindMedia, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := agent.Echo{}.Answer(context.Background(), agent.Turn{Event: journal.PendingEvent{Kind: c.kind, Event: json.RawMessage(c.event)}})
			if err != nil {
				t.Fatal(err)
			}
			if c.want == "" {
				if !r.Ignore {
					t.Fatalf("reply = %s, want the turn ignored", r.Content)
				}
				return
			}
			var content struct {
				Body string `json:"body"`
			}
			if err := json.Unmarshal(r.Content, &content); err != nil || content.Body != c.want || r.Ignore {
				t.Fatalf("reply = %s (ignore %v), want body %q", r.Content, r.Ignore, c.want)
			}
		})
	}
}

func TestEchoRefusesAnEventWhoseBodyIsNotText(t *testing.T) {
	_, err := agent.Echo{}.Answer(context.Background(), agent.Turn{Event: journal.PendingEvent{Kind: journal.KindMessage,
		Event: json.RawMessage(`{"content":{"body":7}}`)}})
	if err == nil {
		t.Fatal("a numeric body was echoed")
	}
}
