package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/logbuf"
)

// endpoint is a kind of request the daemon makes to its homeserver.
type endpoint string

// The endpoints a faultProxy tells apart.
const (
	epLogin    endpoint = "login"
	epSync     endpoint = "sync"
	epSend     endpoint = "send"
	epMessages endpoint = "messages"
	epOther    endpoint = "other"
)

// endpointOf classifies a client-server API request by its method and path.
func endpointOf(r *http.Request) endpoint {
	p := r.URL.Path
	switch {
	case r.Method == http.MethodPost && strings.HasSuffix(p, "/login"):
		return epLogin
	case r.Method == http.MethodGet && strings.HasSuffix(p, "/sync"):
		return epSync
	case r.Method == http.MethodPut && strings.Contains(p, "/send/"):
		return epSend
	case r.Method == http.MethodGet && strings.HasSuffix(p, "/messages"):
		return epMessages
	}
	return epOther
}

// fault is one answer a faultProxy gives in the homeserver's place.
type fault struct {
	status int
	// retryAfterMS goes into a Matrix error body as retry_after_ms;
	// retryAfter into a Retry-After header, in seconds.
	retryAfterMS, retryAfter int
	// lost lets the request through to the homeserver, which acts on it,
	// and replaces its answer: a reply lost on the way back.
	lost bool
	// html answers with a gateway's HTML page instead of a Matrix error.
	html bool
}

// write answers w with f.
func (f fault) write(w http.ResponseWriter) {
	if f.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(f.retryAfter))
	}
	if f.html {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(f.status)
		fmt.Fprintf(w, "<html><body><h1>%d %s</h1></body></html>", f.status, http.StatusText(f.status))
		return
	}
	body := map[string]any{"errcode": "M_UNKNOWN", "error": "injected " + http.StatusText(f.status)}
	if f.status == http.StatusTooManyRequests {
		body["errcode"] = "M_LIMIT_EXCEEDED"
	}
	if f.retryAfterMS > 0 {
		body["retry_after_ms"] = f.retryAfterMS
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(f.status)
	_ = json.NewEncoder(w).Encode(body)
}

// faultProxy stands between the daemon and its homeserver and passes every
// request on, except that each endpoint answers with the faults armed for
// it, one request each, in order, before it passes requests on again.
type faultProxy struct {
	URL   string
	proxy *httputil.ReverseProxy

	mu       sync.Mutex
	armed    map[endpoint][]fault
	injected map[endpoint]int
}

// newFaultProxy returns a proxy to homeserver that is not serving yet.
func newFaultProxy(t *testing.T, homeserver string) *faultProxy {
	t.Helper()
	target, err := url.Parse(homeserver)
	if err != nil {
		t.Fatal(err)
	}
	return &faultProxy{
		// A long poll the daemon gives up on as it stops is no fault.
		proxy: &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) },
			ErrorLog: log.New(io.Discard, "", 0)},
		armed:    make(map[endpoint][]fault),
		injected: make(map[endpoint]int),
	}
}

// startFaultProxy serves a proxy to homeserver on a loopback port.
func startFaultProxy(t *testing.T, homeserver string) *faultProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := newFaultProxy(t, homeserver)
	p.serve(t, l)
	return p
}

// serve answers on l until the test ends.
func (p *faultProxy) serve(t *testing.T, l net.Listener) {
	t.Helper()
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	p.URL = "http://" + l.Addr().String()
}

// arm queues faults for the next requests to ep.
func (p *faultProxy) arm(ep endpoint, faults ...fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed[ep] = append(p.armed[ep], faults...)
}

// disarm drops the faults still queued for ep.
func (p *faultProxy) disarm(ep endpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.armed, ep)
}

// count is how many faults ep answered with so far.
func (p *faultProxy) count(ep endpoint) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.injected[ep]
}

// next takes ep's next fault if it is one of the lost kind (lost true)
// or of the refusing kind (lost false).
func (p *faultProxy) next(ep endpoint, lost bool) (fault, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.armed[ep]
	if len(q) == 0 || q[0].lost != lost {
		return fault{}, false
	}
	p.armed[ep] = q[1:]
	p.injected[ep]++
	return q[0], true
}

