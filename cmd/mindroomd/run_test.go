package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/logbuf"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// writeDaemonConfig writes a configuration of one echo agent, its secret in
// a file beside it, and returns its path.
func writeDaemonConfig(t *testing.T, homeserver string, bot dendrite.Account, storage string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "echo.password"), []byte(bot.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`homeserver: %s
storage: %s
listen: 127.0.0.1:0
agents:
  - name: echo
    user_id: "%s"
    password_file: ./echo.password
    auto_join: true
    backend:
      type: echo
`, homeserver, storage, bot.UserID)
	path := filepath.Join(dir, "mindroom.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeHTTPAgentConfig writes a configuration of one agent named name with
// the http back-end (the work is left to an agent outside the process), its
// password and API token in files beside it, storage in ./storage, and
// returns its path.
func writeHTTPAgentConfig(t *testing.T, homeserver string, bot dendrite.Account, name, token string) string {
	t.Helper()
	return writeAgentConfig(t, homeserver, bot, name, token, "http", t.TempDir())
}

// writeAgentConfig writes into dir a configuration of one agent named name
// with the back-end of type backend, its password and API token in files
// beside it, storage in ./storage, and extra top-level lines; it returns
// its path.
func writeAgentConfig(t *testing.T, homeserver string, bot dendrite.Account, name, token, backend, dir string, extra ...string) string {
	t.Helper()
	for file, v := range map[string]string{"pw": bot.Password, "tok": token} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "mindroom.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`homeserver: %s
storage: ./storage
listen: 127.0.0.1:0
%sagents:
  - name: %s
    user_id: "%s"
    password_file: pw
    api_token_file: tok
    auto_join: true
    backend:
      type: %s
`, homeserver, strings.Join(extra, ""), name, bot.UserID, backend)), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestRunAnswersThroughTheEchoAgentAndStopsCleanly(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "echo", "echo-password-4c1d")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	storage := t.TempDir()
	cfg := writeDaemonConfig(t, hs.URL, bot, storage)

	start := func() (func() int, *logbuf.Buffer) {
		d := runInProcess(cfg)
		return func() int { return d.stop(t) }, d.log
	}
	awaitEcho := func(text string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		alice.AwaitEvent(ctx, room, dendrite.Says(bot.UserID, "echo: "+text))
	}

	stop, log := start()
	alice.SendText(room, "hello")
	awaitEcho("hello")
	scrape := metricsOf(t, log)
	for _, want := range []string{
		`mindroomd_admitted_events_total{agent="echo",outcome="admitted"}`,
		`mindroomd_delivery_steps_total{agent="echo",step="claimed"}`,
		`mindroomd_pending_events{agent="echo",user_id="` + bot.UserID + `"} 0`,
		`mindroomd_unacknowledged_replies{agent="echo",state="queued",user_id="` + bot.UserID + `"}`,
		`mindroomd_writer_commit_seconds_count`,
		`mindroomd_sync_lag_seconds{agent="echo"}`,
		`mindroomd_journal_readable 1`,
	} {
		if !strings.Contains(scrape, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if code := stop(); code != exitOK {
		t.Fatalf("the daemon exited %d on a cancelled context; its log:\n%s", code, log)
	}
	if strings.Contains(log.String(), bot.Password) {
		t.Fatal("the daemon logged the agent's password")
	}

	// Restarted, it answers what came meanwhile, once.
	alice.SendText(room, "while away")
	stop, log = start()
	awaitEcho("while away")
	if code := stop(); code != exitOK {
		t.Fatalf("the restarted daemon exited %d; its log:\n%s", code, log)
	}
	answers := 0
	for _, raw := range alice.Messages(room) {
		var ev struct {
			Sender string `json:"sender"`
		}
		if json.Unmarshal(raw, &ev) == nil && ev.Sender == bot.UserID && strings.Contains(string(raw), `"echo: `) {
			answers++
		}
	}
	if answers != 2 {
		t.Fatalf("the room holds %d answers, want one per message", answers)
	}
	out, err := run(t, "status", "-storage", storage)
	if err != nil || !strings.Contains(out, "echo@"+bot.UserID) {
		t.Fatalf("status after the daemon: %v\n%s", err, out)
	}
}

func TestRunRefusesABadConfigurationWithItsExitCode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mindroom.yaml")
	if err := os.WriteFile(path, []byte("homeserver: http://127.0.0.1:1\nagents: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	if code := execute(context.Background(), []string{"run", "-config", path}, &bytes.Buffer{}, &stderr); code != exitConfig {
		t.Fatalf("exit code %d, want %d; stderr: %s", code, exitConfig, stderr.String())
	}
	if !strings.Contains(stderr.String(), "agents") {
		t.Fatalf("the error does not name the field: %s", stderr.String())
	}
}

