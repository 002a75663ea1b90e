package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The curl walk-through in examples/ runs as written against a live daemon
// on Dendrite: every route it shows answers, the keyed message reaches the
// person once, and the pending question is answered with its file.
func TestTheCurlWalkThroughRunsAgainstTheDaemon(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the walk-through needs %s on PATH (.ci/run installs it): %v", tool, err)
		}
	}
	s := startSurfaceAgent(t, "walker")
	question := s.say(s.room, "a question for the walk-through")
	cmd := exec.CommandContext(s.ctx, "bash", filepath.Join("..", "..", "examples", "curl-walkthrough.sh"))
	cmd.Env = append(cmd.Environ(), "API="+s.base, "TOKEN="+s.token)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("the walk-through failed: %v\n%s", err, out.String())
	}
	for _, want := range []string{`"outcome":"created"`, `"outcome":"replayed"`, `"typing":true`, `"user_id":"@alice:`} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("the walk-through's output lacks %s:\n%s", want, out.String())
		}
	}
	history := surfaceHistory(t, s.alice, s.room)
	hello, files := 0, 0
	for _, e := range history {
		if e.Sender != s.bot.UserID {
			continue
		}
		c := e.Content
		if c.Body == "Hello from the **walk-through**" {
			hello++
		}
		if c.Msgtype == "m.file" && c.RelatesTo != nil && c.RelatesTo.InReplyTo != nil && c.RelatesTo.InReplyTo.EventID == question {
			files++
		}
	}
	if hello != 1 || files != 1 {
		t.Fatalf("the room shows the keyed message %d times and the file answer %d times, want 1 and 1", hello, files)
	}
}