// ServeHTTP implements http.Handler. A request is refused, or passed on
// and its answer kept until it is complete: a sync's long poll that ends
// after a lost fault was armed loses its answer too.
func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ep := endpointOf(r)
	if f, ok := p.next(ep, false); ok {
		_, _ = io.Copy(io.Discard, r.Body)
		f.write(w)
		return
	}
	rec := httptest.NewRecorder()
	p.proxy.ServeHTTP(rec, r)
	if f, ok := p.next(ep, true); ok {
		f.write(w)
		return
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// logLine is one record of the daemon's log, with the fields the fault
// tests read.
type logLine struct {
	Message  string  `json:"message"`
	Error    string  `json:"error"`
	EventID  string  `json:"event_id"`
	Failures int     `json:"failures"`
	RetryIn  float64 `json:"retry_in"` // milliseconds
}

// logLines returns the records of log whose message is msg, in order.
func logLines(log, msg string) []logLine {
	var out []logLine
	for _, raw := range strings.Split(log, "\n") {
		var l logLine
		if json.Unmarshal([]byte(raw), &l) == nil && l.Message == msg {
			out = append(out, l)
		}
	}
	return out
}

// exited reports the daemon's exit code once it has returned.
func (d *inProcess) exited() (int, bool) {
	select {
	case code := <-d.done:
		d.done <- code
		return code, true
	default:
		return 0, false
	}
}

// awaitLog waits until the daemon's log holds n records with message msg,
// and returns them. It fails the test if the daemon exits first or a
// minute passes.
func (d *inProcess) awaitLog(t *testing.T, msg string, n int) []logLine {
	t.Helper()
	return awaitLog(t, d.log, d.exited, msg, n)
}

// awaitLog waits until log holds n records with message msg, and returns
// them. It fails the test if a minute passes first, or if exited, when
// set, reports that the daemon writing log has exited.
func awaitLog(t *testing.T, log *logbuf.Buffer, exited func() (int, bool), msg string, n int) []logLine {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; {
		if lines := logLines(log.String(), msg); len(lines) >= n {
			return lines
		}
		if exited != nil {
			if code, ok := exited(); ok {
				t.Fatalf("the daemon exited %d before logging %q %d times; its log:\n%s", code, msg, n, log)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not log %q %d times in a minute; its log:\n%s", msg, n, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// echoOf matches the echo agent's answer to text.
func echoOf(bot, text string) func(json.RawMessage) bool {
	return func(raw json.RawMessage) bool {
		var ev struct {
			Sender  string `json:"sender"`
			Type    string `json:"type"`
			Content struct {
				Body string `json:"body"`
			} `json:"content"`
		}
		return json.Unmarshal(raw, &ev) == nil && ev.Sender == bot && ev.Type == "m.room.message" &&
			ev.Content.Body == "echo: "+text
	}
}

// awaitEchoes waits, for up to two minutes, until the room shows the echo
// agent's answer to each of texts.
func awaitEchoes(t *testing.T, alice *dendrite.User, room, bot string, texts ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, text := range texts {
		alice.AwaitEvent(ctx, room, echoOf(bot, text))
	}
}

// requireEachAnsweredOnce fails the test unless the room's record holds
// exactly one answer of bot's to each of texts, and no other answer.
func requireEachAnsweredOnce(t *testing.T, alice *dendrite.User, room, bot string, texts []string) {
	t.Helper()
	answers := map[string]int{}
	for _, raw := range alice.Messages(room) {
		var ev struct {
			Sender  string `json:"sender"`
			Type    string `json:"type"`
			Content struct {
				Body string `json:"body"`
			} `json:"content"`
		}
		if json.Unmarshal(raw, &ev) == nil && ev.Sender == bot && ev.Type == "m.room.message" {
			answers[ev.Content.Body]++
		}
	}
	for _, text := range texts {
		if n := answers["echo: "+text]; n != 1 {
			t.Errorf("%q was answered %d times, want once", text, n)
		}
		delete(answers, "echo: "+text)
	}
	if len(answers) != 0 {
		t.Errorf("answers to nothing that was asked: %v", answers)
	}
}

// awaitSettled waits until status shows the principal with every reply
// acknowledged (acknowledged of them), none short of it, and no pending
// event, and fails the test if a minute passes first. A reply the room
// already shows may still wait for its acknowledgement: its answer was
// lost, and the retry that learns its event ID waits out a backoff.
func awaitSettled(t *testing.T, storage, principal string, acknowledged int) {
	t.Helper()
	want := map[string]string{"PENDING": "0", "QUEUED": "0", "ATTEMPTED": "0", "FAILED": "0",
		"ACKNOWLEDGED": strconv.Itoa(acknowledged)}
	for deadline := time.Now().Add(time.Minute); ; {
		out, err := run(t, "status", "-storage", storage)
		if err != nil {
			t.Fatalf("status: %v\n%s", err, out)
		}
		row, settled := statusRows(t, out)[principal]
		for col, v := range want {
			settled = settled && row[col] == v
		}
		if settled {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the journal did not settle in a minute; want %v, status:\n%s", want, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Bursts of 500, 502 (a gateway's HTML page), 503, 504 and 429 (with
// retry_after_ms and with Retry-After) on sync, send and /messages, some
// refusing the request and some losing the answer to one the homeserver
// carried out, delay the answers but neither lose nor repeat one: each
// message shows one answer on the homeserver, and nothing is left pending
// or unacknowledged.
func TestBurstsOf5xxAnd429FromTheHomeserverLoseNoMessageAndRepeatNoAnswer(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "echo", "echo-password-5a0c")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	proxy := startFaultProxy(t, hs.URL)
	storage := t.TempDir()
	d := runInProcess(writeDaemonConfig(t, proxy.URL, bot, storage))
	defer d.stop(t)

	// What the room says before the agent's join is history, never work.
	joinCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice.AwaitEvent(joinCtx, room, dendrite.Joined(bot.UserID, 1))
	texts := []string{"before the storm"}
	alice.SendText(room, texts[0])
	awaitEchoes(t, alice, room, bot.UserID, texts[0])

	// Sync fails until the burst of messages is in: the first failure is
	// the answer of the long poll the burst ends, lost on its way back.
	proxy.arm(epSync, fault{status: 502, lost: true, html: true})
	for range 20 {
		proxy.arm(epSync, fault{status: 429, retryAfterMS: 200}, fault{status: 500}, fault{status: 503, retryAfter: 1})
	}
	sendFaults := []fault{
		{status: 500},
		{status: 502, lost: true, html: true}, // the reply is in the room; its event ID never came back
		{status: 429, retryAfterMS: 300},
		{status: 429, retryAfter: 1},
		{status: 504, lost: true, html: true},
	}
	proxy.arm(epSend, sendFaults...)
	// More messages than one sync's timeline holds, so the sync that
	// brings them fills its gap from /messages, which fails once.
	proxy.arm(epMessages, fault{status: 503})
	for i := range 60 {
		text := fmt.Sprintf("storm %d", i)
		alice.SendText(room, text)
		texts = append(texts, text)
	}
	d.awaitLog(t, "Sync failed; retrying from the same token", 2)
	proxy.disarm(epSync)

	awaitEchoes(t, alice, room, bot.UserID, texts...)
	awaitSettled(t, storage, "echo@"+bot.UserID, len(texts))
	if code := d.stop(t); code != exitOK {
		t.Fatalf("the daemon exited %d; its log:\n%s", code, d.log)
	}
	if n := proxy.count(epSend); n != len(sendFaults) {
		t.Errorf("%d sends met a fault, want %d", n, len(sendFaults))
	}
	if n := proxy.count(epMessages); n != 1 {
		t.Errorf("%d gap fills met a fault, want 1: the burst did not make the sync limited", n)
	}
	syncFailures := logLines(d.log.String(), "Sync failed; retrying from the same token")
	if len(syncFailures) != proxy.count(epSync)+proxy.count(epMessages) {
		t.Errorf("%d sync failures logged for %d sync faults and %d gap fill faults", len(syncFailures),
			proxy.count(epSync), proxy.count(epMessages))
	}
	for i, l := range syncFailures {
		if l.Failures != i+1 {
			t.Errorf("sync failure %d is logged as failure %d: the backoff started over", i+1, l.Failures)
		}
	}
	retried := logLines(d.log.String(), "Delivery will be retried")
	if len(retried) != len(sendFaults) {
		t.Errorf("%d retried deliveries logged, want %d", len(retried), len(sendFaults))
	}
	for _, wait := range []string{"(retry after 300ms)", "(retry after 1s)"} {
		found := false
		for _, l := range retried {
			found = found || strings.HasSuffix(l.Error, wait)
		}
		if !found {
			t.Errorf("no retried delivery carries the homeserver's wait %s: %+v", wait, retried)
		}
	}
	requireEachAnsweredOnce(t, alice, room, bot.UserID, texts)
}

// A pending event whose stored payload no longer decodes is reported in
// the log and stepped over: the events before and after it, and the
// messages that come later, are answered, once each.
func TestACorruptPendingRowIsReportedAndSkippedAndTheBacklogGoesOn(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "script", "script-password-0d4b")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte(bot.Password), 0o600); err != nil {
		t.Fatal(err)
	}
	// The agent fails while the test holds it, so the work stays pending,
	// then answers.
	held := filepath.Join(dir, "held")
	if err := os.WriteFile(held, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := writeExecScriptConfig(t, dir, hs.URL, bot,
		`cat >/dev/null; if [ -e "$1" ]; then echo held >&2; exit 3; fi; printf '{"body": "answered"}'`, held)

	d := runInProcess(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice.AwaitEvent(ctx, room, dendrite.Joined(bot.UserID, 1))
	// The first turn reads the room, which fetches its history from the
	// homeserver: the messages under test come by sync alone after it.
	warmUp := alice.SendText(room, "warm-up")
	d.awaitFailedTurn(t, warmUp)
	var ids []string
	for _, text := range []string{"first", "second", "third"} {
		ids = append(ids, alice.SendText(room, text))
	}
	// Each event was offered and failed: all three are pending.
	for _, id := range ids {
		d.awaitFailedTurn(t, id)
	}
	if code := d.stop(t); code != exitOK {
		t.Fatalf("the daemon exited %d; its log:\n%s", code, d.log)
	}
	p, err := journal.NewPrincipal("script", bot.UserID)
	if err != nil {
		t.Fatal(err)
	}
	storage := filepath.Join(dir, "storage")
	testsupport.MustCorruptPayload(t, storage, p, ids[1])
	if err := os.Remove(held); err != nil {
		t.Fatal(err)
	}

	d = runInProcess(cfg)
	defer d.stopCleanly(t)
	later := alice.SendText(room, "after the damage")
	for _, id := range []string{warmUp, ids[0], ids[2], later} {
		alice.AwaitEvent(ctx, room, replyTo(bot.UserID, id))
	}

	// Every commit passes over the backlog again; the row is reported on
	// the first pass only.
	reported := 0
	for _, l := range logLines(d.log.String(), "Pending event unreadable; skipped") {
		if l.EventID == ids[1] && strings.Contains(l.Error, "stored payload does not decode") {
			reported++
		}
	}
	if reported != 1 {
		t.Fatalf("the corrupt row %s was reported %d times, want once; the log:\n%s", ids[1], reported, d.log)
	}
	answers := map[string]int{}
	for _, raw := range alice.Messages(room) {
		for _, id := range []string{warmUp, ids[0], ids[1], ids[2], later} {
			if replyTo(bot.UserID, id)(raw) {
				answers[id]++
			}
		}
	}
	for _, id := range []string{warmUp, ids[0], ids[2], later} {
		if answers[id] != 1 {
			t.Errorf("%s was answered %d times, want once", id, answers[id])
		}
	}
	if answers[ids[1]] != 0 {
		t.Errorf("the corrupt row %s was answered %d times", ids[1], answers[ids[1]])
	}
}

// replyTo matches an answer of bot's in reply to eventID.
func replyTo(bot, eventID string) func(json.RawMessage) bool {
	return func(raw json.RawMessage) bool {
		var ev struct {
			Sender  string `json:"sender"`
			Type    string `json:"type"`
			Content struct {
				RelatesTo struct {
					InReplyTo struct {
						EventID string `json:"event_id"`
					} `json:"m.in_reply_to"`
				} `json:"m.relates_to"`
			} `json:"content"`
		}
		return json.Unmarshal(raw, &ev) == nil && ev.Sender == bot && ev.Type == "m.room.message" &&
			ev.Content.RelatesTo.InReplyTo.EventID == eventID
	}
}

// awaitFailedTurn waits until the daemon's log holds a failed turn of
// eventID, and fails the test if the daemon exits first or a minute
// passes.
func (d *inProcess) awaitFailedTurn(t *testing.T, eventID string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; {
		for _, l := range logLines(d.log.String(), "Turn failed; the event stays pending") {
			if l.EventID == eventID {
				return
			}
		}
		if code, ok := d.exited(); ok {
			t.Fatalf("the daemon exited %d before a failed turn of %s; its log:\n%s", code, eventID, d.log)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failed turn of %s in a minute; the log:\n%s", eventID, d.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
