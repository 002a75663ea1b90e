package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/modelstub"
)

// slowMailTool is a tool that "sends mail": it appends "started" to the
// file $1 and waits for the file $1.gate before it appends "done" and
// answers "mail sent to <to>", so a test can kill the daemon while it
// runs.
const slowMailTool = `args=$(cat)
echo started >>"$1"
n=0
while [ ! -e "$1.gate" ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done
echo done >>"$1"
to=$(printf '%s' "$args" | sed -n 's/.*"to":"\([^"]*\)".*/\1/p')
printf 'mail sent to %s' "$to"
`

// awaitLines waits until path holds want lines.
func awaitLines(ctx context.Context, t *testing.T, path string, want int) []string {
	t.Helper()
	for {
		data, _ := os.ReadFile(path)
		if lines := strings.Fields(string(data)); len(lines) >= want {
			return lines
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never held %d lines", path, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestAnOpenAIToolApprovedInTheRoomRunsOnceWhateverKillsTheDaemon(t *testing.T) {
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	hs := dendrite.Start(t)
	bot := hs.Register(t, "model", "model-password-3c51")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	// The question is answered with a call of send_mail; the request that
	// carries the call's result, with a sentence quoting the result.
	// "after-run?" holds its second step until the test lets it go.
	release := make(chan struct{})
	holding := make(chan struct{}, 1)
	model := startModelStub(t, func(r modelstub.Request) modelstub.Reply {
		var question, result string
		for _, m := range r.Messages {
			switch m.Role {
			case "user":
				question = m.Content
			case "tool":
				result = m.Content
			}
		}
		if result == "" {
			return modelstub.Reply{ToolCalls: []modelstub.ToolCall{{ID: "call_1", Name: "send_mail",
				Arguments: fmt.Sprintf(`{"to":"%s"}`, strings.TrimSuffix(question, "?"))}}}
		}
		if question == "after-run?" {
			select {
			case holding <- struct{}{}:
				<-release
			default:
			}
		}
		return modelstub.Reply{Text: "Tool said: " + result}
	})
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs")
	command, err := json.Marshal([]string{"/bin/sh", "-c", slowMailTool, "tool", runs})
	if err != nil {
		t.Fatal(err)
	}
	cfg := writeOpenAIConfig(t, hs.URL, bot, model.URL, "api-token", fmt.Sprintf(`      tools:
        - name: send_mail
          description: Sends a mail.
          parameters: {type: object, properties: {to: {type: string}}, required: [to]}
          command: %s
`, command))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	daemon := startDaemonProcess(t, bin, cfg)
	defer func() {
		if t.Failed() {
			t.Logf("the daemon's log:\n%s", daemon.log)
		}
	}()
	alice.AwaitEvent(ctx, room, dendrite.Joined(bot.UserID, 1))

	card := func(question string) string {
		t.Helper()
		alice.SendText(room, question)
		return readApprovalContent(alice.AwaitEvent(ctx, room, func(raw json.RawMessage) bool {
			c := readApprovalContent(raw)
			return c.Sender == bot.UserID && c.Content.Approval != nil && c.Content.NewContent == nil &&
				strings.Contains(c.Content.Body, strings.TrimSuffix(question, "?"))
		})).ID
	}

	// Killed while the approved tool runs: the run was claimed, so the
	// restarted daemon never runs it again, and tells the model its
	// outcome is unknown.
	first := card("mid-run?")
	alice.React(room, first, "✅")
	awaitLines(ctx, t, runs, 1)
	daemon.kill(t)
	if err := os.WriteFile(runs+".gate", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	awaitLines(ctx, t, runs, 2) // the orphaned run finishes on its own
	daemon = startDaemonProcess(t, bin, cfg)
	awaitFinal(t, alice, room, bot.UserID,
		"Tool said: The daemon stopped while this call ran; whether it finished is not known, and it was not run again.")

	// Killed after the run, before the model's next step was answered: the
	// run's recorded result is given to the model, the tool is not run
	// again, and the step that called it is never asked again.
	second := card("after-run?")
	alice.React(room, second, "✅")
	select {
	case <-holding:
	case <-ctx.Done():
		t.Fatal("the step after the run was never asked")
	}
	daemon.kill(t)
	close(release)
	daemon = startDaemonProcess(t, bin, cfg)
	awaitFinal(t, alice, room, bot.UserID, "Tool said: mail sent to after-run")
	daemon.stop(t)

	if got := strings.Join(awaitLines(ctx, t, runs, 4), " "); got != "started done started done" {
		t.Fatalf("tool runs = %q, want two runs, one per approved call", got)
	}
	history := roomHistory(t, alice, room)
	for q, answer := range map[string]string{
		"mid-run?":   "Tool said: The daemon stopped while this call ran; whether it finished is not known, and it was not run again.",
		"after-run?": "Tool said: mail sent to after-run",
	} {
		if n := countFinals(history, bot.UserID, answer); n != 1 {
			t.Fatalf("%q has %d final answers in the room, want 1", q, n)
		}
		if got := model.Asked(q); got != 1 {
			t.Fatalf("the model was asked the step that calls the tool for %q %d times, want once", q, got)
		}
	}
	for _, c := range []string{first, second} {
		edits := 0
		for _, raw := range alice.Messages(room) {
			if e := readApprovalContent(raw); e.Content.Relates.RelType == "m.replace" && e.Content.Relates.EventID == c {
				edits++
				if e.Content.NewContent == nil || e.Content.NewContent.Approval == nil || e.Content.NewContent.Approval.State != "approved" {
					t.Fatalf("the card's edit = %+v, want it approved", e)
				}
			}
		}
		if edits != 1 {
			t.Fatalf("card %s was edited %d times, want once", c, edits)
		}
	}
}
