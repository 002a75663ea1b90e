package dendrite

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
)

// RunTests is a TestMain for a package whose tests share one Dendrite: it
// launches the server, hands it to use, runs the tests, prints the tail of
// the server's log when they failed, stops the server and removes its
// directory. It returns the exit code for os.Exit.
func RunTests(m *testing.M, use func(*Server)) int {
	dir, err := os.MkdirTemp("", "dendrite-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	s, err := Launch(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start dendrite:", err)
		return 1
	}
	use(s)
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "dendrite log, last lines:\n%s\n", s.LogTail(logTail))
	}
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop dendrite:", err)
		return 1
	}
	return code
}

// Joined matches the n-th join of user to the room, for AwaitEvent: a
// join after a profile change counts as one too, so n counts joins as a
// timeline shows them.
func Joined(user string, n int) func(json.RawMessage) bool {
	joins := 0
	return func(raw json.RawMessage) bool {
		if memberEvent(raw, user) == "join" {
			joins++
		}
		return joins == n
	}
}

// memberEvent returns the membership an m.room.member event gives user,
// "" for any other event.
func memberEvent(raw json.RawMessage, user string) string {
	var ev struct {
		Type     string `json:"type"`
		StateKey string `json:"state_key"`
		Content  struct {
			Membership string `json:"membership"`
		} `json:"content"`
	}
	if json.Unmarshal(raw, &ev) != nil || ev.Type != "m.room.member" || ev.StateKey != user {
		return ""
	}
	return ev.Content.Membership
}
