package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/logbuf"
	"github.com/mindroomd/mindroomd/testsupport/modelstub"
)

// startModelStub starts the stub model server until the test ends.
func startModelStub(t *testing.T, answer func(modelstub.Request) modelstub.Reply) *modelstub.Server {
	t.Helper()
	s, err := modelstub.Start(answer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// answerTo is the stub model's answer to question: several words, so a
// stream of it takes several chunks.
func answerTo(question string) string {
	return "The model's answer to " + question + " is this sentence, streamed a word at a time"
}

// writeOpenAIConfig writes a configuration of one openai agent, streamed,
// against model, its backend's further lines backend (indented six
// spaces), and returns its path.
func writeOpenAIConfig(t *testing.T, homeserver string, bot dendrite.Account, model, apiToken string, backend ...string) string {
	t.Helper()
	dir := t.TempDir()
	for name, v := range map[string]string{"pw": bot.Password, "tok": apiToken, "key": "sk-test-key-never-logged"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "mindroom.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`homeserver: %s
storage: ./storage
listen: 127.0.0.1:0
agents:
  - name: model
    user_id: "%s"
    password_file: pw
    api_token_file: tok
    auto_join: true
    backend:
      type: openai
      base_url: %s
      model: stub-model
      api_key_file: key
      system_prompt: You answer in one sentence.
      stream: true
%s`, homeserver, bot.UserID, model, strings.Join(backend, ""))), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// roomEvent is an event of the room as the tests read it.
type roomEvent struct {
	EventID string `json:"event_id"`
	Sender  string `json:"sender"`
	Type    string `json:"type"`
	Content struct {
		Body       string `json:"body"`
		Status     string `json:"io.mindroom.stream_status"`
		NewContent *struct {
			Body   string `json:"body"`
			Status string `json:"io.mindroom.stream_status"`
		} `json:"m.new_content"`
		RelatesTo *struct {
			RelType string `json:"rel_type"`
			EventID string `json:"event_id"`
		} `json:"m.relates_to"`
		Delivery *struct {
			Stage string `json:"stage"`
		} `json:"io.mindroomd.delivery"`
	} `json:"content"`
}

// shown is the text an event puts on screen: an edit's new body, or its
// body.
func (e roomEvent) shown() string {
	if e.Content.NewContent != nil {
		return e.Content.NewContent.Body
	}
	return e.Content.Body
}

// isFinal reports whether e is sender's final answer showing body.
func (e roomEvent) isFinal(sender, body string) bool {
	return e.Sender == sender && e.Content.Delivery != nil && e.Content.Delivery.Stage == "final" && e.shown() == body
}

// isProgress reports whether e is sender's edit marked as still streaming.
func (e roomEvent) isProgress(sender string) bool {
	return e.Sender == sender && e.Content.RelatesTo != nil && e.Content.RelatesTo.RelType == "m.replace" &&
		e.Content.NewContent != nil && journal.StreamInProgress(e.Content.NewContent.Status)
}

func parseRoomEvent(t *testing.T, raw json.RawMessage) roomEvent {
	t.Helper()
	var e roomEvent
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatal(err)
	}
	return e
}

// awaitFinal waits until user's sync shows sender's final answer body.
func awaitFinal(t *testing.T, user *dendrite.User, room, sender, body string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	user.AwaitEvent(ctx, room, func(raw json.RawMessage) bool { return parseRoomEvent(t, raw).isFinal(sender, body) })
}

// roomHistory reads the room's whole history as user sees it.
func roomHistory(t *testing.T, user *dendrite.User, room string) []roomEvent {
	t.Helper()
	var out []roomEvent
	for _, raw := range user.Messages(room) {
		out = append(out, parseRoomEvent(t, raw))
	}
	return out
}

// countFinals counts sender's final answers showing body.
func countFinals(history []roomEvent, sender, body string) int {
	n := 0
	for _, e := range history {
		if e.isFinal(sender, body) {
			n++
		}
	}
	return n
}

// turnFailureLogged reports whether the log holds a failed turn of eventID
// whose error starts with prefix.
func turnFailureLogged(log, eventID, prefix string) bool {
	for _, line := range strings.Split(log, "\n") {
		var l struct {
			Message string `json:"message"`
			EventID string `json:"event_id"`
			Error   string `json:"error"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Message == "Turn failed; the event stays pending" &&
			l.EventID == eventID && strings.HasPrefix(l.Error, prefix) {
			return true
		}
	}
	return false
}

func TestRunStreamsAnOpenAIAnswerAndRetriesARefusedOrCutTurnUntilItIsAnsweredOnce(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "model", "model-password-5d2c")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	// Each question but the first is refused, or cut, the first time it is
	// asked; every answer streams a word every 150 ms, long enough to be
	// shown in progress.
	var (
		mu    sync.Mutex
		asked = map[string]bool{}
	)
	model := startModelStub(t, func(r modelstub.Request) modelstub.Reply {
		q := r.Question()
		mu.Lock()
		again := asked[q]
		asked[q] = true
		mu.Unlock()
		answer := modelstub.Reply{Text: answerTo(q), Delay: 150 * time.Millisecond}
		switch {
		case again:
		case q == "rate limited?":
			return modelstub.Reply{Status: http.StatusTooManyRequests, Text: "slow down"}
		case q == "server error?":
			return modelstub.Reply{Status: http.StatusInternalServerError, Text: "model crashed"}
		case q == "cut short?":
			answer.CutAfter, answer.Abort = 3, true
		}
		return answer
	})
	const token = "api-token-of-the-model-agent"
	d := runInProcess(writeOpenAIConfig(t, hs.URL, bot, model.URL, token))
	defer d.stopCleanly(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the daemon's log:\n%s", d.log)
		}
	})

	questions := []string{"streamed?", "rate limited?", "server error?", "cut short?"}
	ids := map[string]string{}
	for _, q := range questions {
		ids[q] = alice.SendText(room, q)
	}
	for _, q := range questions {
		awaitFinal(t, alice, room, bot.UserID, answerTo(q))
	}

	history := roomHistory(t, alice, room)
	progress := 0
	for _, e := range history {
		if e.isProgress(bot.UserID) {
			progress++
			if e.Content.Status != "streaming" || e.Content.Delivery != nil {
				t.Fatalf("progress edit %s = %+v, want it marked streaming, without a delivery marker", e.EventID, e.Content)
			}
		}
	}
	if progress == 0 {
		t.Fatal("no answer was shown in progress")
	}
	for i, q := range questions {
		if n := countFinals(history, bot.UserID, answerTo(q)); n != 1 {
			t.Fatalf("%q has %d final answers in the room, want 1", q, n)
		}
		if got, want := model.Asked(q), min(i, 1)+1; got != want {
			t.Fatalf("the model was asked %q %d times, want %d", q, got, want)
		}
	}
	for q, prefix := range map[string]string{
		"rate limited?": "agent: openai agent: status 429: slow down",
		"server error?": "agent: openai agent: status 500: model crashed",
		"cut short?":    "agent: openai agent: stream cut after 3 chunks: ",
	} {
		if !turnFailureLogged(d.log.String(), ids[q], prefix) {
			t.Errorf("no failed turn %q logged for %q", prefix, q)
		}
	}
	for _, r := range model.Requests() {
		if r.Model != "stub-model" || !r.Stream || r.Authorization != "Bearer sk-test-key-never-logged" ||
			r.Messages[0].Role != "system" || r.Messages[0].Content != "You answer in one sentence." {
			t.Fatalf("request = %+v, want the configured model, key and system prompt, streamed", r)
		}
	}
	if strings.Contains(d.log.String(), "sk-test-key-never-logged") {
		t.Fatal("the daemon logged the API key")
	}

	// The conversation shows each question and its answer, and nothing of
	// the placeholders or the progress.
	var page struct {
		Messages []struct {
			Content struct {
				Body   string `json:"body"`
				Status string `json:"io.mindroom.stream_status"`
			} `json:"content"`
		} `json:"messages"`
	}
	u := "http://" + daemonAddress(t, d.log) + "/v1/agents/model/rooms/" + url.PathEscape(room) + "/messages?limit=50"
	if code := apiCall(t, "GET", u, token, "", &page); code != http.StatusOK {
		t.Fatalf("messages: status %d", code)
	}
	var got []string
	for _, m := range page.Messages {
		if journal.StreamInProgress(m.Content.Status) {
			t.Fatalf("the conversation shows %q, still in progress", m.Content.Body)
		}
		got = append(got, m.Content.Body)
	}
	want := append([]string(nil), questions...)
	for _, q := range questions {
		want = append(want, answerTo(q))
	}
	if len(got) != len(want) {
		t.Fatalf("the conversation = %q, want the questions and one answer each", got)
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || g == w
		}
		if !found {
			t.Fatalf("the conversation = %q, lacks %q", got, w)
		}
	}
}

