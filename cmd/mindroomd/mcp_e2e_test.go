package main

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mindroomd/mindroomd/mcpserver"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/logbuf"
)

// An agent that works through `mindroomd mcp` is answered once however the
// daemon dies: killed after the homeserver took its reply but before the
// daemon learned the reply's event ID, the restarted daemon answers the
// same reply with the same delivery, which ends acknowledged as the one
// event the homeserver holds, and every later reply is a replay.
//
// The mcp process keeps running across the daemon's restart: it reaches
// the API through a fixed front whose target moves to the new daemon, as a
// fixed listen address would, so the restart is one the MCP client only
// sees as an API briefly away.
func TestAnMCPAgentKilledBetweenItsReplyAndTheAcknowledgementGetsOneMessage(t *testing.T) {
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	hs := dendrite.Start(t)
	const name, token = "mcpagent", "api-token-of-the-mcp-agent"
	bot := hs.Register(t, name, name+"-password-2b7c")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	door := startSendHold(t, finalReply, hs.URL)
	cfg := writeHTTPAgentConfig(t, door.URL, bot, name, token)
	front := startAPIFront(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var logs []*logbuf.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			for i, l := range logs {
				t.Logf("the log of daemon %d:\n%s", i+1, l)
			}
		}
	})
	daemon := startDaemonProcess(t, bin, cfg)
	logs = append(logs, daemon.log)
	addr := daemonAddress(t, daemon.log)
	front.point(t, addr)
	cs := mcpCommandSession(t, "-config", cfg, "-agent", name, "-api", front.URL)

	const asked, answer = "what is the answer?", "forty-two, and only once"
	question := alice.SendText(room, asked)
	work := mcpAwaitWork(t, cs, question)
	if work.RoomID != room || work.Sender != alice.UserID || work.Content.Body != asked {
		t.Fatalf("wait_for_work gave %+v, want %q from %s in %s", work, asked, alice.UserID, room)
	}

	door.arm()
	replyArgs := map[string]any{"event_id": question, "body": answer}
	first := mcpTool[apiDelivery](t, cs, "reply", replyArgs)
	if first.Outcome != "created" || first.DeliveryID != "reply:"+question || first.TxnID == "" {
		t.Fatalf("the reply = %+v, want a created delivery reply:%s", first, question)
	}
	var shown string
	select {
	case shown = <-door.forwarded:
	case <-ctx.Done():
		t.Fatal("the reply never reached the homeserver")
	}
	if shown == "" {
		t.Fatal("the homeserver refused the reply the proxy passed on")
	}
	// The homeserver has the reply; the daemon does not know it.
	if n, _ := unacknowledged(t, addr, name); n != 1 {
		t.Fatalf("the daemon counts %v deliveries unacknowledged while the reply's answer is held, want 1", n)
	}
	daemon.kill(t)
	door.disarm()

	daemon = startDaemonProcess(t, bin, cfg)
	logs = append(logs, daemon.log)
	addr = daemonAddress(t, daemon.log)
	front.point(t, addr)
	again := mcpTool[apiDelivery](t, cs, "reply", replyArgs)
	if again.Outcome != "replayed" || again.DeliveryID != first.DeliveryID || again.TxnID != first.TxnID {
		t.Fatalf("the reply asked again after the restart = %+v, want the replayed delivery %+v", again, first)
	}
	// The reply route tells nothing of the delivery's state: the daemon's
	// gauge of unacknowledged deliveries does.
	awaitNothingUnacknowledged(t, addr, name)
	if third := mcpTool[apiDelivery](t, cs, "reply", replyArgs); third.Outcome != "replayed" ||
		third.DeliveryID != first.DeliveryID || third.TxnID != first.TxnID {
		t.Fatalf("the third reply = %+v, want the replayed delivery %+v", third, first)
	}
	// The reply settled the question.
	if w := mcpTool[mcpWork](t, cs, "wait_for_work", map[string]any{"wait_seconds": 0}); len(w.Events) != 0 {
		t.Fatalf("the answered question is still work: %+v", w.Events)
	}

	// The agent posts a message of its own under a key; the room is read
	// once alice sees it and the daemon has stopped.
	const after = "posted after the restart"
	sendArgs := map[string]any{"room_id": room, "key": "after-the-restart", "body": after}
	if d := mcpTool[apiDelivery](t, cs, "send", sendArgs); d.Outcome != "created" {
		t.Fatalf("the send = %+v, want created", d)
	}
	marker := awaitAcknowledged(t, "the send", func() apiDelivery { return mcpTool[apiDelivery](t, cs, "send", sendArgs) })
	alice.AwaitEvent(ctx, room, dendrite.WithID(marker.EventID))
	daemon.stop(t)

	bodies := map[string]int{}
	for _, e := range surfaceHistory(t, alice, room) {
		if e.Sender != bot.UserID || e.Type != "m.room.message" {
			continue
		}
		bodies[e.Content.Body]++
		if e.Content.Body != answer {
			continue
		}
		if e.EventID != shown {
			t.Fatalf("the room holds the reply as %s too, beside %s", e.EventID, shown)
		}
		if rel := e.Content.RelatesTo; rel == nil || rel.InReplyTo == nil || rel.InReplyTo.EventID != question {
			t.Fatalf("the reply relates as %+v, want a reply to %s", rel, question)
		}
	}
	if bodies[answer] != 1 || bodies[after] != 1 || len(bodies) != 2 {
		t.Fatalf("the agent's messages in the room, by body: %v; want %q and %q once each", bodies, answer, after)
	}
}

