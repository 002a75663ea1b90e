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
)

func TestRunKeepsAFailedExecTurnPendingAndAnswersOnceTheAgentRecovers(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "script", "script-password-7e3a")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte(bot.Password), 0o600); err != nil {
		t.Fatal(err)
	}
	// The agent fails until the test creates healed, then answers: a shell
	// script, so the test needs no interpreter beyond /bin/sh.
	healed := filepath.Join(dir, "healed")
	cfg := writeExecScriptConfig(t, dir, hs.URL, bot,
		`cat >/dev/null; if [ -e "$1" ]; then printf '{"body": "from the script"}'; else echo "model unreachable" >&2; exit 3; fi`, healed)
	d := runInProcess(cfg)
	defer d.stopCleanly(t)
	log := d.log

	question := alice.SendText(room, "are you there?")
	for deadline := time.Now().Add(time.Minute); !failedTurnLogged(log.String(), question); {
		select {
		case code := <-d.done:
			d.done <- code
			t.Fatalf("the daemon exited %d; its log:\n%s", code, log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failed turn was logged for %s; the log:\n%s", question, log)
		}
	}
	if err := os.WriteFile(healed, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice.AwaitEvent(actx, room, func(raw json.RawMessage) bool {
		return strings.Contains(string(raw), `"from the script"`)
	})
}

// failedTurnLogged reports whether the log holds the worker's line for a
// failed turn of eventID, carrying the agent's exit status and stderr.
func failedTurnLogged(log, eventID string) bool {
	for _, line := range strings.Split(log, "\n") {
		var l struct {
			Message string `json:"message"`
			EventID string `json:"event_id"`
			Error   string `json:"error"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Message == "Turn failed; the event stays pending" &&
			l.EventID == eventID && l.Error == "agent: exec agent: exit status 3: stderr: model unreachable" {
			return true
		}
	}
	return false
}

// writeExecScriptConfig writes, into dir beside the agent's password file
// pw, a configuration of one exec agent named script that runs the shell
// script with args as $1, $2, ..., and returns its path.
func writeExecScriptConfig(t *testing.T, dir, homeserver string, bot dendrite.Account, script string, args ...string) string {
	t.Helper()
	command, err := json.Marshal(append([]string{"/bin/sh", "-c", script, "agent"}, args...))
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "mindroom.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`homeserver: %s
storage: ./storage
listen: 127.0.0.1:0
agents:
  - name: script
    user_id: "%s"
    password_file: pw
    auto_join: true
    backend:
      type: exec
      command: %s
      timeout: 20s
`, homeserver, bot.UserID, command)), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}