// finalHold stands in front of the homeserver and, while hold is set,
// keeps every final answer the agent sends from reaching it: the request
// is held until its sender goes away. held learns of each one.
type finalHold struct {
	URL  string
	hold atomic.Bool
	held chan string // the room of each final held
}

func startFinalHold(t *testing.T, homeserver string) *finalHold {
	t.Helper()
	target, err := url.Parse(homeserver)
	if err != nil {
		t.Fatal(err)
	}
	h := &finalHold{held: make(chan string, 16)}
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) }}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/send/") && h.hold.Load() {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			var content struct {
				Delivery *struct {
					Stage string `json:"stage"`
				} `json:"io.mindroomd.delivery"`
			}
			if json.Unmarshal(body, &content) == nil && content.Delivery != nil && content.Delivery.Stage == "final" {
				h.held <- r.URL.Path
				<-r.Context().Done()
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	h.URL = srv.URL
	return h
}

// daemonProcess is mindroomd run as a child process.
type daemonProcess struct {
	cmd *exec.Cmd
	log *logbuf.Buffer
}

func startDaemonProcess(t *testing.T, bin, cfg string) *daemonProcess {
	t.Helper()
	cmd := exec.Command(bin, "run", "-config", cfg)
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	log := &logbuf.Buffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return &daemonProcess{cmd: cmd, log: log}
}