func TestASIGTERMWithRepliesInFlightLosesNothingAndAnswersNothingTwice(t *testing.T) {
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	hs := dendrite.Start(t)
	bot := hs.Register(t, "echo", "echo-password-9b2e")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	cfg := writeDaemonConfig(t, hs.URL, bot, t.TempDir())

	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "run", "-config", cfg)
		cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
		cmd.Stderr = &logbuf.Buffer{}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		})
		return cmd
	}
	answered := func(text string) func(json.RawMessage) bool { return dendrite.Says(bot.UserID, "echo: "+text) }

	daemon := start()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice.SendText(room, "first")
	alice.AwaitEvent(ctx, room, answered("first"))
	const burst = 20
	for i := range burst {
		alice.SendText(room, fmt.Sprintf("burst %d", i))
	}
	// Stop while the burst is being answered.
	alice.AwaitEvent(ctx, room, answered("burst 0"))
	if err := daemon.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := daemon.Wait(); err != nil {
		t.Fatalf("the daemon's orderly shutdown failed: %v\n%s", err, daemon.Stderr)
	}

	daemon = start()
	for i := range burst {
		alice.AwaitEvent(ctx, room, answered(fmt.Sprintf("burst %d", i)))
	}
	_ = daemon.Process.Signal(syscall.SIGTERM)
	if err := daemon.Wait(); err != nil {
		t.Fatalf("the restarted daemon's shutdown failed: %v", err)
	}
	answers := map[string]int{}
	for _, raw := range alice.Messages(room) {
		var ev struct {
			Sender  string `json:"sender"`
			Type    string `json:"type"`
			Content struct {
				Body string `json:"body"`
			} `json:"content"`
		}
		if json.Unmarshal(raw, &ev) == nil && ev.Sender == bot.UserID && ev.Type == "m.room.message" {
			answers[ev.Content.Body]++
		}
	}
	if len(answers) != burst+1 {
		t.Fatalf("%d distinct answers, want %d: %v", len(answers), burst+1, answers)
	}
	for body, n := range answers {
		if n != 1 {
			t.Fatalf("%q was answered %d times", body, n)
		}
	}
}

func TestRunRefusesABackEndItCannotRunBeforeOpeningAnything(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte("pw"), 0o600); err != nil {
		t.Fatal(err)
	}
	storage := filepath.Join(dir, "storage")
	cfg := fmt.Sprintf(`homeserver: http://127.0.0.1:1
storage: %s
agents:
  - name: later
    user_id: "@later:localhost"
    password_file: pw
    backend:
      type: openai
      base_url: http://127.0.0.1:2/v1
      model: m
      context_messages: 5000
`, storage)
	path := filepath.Join(dir, "mindroom.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	if code := execute(context.Background(), []string{"run", "-config", path}, &bytes.Buffer{}, &stderr); code != exitConfig {
		t.Fatalf("exit code %d, want %d; stderr: %s", code, exitConfig, stderr.String())
	}
	if !strings.Contains(stderr.String(), "agents[0].backend.context_messages: 5000 is not in 0..1000") {
		t.Fatalf("the error does not name the field: %s", stderr.String())
	}
	if _, err := os.Stat(storage); !os.IsNotExist(err) {
		t.Fatalf("the journal's directory was created before the refusal: %v", err)
	}
}

// metricsOf scrapes the metrics of the daemon whose log is log.
func metricsOf(t *testing.T, log *logbuf.Buffer) string {
	t.Helper()
	addr := daemonAddress(t, log)
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %v %s", err, resp.Status)
	}
	return string(body)
}

// apiCall makes one agent API request with the agent's token and decodes
// its JSON answer into out.
func apiCall(t *testing.T, method, url, token, body string, out any) int {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %s: %v", method, url, raw, err)
		}
	}
	return resp.StatusCode
}

