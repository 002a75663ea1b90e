package agent_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/agent"
)

func TestAReplyIsExactlyOneAnswer(t *testing.T) {
	text := json.RawMessage(`{"msgtype":"m.text","body":"hi"}`)
	file := &agent.File{Path: "/tmp/chart.png", Caption: "the chart"}
	for _, c := range []struct {
		name  string
		reply agent.Reply
		want  string // "" for valid
	}{
		{"Ignore", agent.Reply{Ignore: true}, ""},
		{"React", agent.Reply{React: "👍"}, ""},
		{"Content", agent.Reply{Content: text}, ""},
		{"AttachmentWithCaption", agent.Reply{Attachment: file}, ""},
		{"Nothing", agent.Reply{}, "no answer"},
		{"ContentAndAttachment", agent.Reply{Content: text, Attachment: file}, "more than one"},
		{"IgnoreAndReact", agent.Reply{Ignore: true, React: "👍"}, "more than one"},
		{"ReactAndContent", agent.Reply{React: "👍", Content: text}, "more than one"},
		{"BadReactionKey", agent.Reply{React: " 👍"}, "a reaction key must be"},
		{"AttachmentWithoutPath", agent.Reply{Attachment: &agent.File{Name: "x.png"}}, "an attachment without a path"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.reply.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want a valid reply", err)
				}
				return
			}
			if !errors.Is(err, agent.ErrInvalidReply) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate() = %v, want ErrInvalidReply: %s", err, c.want)
			}
		})
	}
}