// kill SIGKILLs the daemon and reaps it.
func (p *daemonProcess) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Wait(); err == nil {
		t.Fatal("the killed daemon exited 0")
	}
}

// stop SIGTERMs the daemon and fails the test unless it shuts down cleanly.
func (p *daemonProcess) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("the daemon's shutdown failed: %v\n%s", err, p.log)
	}
}

func TestAKilledDaemonGivesOneAnswerAndNeverAsksTheModelAgainForOneItHeld(t *testing.T) {
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	hs := dendrite.Start(t)
	bot := hs.Register(t, "model", "model-password-8e1f")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	homeserver := startFinalHold(t, hs.URL)
	// The first time "mid-stream?" is asked, the stream comes a word every
	// 400 ms, stops after the fourth, and stays open until the daemon is
	// gone.
	stalled := make(chan struct{})
	var stalls atomic.Int32
	model := startModelStub(t, func(r modelstub.Request) modelstub.Reply {
		reply := modelstub.Reply{Text: answerTo(r.Question())}
		if r.Question() == "mid-stream?" && stalls.Add(1) == 1 {
			reply.Delay = 400 * time.Millisecond
			reply.OnChunk = func(ctx context.Context, n int) {
				if n == 4 {
					close(stalled)
					<-ctx.Done()
				}
			}
		}
		return reply
	})
	cfg := writeOpenAIConfig(t, homeserver.URL, bot, model.URL, "api-token")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Killed mid-stream: the answer was never complete, so it is asked for
	// again, and given once.
	daemon := startDaemonProcess(t, bin, cfg)
	alice.SendText(room, "mid-stream?")
	alice.AwaitEvent(ctx, room, func(raw json.RawMessage) bool { return parseRoomEvent(t, raw).isProgress(bot.UserID) })
	select {
	case <-stalled:
	case <-ctx.Done():
		t.Fatalf("the stream never reached its stall; the daemon's log:\n%s", daemon.log)
	}
	daemon.kill(t)
	daemon = startDaemonProcess(t, bin, cfg)
	awaitFinal(t, alice, room, bot.UserID, answerTo("mid-stream?"))

	// Killed once the answer was recorded, with its final held at the
	// homeserver's door: the restart sends that answer, and asks nothing.
	homeserver.hold.Store(true)
	alice.SendText(room, "held?")
	select {
	case <-homeserver.held:
	case <-ctx.Done():
		t.Fatalf("the final answer was never sent; the daemon's log:\n%s", daemon.log)
	}
	daemon.kill(t)
	homeserver.hold.Store(false)
	daemon = startDaemonProcess(t, bin, cfg)
	awaitFinal(t, alice, room, bot.UserID, answerTo("held?"))
	daemon.stop(t)

	history := roomHistory(t, alice, room)
	for q, asked := range map[string]int{"mid-stream?": 2, "held?": 1} {
		if n := countFinals(history, bot.UserID, answerTo(q)); n != 1 {
			t.Fatalf("%q has %d final answers in the room, want 1", q, n)
		}
		if got := model.Asked(q); got != asked {
			t.Fatalf("the model was asked %q %d times, want %d", q, got, asked)
		}
	}
}