// An SDK client of the daemon's own MCP endpoint, streamable HTTP with the
// agent's bearer token, lists the agent's tools and rooms, reads the
// conversation, takes its work, and answers it: a reply posted twice and a
// keyed message sent twice each reach the person once. A send without a
// key is refused before anything is asked, and a wrong token is refused
// before any session starts.
func TestAnMCPClientOverHTTPListsReadsWaitsAndRepliesOnce(t *testing.T) {
	const name = "webagent"
	s := startSurfaceAgent(t, name)
	endpoint := s.base + "/mcp"
	const asked = "anyone on the web?"
	question := s.say(s.room, asked)
	cs, _, err := mcpOverHTTP(endpoint, s.token, nil, "")
	if err != nil {
		t.Fatalf("connect to %s: %v", endpoint, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	if info := cs.InitializeResult().ServerInfo; info.Name != "mindroomd" {
		t.Fatalf("server info %+v", info)
	}

	tools, err := cs.ListTools(s.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	want := []string{"ignore", "leave", "list_rooms", "react", "read_conversation", "reply", "request_approval", "send",
		"wait_for_decision", "wait_for_work"}
	if got := slices.Sorted(slices.Values(names)); !slices.Equal(got, want) {
		t.Fatalf("tools = %v, want %v", got, want)
	}

	rooms := mcpTool[struct {
		Rooms []struct {
			RoomID  string `json:"room_id"`
			Members int    `json:"members"`
			Pending int64  `json:"pending"`
		} `json:"rooms"`
	}](t, cs, "list_rooms", map[string]any{})
	if len(rooms.Rooms) != 1 || rooms.Rooms[0].RoomID != s.room || rooms.Rooms[0].Members != 2 || rooms.Rooms[0].Pending != 1 {
		t.Fatalf("list_rooms = %+v, want %s alone, with 2 members and 1 pending", rooms.Rooms, s.room)
	}
	page := mcpTool[mcpPage](t, cs, "read_conversation", map[string]any{"room_id": s.room})
	if m, ok := page.find(question); !ok || m.Sender != s.alice.UserID || m.Content.Body != asked {
		t.Fatalf("read_conversation = %+v, want %s: %q from %s", page.Messages, question, asked, s.alice.UserID)
	}
	work := mcpAwaitWork(t, cs, question)
	if work.RoomID != s.room || work.Content.Body != asked {
		t.Fatalf("wait_for_work gave %+v, want %q in %s", work, asked, s.room)
	}

	const answer = "yes, over streamable HTTP"
	replyArgs := map[string]any{"event_id": question, "body": answer}
	first := mcpTool[apiDelivery](t, cs, "reply", replyArgs)
	if first.Outcome != "created" || first.DeliveryID != "reply:"+question {
		t.Fatalf("the reply = %+v, want a created delivery reply:%s", first, question)
	}
	if again := mcpTool[apiDelivery](t, cs, "reply", replyArgs); again.Outcome != "replayed" || again.DeliveryID != first.DeliveryID {
		t.Fatalf("the reply again = %+v, want the replayed %s", again, first.DeliveryID)
	}
	s.alice.AwaitEvent(s.ctx, s.room, func(raw json.RawMessage) bool {
		e, ok := parseSurfaceEvent(raw)
		return ok && e.Sender == s.bot.UserID && e.Content.Body == answer
	})

	const posted = "posted over MCP"
	sendArgs := map[string]any{"room_id": s.room, "key": "mcp-http-1", "body": posted}
	sent := mcpTool[apiDelivery](t, cs, "send", sendArgs)
	if sent.Outcome != "created" || !strings.HasPrefix(sent.DeliveryID, "send:") {
		t.Fatalf("the send = %+v, want a created send", sent)
	}
	if again := mcpTool[apiDelivery](t, cs, "send", sendArgs); again.Outcome != "replayed" || again.DeliveryID != sent.DeliveryID {
		t.Fatalf("the send again = %+v, want the replayed %s", again, sent.DeliveryID)
	}
	message := awaitAcknowledged(t, "the send", func() apiDelivery { return mcpTool[apiDelivery](t, cs, "send", sendArgs) })
	s.alice.AwaitEvent(s.ctx, s.room, dendrite.WithID(message.EventID))
	awaitNothingUnacknowledged(t, strings.TrimPrefix(strings.TrimSuffix(s.base, "/v1/agents/"+name), "http://"), name)

	text, refusal := mcpToolError(t, cs, "send", map[string]any{"room_id": s.room, "body": "no key"})
	if !strings.HasPrefix(text, "bad_request") || refusal.Code != "bad_request" || refusal.Status != http.StatusBadRequest {
		t.Fatalf("a send without a key failed with %q %+v, want bad_request, 400", text, refusal)
	}

	// A wrong token: the endpoint answers 401 before any session starts.
	if _, door, err := mcpOverHTTP(endpoint, "not-the-token", nil, ""); err == nil {
		t.Fatal("an SDK client connected with a wrong token")
	} else if got := door.statuses(); len(got) == 0 || got[0] != http.StatusUnauthorized || slices.ContainsFunc(got, func(c int) bool { return c < 400 }) {
		t.Fatalf("a wrong token was answered %v (%v), want 401", got, err)
	} else {
		t.Logf("a wrong token: answered %v; the client's error: %v", got, err)
	}

	bodies := map[string]int{}
	for _, e := range surfaceHistory(t, s.alice, s.room) {
		if e.Sender == s.bot.UserID && e.Type == "m.room.message" {
			bodies[e.Content.Body]++
		}
	}
	if bodies[answer] != 1 || bodies[posted] != 1 || len(bodies) != 2 {
		t.Fatalf("the agent's messages in the room, by body: %v; want %q and %q once each", bodies, answer, posted)
	}
}

// A client subscribed to a room's conversation is told when a person
// speaks in it, and reading the conversation then shows the message: over
// the daemon's streamable HTTP endpoint, and over `mindroomd mcp` on stdio
// under the SDK's latest protocol and under 2025-11-25. (The endpoint is a
// stateful streamable HTTP server, which the SDK serves only under the
// protocols before 2026-07-28: its client falls back to 2025-11-25.)
func TestAnMCPSubscriberIsToldWhenItsConversationChanges(t *testing.T) {
	hs := dendrite.Start(t)
	const name, token = "watcher", "api-token-of-the-watching-agent"
	bot := hs.Register(t, name, name+"-password-71ad")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	cfg := writeHTTPAgentConfig(t, hs.URL, bot, name, token)
	d := runInProcess(cfg)
	t.Cleanup(func() {
		d.stopCleanly(t)
		if t.Failed() {
			t.Logf("the daemon's log:\n%s", d.log)
		}
	})
	api := "http://" + daemonAddress(t, d.log)
	// Once the first message is work, the agent is in the room and the
	// journal holds it.
	const before, later = "said before the subscription", "said after the subscription"
	earlier := alice.SendText(room, before)
	awaitPending(t, api+"/v1/agents/"+name, token, earlier)

	uri := mcpserver.ConversationURI(name, room, "")
	type subscriber struct {
		name  string
		cs    *mcp.ClientSession
		watch *mcpWatch
	}
	var subs []subscriber
	w := newMCPWatch()
	cs, _, err := mcpOverHTTP(api+"/v1/agents/"+name+"/mcp", token, w, "")
	if err != nil {
		t.Fatalf("connect over HTTP: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	subs = append(subs, subscriber{"HTTP, " + cs.InitializeResult().ProtocolVersion, cs, w})
	for _, protocol := range []string{"", "2025-11-25"} {
		w := newMCPWatch()
		cs := mcpStdioSession(t, w, protocol, "-config", cfg, "-agent", name, "-api", api)
		subs = append(subs, subscriber{"stdio, " + cs.InitializeResult().ProtocolVersion, cs, w})
	}
	for _, sub := range subs {
		t.Logf("subscriber over %s", sub.name)
	}
	for _, sub := range subs {
		sub.watch.subscribe(t, sub.cs, uri)
		if page := mcpReadConversation(t, sub.cs, uri); !page.has(earlier) || page.hasBody(later) {
			t.Fatalf("%s: the conversation before the message reads %+v, want %s without %q", sub.name, page.Messages, earlier, later)
		}
	}

	said := alice.SendText(room, later)
	for _, sub := range subs {
		page := sub.watch.awaitRead(t, sub.cs, uri, said)
		m, _ := page.find(said)
		if m.Sender != alice.UserID || m.Content.Body != later {
			t.Fatalf("%s: the conversation shows %s as %+v, want %q from %s", sub.name, said, m, later, alice.UserID)
		}
	}
}

// awaitNothingUnacknowledged waits until the daemon listening on addr
// holds no delivery of agent queued or attempted: every one it took is
// acknowledged, or ended.
func awaitNothingUnacknowledged(t *testing.T, addr, agent string) {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for {
		n, seen := unacknowledged(t, addr, agent)
		if seen && n == 0 {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s still has %v deliveries unacknowledged after a minute", agent, n)
		}
	}
}

// unacknowledged sums agent's mindroomd_unacknowledged_replies, queued and
// attempted, as the daemon on addr counts them; seen reports that it
// counted them.
func unacknowledged(t *testing.T, addr, agent string) (n float64, seen bool) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %v %s", err, resp.Status)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "mindroomd_unacknowledged_replies{") || !strings.Contains(line, `agent="`+agent+`"`) {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			t.Fatalf("metrics: %q: %v", line, err)
		}
		n, seen = n+v, true
	}
	return n, seen
}

// finalReply reports whether a send's content is the final stage of an
// answer of the reply route.
func finalReply(body []byte) bool {
	var c struct {
		Delivery *struct {
			DeliveryID string `json:"delivery_id"`
			Stage      string `json:"stage"`
		} `json:"io.mindroomd.delivery"`
	}
	return json.Unmarshal(body, &c) == nil && c.Delivery != nil && c.Delivery.Stage == "final" &&
		strings.HasPrefix(c.Delivery.DeliveryID, "reply:")
}

// apiFront is a fixed address in front of the agent API of whichever
// daemon runs now: a daemon listening on port 0 moves on each restart.
type apiFront struct {
	URL    string
	target atomic.Pointer[url.URL]
}

func startAPIFront(t *testing.T) *apiFront {
	t.Helper()
	f := &apiFront{}
	proxy := &httputil.ReverseProxy{
		Rewrite:  func(r *httputil.ProxyRequest) { r.SetURL(f.target.Load()) },
		ErrorLog: log.New(io.Discard, "", 0),
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	f.URL = srv.URL
	return f
}

// point sends everything on to the daemon listening on addr.
func (f *apiFront) point(t *testing.T, addr string) {
	t.Helper()
	u, err := url.Parse("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	f.target.Store(u)
}

// bearerDoor adds the agent's bearer token to every request an MCP
// client makes, and records the status of each answer.
type bearerDoor struct {
	token string
	mu    sync.Mutex
	codes []int
}

func (b *bearerDoor) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil {
		b.mu.Lock()
		b.codes = append(b.codes, resp.StatusCode)
		b.mu.Unlock()
	}
	return resp, err
}

// statuses are the statuses answered so far, in order.
func (b *bearerDoor) statuses() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.codes)
}

// mcpOverHTTP connects an SDK client (mcpClient(w)) to an agent's MCP
// endpoint with token, under protocol ("" for the SDK's latest). A refused
// connection is not retried.
func mcpOverHTTP(endpoint, token string, w *mcpWatch, protocol string) (*mcp.ClientSession, *bearerDoor, error) {
	door := &bearerDoor{token: token}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcpClient(w).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: door}, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: protocol})
	return cs, door, err
}