// An agent outside the process takes its work through the daemon's API: it
// long-polls the pending work a real homeserver brought, answers through
// the reply route (once, however often it posts), and the person sees the
// answer exactly once.
func TestAnOutsideAgentAnswersThroughTheDaemonsAPI(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "outside", "outside-password-1f0a")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	const token = "api-token-for-the-outside-agent"
	cfg := writeHTTPAgentConfig(t, hs.URL, bot, "outside", token)
	d := runInProcess(cfg)
	defer d.stopCleanly(t)
	addr := daemonAddress(t, d.log)
	base := "http://" + addr + "/v1/agents/outside"

	question := alice.SendText(room, "are you out there?")
	var page struct {
		Events []struct {
			EventID string `json:"event_id"`
			RoomID  string `json:"room_id"`
		} `json:"events"`
		TimedOut bool `json:"timed_out"`
	}
	for len(page.Events) == 0 {
		if code := apiCall(t, "GET", base+"/pending?wait=30s", token, "", &page); code != http.StatusOK {
			t.Fatalf("pending: status %d", code)
		}
		if page.TimedOut {
			t.Fatal("the long-poll timed out before the message was admitted")
		}
	}
	if page.Events[0].EventID != question || page.Events[0].RoomID != room {
		t.Fatalf("pending = %+v, want %s in %s", page.Events, question, room)
	}
	var first, again struct {
		DeliveryID string `json:"delivery_id"`
		Outcome    string `json:"outcome"`
	}
	reply := `{"body":"yes, from outside"}`
	if code := apiCall(t, "POST", base+"/events/"+question+"/reply", token, reply, &first); code != http.StatusOK {
		t.Fatalf("reply: status %d", code)
	}
	if code := apiCall(t, "POST", base+"/events/"+question+"/reply", token, reply, &again); code != http.StatusOK ||
		again.DeliveryID != first.DeliveryID {
		t.Fatalf("the replayed reply = %d %+v, want the same delivery %+v", code, again, first)
	}
	if code := apiCall(t, "GET", base+"/pending", "not-the-token", "", nil); code != http.StatusUnauthorized {
		t.Fatalf("a wrong token got %d, want 401", code)
	}
	actx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice.AwaitEvent(actx, room, func(raw json.RawMessage) bool {
		return strings.Contains(string(raw), `"yes, from outside"`)
	})
	answers := 0
	for _, raw := range alice.Messages(room) {
		if strings.Contains(string(raw), `"yes, from outside"`) {
			answers++
		}
	}
	if answers != 1 {
		t.Fatalf("the room shows the answer %d times, want once", answers)
	}
}

// daemonAddress waits for the daemon whose log is log to say it runs, and
// returns the address it listens on. The start-up line is the daemon's only
// signal, so the log is read until it appears or a minute passes.
func daemonAddress(t *testing.T, log *logbuf.Buffer) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(log.String(), "\n") {
			var rec struct {
				Message string `json:"message"`
				Listen  string `json:"listen"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Message == "mindroomd running" {
				return rec.Listen
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the daemon never said it runs; its log:\n%s", log)
	return ""
}

func TestBackupCopiesTheJournalBesideAWritingStoreAndRefusesToOverwrite(t *testing.T) {
	s, dir := testsupport.MustOpen(t) // the writer stays open, as a daemon's would
	ctx := context.Background()
	v, err := s.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.AdmitBatch(ctx, mx.Live("!r:example.org", mx.Message("$a", "@alice:example.org", 1000, "hi")), "tok"); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(t.TempDir(), "journal.backup")
	out, err := run(t, "backup", "-storage", dir, "-to", to)
	if err != nil || !strings.Contains(out, "verified") {
		t.Fatalf("backup: %v\n%s", err, out)
	}
	// Restored as a storage directory of its own, it reads as the journal.
	restored := t.TempDir()
	if err := os.MkdirAll(filepath.Join(restored, "tracking"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(to, filepath.Join(restored, "tracking", "event_journal.db")); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "status", "-storage", restored)
	if err != nil || !strings.Contains(out, "helper@@helper:example.org  1       1") {
		t.Fatalf("status of the restored backup: %v\n%s", err, out)
	}
	if err := os.WriteFile(to, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "backup", "-storage", dir, "-to", to); err == nil {
		t.Fatal("backup overwrote an existing file")
	}
	if got, _ := os.ReadFile(to); string(got) != "precious" {
		t.Fatalf("the existing file now holds %q", got)
	}
	if code, _, _ := mindroomd(t, "backup", "-storage", dir); code != exitUsage {
		t.Fatalf("backup without -to exited %d, want %d", code, exitUsage)
	}
}

// inProcess is `mindroomd run` running in this test's process.
type inProcess struct {
	log    *logbuf.Buffer
	done   chan int // its exit code, once it returned
	cancel context.CancelFunc
}

// runInProcess runs `mindroomd run -config cfg` in this process, as
// main would, until stop.
func runInProcess(cfg string) *inProcess {
	ctx, cancel := context.WithCancel(context.Background())
	d := &inProcess{log: &logbuf.Buffer{}, done: make(chan int, 1), cancel: cancel}
	go func() { d.done <- execute(ctx, []string{"run", "-config", cfg}, &bytes.Buffer{}, d.log) }()
	return d
}

// stop cancels the daemon, as a signal does, and returns its exit code.
func (d *inProcess) stop(t *testing.T) int {
	t.Helper()
	d.cancel()
	select {
	case code := <-d.done:
		d.done <- code // stop may be asked again
		return code
	case <-time.After(time.Minute):
		t.Fatalf("the daemon did not stop; its log:\n%s", d.log)
		return -1
	}
}

// stopCleanly stops the daemon and fails the test unless it exited 0.
func (d *inProcess) stopCleanly(t *testing.T) {
	t.Helper()
	if code := d.stop(t); code != exitOK {
		t.Errorf("the daemon exited %d; its log:\n%s", code, d.log)
	}
}
