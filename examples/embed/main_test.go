package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// The example is tested as its reader runs it: built, then started as a
// program of its own.

// binDir holds the program built for the tests; TestMain removes it.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mindroomd-embed-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// build compiles the example, once per test run. Under -race it builds
// with -race too, so a race in the program fails its exit status.
var build = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(binDir, "embed")
	args := []string{"build", "-buildvcs=false", "-o", bin}
	if raceEnabled() {
		args = append(args, "-race")
	}
	if out, err := exec.Command("go", append(args, ".")...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
})

// built is the program's path; a failed build fails t.
func built(t *testing.T) string {
	t.Helper()
	bin, err := build()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// raceEnabled reports whether this test binary was built with -race.
func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// start runs the built program with args and env; the test's end kills it
// if it still runs. Its stderr is read once it has exited.
func start(t *testing.T, bin string, env []string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	// A race-enabled program otherwise lingers a second at exit.
	cmd.Env = append(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Logf("the program's stderr:\n%s", stderr.String())
		}
	})
	return cmd, &stderr
}

// event is the part of a timeline event the test reads.
type event struct {
	Type     string `json:"type"`
	Sender   string `json:"sender"`
	StateKey string `json:"state_key"`
	Content  struct {
		Body       string `json:"body"`
		Membership string `json:"membership"`
	} `json:"content"`
}

func decode(raw json.RawMessage) event {
	var ev event
	_ = json.Unmarshal(raw, &ev)
	return ev
}

func TestTheEmbeddedAgentAnswersEachMessageOnceAndExitsZeroOnSIGTERM(t *testing.T) {
	bin := built(t)
	hs := dendrite.Start(t)
	bot := hs.Register(t, "shout", "shout-password-5d81")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)

	cmd, stderr := start(t, bin, []string{"MINDROOM_PASSWORD=" + bot.Password},
		"-homeserver", hs.URL, "-user", bot.UserID, "-storage", t.TempDir())
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// The agent accepts its invite; what is said after its join is live work.
	alice.AwaitEvent(ctx, room, func(raw json.RawMessage) bool {
		ev := decode(raw)
		return ev.Type == "m.room.member" && ev.StateKey == bot.UserID && ev.Content.Membership == "join"
	})
	answer := func(body string) func(json.RawMessage) bool {
		return func(raw json.RawMessage) bool {
			ev := decode(raw)
			return ev.Sender == bot.UserID && ev.Content.Body == body
		}
	}
	alice.SendText(room, "hello")
	alice.AwaitEvent(ctx, room, answer("you said: HELLO"))
	// The second answer repeats the first message: the agent read it from
	// the conversation the journal keeps.
	alice.SendText(room, "and again")
	alice.AwaitEvent(ctx, room, answer("you said: AND AGAIN (before that: HELLO)"))

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM the program ended with %v, want exit status 0; its stderr:\n%s", err, stderr)
	}
	answers := map[string]int{}
	for _, raw := range alice.Messages(room) {
		if ev := decode(raw); ev.Sender == bot.UserID && ev.Type == "m.room.message" {
			answers[ev.Content.Body]++
		}
	}
	if len(answers) != 2 || answers["you said: HELLO"] != 1 || answers["you said: AND AGAIN (before that: HELLO)"] != 1 {
		t.Fatalf("the agent's messages in the room = %v, want each answer once", answers)
	}
	if strings.Contains(stderr.String(), bot.Password) {
		t.Fatal("the program logged the agent's password")
	}
}

func TestTheEmbeddedAgentWithoutAPasswordIsAUsageError(t *testing.T) {
	bin := built(t)
	storage := filepath.Join(t.TempDir(), "storage")
	cmd, stderr := start(t, bin, []string{"MINDROOM_PASSWORD="},
		"-homeserver", "http://127.0.0.1:1", "-user", "@shout:localhost", "-storage", storage)
	var exit *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("without a password the program ended with %v, want exit status 2; its stderr:\n%s", err, stderr)
	}
	if !strings.Contains(stderr.String(), "MINDROOM_PASSWORD") {
		t.Fatalf("the usage error does not name the password's variable: %s", stderr)
	}
	if _, err := os.Stat(storage); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the journal's directory was created before the refusal: %v", err)
	}
}