// mcpStdioSession is mcpCommandSession with the client (mcpClient(w)) and
// the protocol version ("" for the SDK's latest) of the test's choosing.
func mcpStdioSession(t *testing.T, w *mcpWatch, protocol string, args ...string) *mcp.ClientSession {
	t.Helper()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"mcp"}, args...)...)
	cmd.Env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	stderr := &logbuf.Buffer{}
	cmd.Stderr = stderr
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcpClient(w).Connect(ctx,
		&mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr)
	}
	t.Cleanup(func() {
		if err := cs.Close(); err != nil {
			t.Errorf("close: %v\n%s", err, stderr)
		}
		if cmd.ProcessState == nil || !cmd.ProcessState.Success() || t.Failed() {
			t.Logf("mcp exited %v; its log:\n%s", cmd.ProcessState, stderr)
		}
	})
	return cs
}

// mcpToolError calls a tool that must fail and returns its text and its
// structured error.
func mcpToolError(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (string, struct {
	Code   string `json:"code"`
	Status int    `json:"status"`
}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	b, _ := json.Marshal(res.StructuredContent)
	if !res.IsError {
		t.Fatalf("%s succeeded: %s", name, b)
	}
	var text string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	var e struct {
		Code   string `json:"code"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("%s: %s: %v", name, b, err)
	}
	return text, e
}

// mcpWork is the wait_for_work answer as these tests read it.
type mcpWork struct {
	Events []mcpWorkEvent `json:"events"`
	// NextAfter is the after of the next call.
	NextAfter int64 `json:"next_after"`
}

type mcpWorkEvent struct {
	EventID string `json:"event_id"`
	RoomID  string `json:"room_id"`
	Sender  string `json:"sender"`
	Content struct {
		Body string `json:"body"`
	} `json:"content"`
}

// mcpAwaitWork calls wait_for_work, each call after the last, until it
// gives eventID, and returns that event.
func mcpAwaitWork(t *testing.T, cs *mcp.ClientSession, eventID string) mcpWorkEvent {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var after int64
	for time.Now().Before(deadline) {
		w := mcpTool[mcpWork](t, cs, "wait_for_work", map[string]any{"after": after, "wait_seconds": 20})
		for _, e := range w.Events {
			if e.EventID == eventID {
				return e
			}
		}
		after = max(after, w.NextAfter)
	}
	t.Fatalf("wait_for_work never gave %s", eventID)
	return mcpWorkEvent{}
}

// mcpPage is a page of a conversation, from read_conversation or a
// conversation resource.
type mcpPage struct {
	Messages []mcpMessage `json:"messages"`
}

type mcpMessage struct {
	EventID string `json:"event_id"`
	Sender  string `json:"sender"`
	Content struct {
		Body string `json:"body"`
	} `json:"content"`
}

// find is the message eventID of the page.
func (p mcpPage) find(eventID string) (mcpMessage, bool) {
	i := slices.IndexFunc(p.Messages, func(m mcpMessage) bool { return m.EventID == eventID })
	if i < 0 {
		return mcpMessage{}, false
	}
	return p.Messages[i], true
}

func (p mcpPage) has(eventID string) bool { _, ok := p.find(eventID); return ok }

func (p mcpPage) hasBody(body string) bool {
	return slices.ContainsFunc(p.Messages, func(m mcpMessage) bool { return m.Content.Body == body })
}

// mcpReadConversation reads the conversation resource uri.
func mcpReadConversation(t *testing.T, cs *mcp.ClientSession, uri string) mcpPage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		t.Fatalf("read %s: %v", uri, err)
	}
	if len(res.Contents) != 1 || res.Contents[0].URI != uri || res.Contents[0].MIMEType != "application/json" {
		t.Fatalf("read %s: %+v", uri, res.Contents)
	}
	var page mcpPage
	if err := json.Unmarshal([]byte(res.Contents[0].Text), &page); err != nil {
		t.Fatalf("read %s: %s: %v", uri, res.Contents[0].Text, err)
	}
	return page
}

// mcpWatch is what a client is told about its subscriptions: each
// resources/updated by URI, and each acknowledgement of a subscription
// (the latest protocol's answer that one is in place).
type mcpWatch struct {
	mu      sync.Mutex
	updated map[string]int
	acked   int
	// changed is signalled after each notification.
	changed chan struct{}
}

func newMCPWatch() *mcpWatch {
	return &mcpWatch{updated: map[string]int{}, changed: make(chan struct{}, 1)}
}

// mcpClient is an SDK client; with w, one that tells w what it is told.
func mcpClient(w *mcpWatch) *mcp.Client {
	impl := &mcp.Implementation{Name: "test", Version: "v0"}
	if w == nil {
		return mcp.NewClient(impl, nil)
	}
	c := mcp.NewClient(impl, &mcp.ClientOptions{
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			w.note(func() { w.updated[req.Params.URI]++ })
		},
	})
	// The SDK has no handler of its own for the acknowledgement.
	c.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "notifications/subscriptions/acknowledged" {
				w.note(func() { w.acked++ })
			}
			return next(ctx, method, req)
		}
	})
	return c
}

func (w *mcpWatch) note(f func()) {
	w.mu.Lock()
	f()
	w.mu.Unlock()
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *mcpWatch) counts(uri string) (updated, acked int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.updated[uri], w.acked
}

// await waits until done holds of the counts of uri.
func (w *mcpWatch) await(t *testing.T, what, uri string, done func(updated, acked int) bool) {
	t.Helper()
	deadline := time.After(time.Minute)
	for !done(w.counts(uri)) {
		select {
		case <-w.changed:
		case <-deadline:
			u, a := w.counts(uri)
			t.Fatalf("%s: not within a minute (%d updates, %d acknowledgements)", what, u, a)
		}
	}
}

// subscribe subscribes cs to uri and returns once the subscription is in
// place: under 2025-11-25 the request's answer says so; under the latest
// protocol the server's acknowledgement does.
func (w *mcpWatch) subscribe(t *testing.T, cs *mcp.ClientSession, uri string) {
	t.Helper()
	_, acked := w.counts(uri)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatalf("subscribe %s: %v", uri, err)
	}
	if cs.InitializeResult().ProtocolVersion >= "2026-07-28" {
		w.await(t, "the subscription's acknowledgement", uri, func(_, a int) bool { return a > acked })
	}
}

// awaitRead waits for a notification of uri, reads the conversation, and
// so on until the conversation shows eventID; it returns that page.
func (w *mcpWatch) awaitRead(t *testing.T, cs *mcp.ClientSession, uri, eventID string) mcpPage {
	t.Helper()
	read := 0
	for {
		var seen int
		w.await(t, "a notification of "+uri+" that shows "+eventID, uri, func(u, _ int) bool { seen = u; return u > read })
		read = seen
		if page := mcpReadConversation(t, cs, uri); page.has(eventID) {
			return page
		}
	}
}
