package mcpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/mcpserver"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const (
	room       = "!room:example.org"
	otherRoom  = "!other:example.org"
	alice      = "@alice:example.org"
	alphaToken = "alpha-secret"
	betaToken  = "beta-secret"

	// testTimeout bounds each test's MCP calls; none takes more than a
	// fraction of it.
	testTimeout = 30 * time.Second
)

// fixture is a real agent API over an on-disk journal with two agents,
// alpha and beta, served over the network and in memory.
type fixture struct {
	st    *store.Store
	alpha journal.PrincipalStore
	api   http.Handler
	srv   *httptest.Server
	left  chan string
	// calls counts the API's requests by method and path.
	mu    sync.Mutex
	calls []string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	st, _ := testsupport.MustOpen(t)
	ctx := context.Background()
	alpha, err := st.Principal(ctx, "alpha", "@alpha:example.org")
	if err != nil {
		t.Fatal(err)
	}
	beta, err := st.Principal(ctx, "beta", "@beta:example.org")
	if err != nil {
		t.Fatal(err)
	}
	fx := &fixture{st: st, alpha: alpha, left: make(chan string, 1)}
	h := api.New(api.Deps{
		Agents: map[string]api.Agent{
			"alpha": {Store: alpha, Token: alphaToken, Hints: st.Hints(), Homeserver: homeserver{},
				Leave: func(_ context.Context, roomID string) error { fx.left <- roomID; return nil }},
			"beta": {Store: beta, Token: betaToken, Hints: st.Hints()},
		},
		Log:       zerolog.Nop(),
		CursorKey: []byte("test cursor key"),
		// The journal's clock, which approvals' expiries are reckoned by.
		Now: func() time.Time { return testsupport.DefaultNow },
	})
	fx.api = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fx.mu.Lock()
		fx.calls = append(fx.calls, r.Method+" "+r.URL.Path)
		fx.mu.Unlock()
		h.ServeHTTP(w, r)
	})
	fx.srv = httptest.NewServer(fx.api)
	t.Cleanup(fx.srv.Close)
	return fx
}

// homeserver stands in for alpha's homeserver: it is joined to room, an
// encrypted room of three named Support.
type homeserver struct{}

func (homeserver) Typing(context.Context, string, bool, time.Duration) error { return nil }
func (homeserver) JoinedRooms(context.Context) ([]string, error)             { return []string{room}, nil }
func (homeserver) RoomSummary(context.Context, string) (api.RoomSummary, error) {
	return api.RoomSummary{Name: "Support", Encrypted: true, Members: 3}, nil
}
func (homeserver) JoinedMembers(context.Context, string) ([]api.Member, error) { return nil, nil }
func (homeserver) Download(context.Context, string, string, int64) (*api.Media, error) {
	return nil, errors.New("no media here")
}
func (homeserver) Upload(context.Context, string, string, string, io.Reader, int64) (journal.Attachment, error) {
	return journal.Attachment{}, errors.New("no media here")
}

// called reports whether the API was asked for a path ending in suffix.
func (fx *fixture) called(suffix string) bool {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	return slices.ContainsFunc(fx.calls, func(c string) bool { return strings.HasSuffix(c, suffix) })
}

func (fx *fixture) admit(t *testing.T, roomID string, evs ...mx.Ev) {
	t.Helper()
	res, err := fx.alpha.AdmitBatch(context.Background(), mx.Live(roomID, evs...), "")
	if err != nil {
		t.Fatalf("admit: %v", err)
	}
	for _, r := range res {
		if r.Outcome != journal.Admitted {
			t.Fatalf("admit %s: %s %v", r.EventID, r.Outcome, r.Err)
		}
	}
}

// connect runs the MCP server opts configure and returns an SDK client's
// session of it, over in-memory transports.
func connect(t *testing.T, opts mcpserver.Options, copts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	server := mcpserver.New(opts)
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatalf("server connect: %v", err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, copts).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatalf("client connect: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// overNetwork is alpha's MCP session calling the API over the network, as
// mindroomd mcp does.
func (fx *fixture) overNetwork(t *testing.T) *mcp.ClientSession {
	return connect(t, mcpserver.Options{Agent: "alpha", API: fx.srv.URL, Token: alphaToken, Log: zerolog.Nop()}, nil)
}

// call calls a tool and fails the test on a protocol error.
func call(t *testing.T, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

// ok calls a tool that must succeed and decodes its structured content.
func ok[T any](t *testing.T, cs *mcp.ClientSession, name string, args any) T {
	t.Helper()
	res := call(t, cs, name, args)
	if res.IsError {
		t.Fatalf("%s(%v) failed: %s", name, args, text(res))
	}
	var out T
	b, err := json.Marshal(res.StructuredContent)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	if err != nil {
		t.Fatalf("%s: structured content %s: %v", name, b, err)
	}
	// The text is the same JSON, for clients that read only text.
	var fromText T
	if err := json.Unmarshal([]byte(text(res)), &fromText); err != nil {
		t.Fatalf("%s: text content %q is not the JSON: %v", name, text(res), err)
	}
	return out
}

// toolError is the structured content of a tool error.
type toolError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Status  int    `json:"status"`
}

// fails calls a tool that must fail with code and status.
func fails(t *testing.T, cs *mcp.ClientSession, name string, args any, code string, status int) toolError {
	t.Helper()
	res := call(t, cs, name, args)
	if !res.IsError {
		t.Fatalf("%s(%v) succeeded, want %s: %s", name, args, code, text(res))
	}
	if !strings.HasPrefix(text(res), code+": ") {
		t.Fatalf("%s: error text %q does not start with %q", name, text(res), code+": ")
	}
	var e toolError
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &e); err != nil || e.Code != code || e.Status != status || e.Message == "" {
		t.Fatalf("%s: structured error %s, want code %s status %d", name, b, code, status)
	}
	return e
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

type pendingOut struct {
	Events []struct {
		Position int64           `json:"position"`
		EventID  string          `json:"event_id"`
		RoomID   string          `json:"room_id"`
		ThreadID *string         `json:"thread_id"`
		Sender   string          `json:"sender"`
		Content  json.RawMessage `json:"content"`
	} `json:"events"`
	NextAfter int64 `json:"next_after"`
	TimedOut  bool  `json:"timed_out"`
}

type messagesOut struct {
	Messages []struct {
		EventID string          `json:"event_id"`
		Sender  string          `json:"sender"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	NextCursor  *string  `json:"next_cursor"`
	OwedRefetch []string `json:"owed_refetch"`
}

type deliveryOut struct {
	DeliveryID string `json:"delivery_id"`
	TxnID      string `json:"txn_id"`
	Outcome    string `json:"outcome"`
	State      string `json:"state"`
}

func TestMCPListsTheToolsWithSchemasAndAnnotations(t *testing.T) {
	fx := newFixture(t)
	cs := fx.overNetwork(t)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	type schema struct {
		Type       string                    `json:"type"`
		Required   []string                  `json:"required"`
		Properties map[string]map[string]any `json:"properties"`
	}
	tools := map[string]*mcp.Tool{}
	for _, tool := range res.Tools {
		tools[tool.Name] = tool
	}
	want := map[string]struct {
		required, optional                []string
		readOnly, idempotent, destructive bool
	}{
		"list_rooms":        {readOnly: true},
		"read_conversation": {required: []string{"room_id"}, optional: []string{"thread", "limit", "before", "strict"}, readOnly: true},
		"wait_for_work":     {optional: []string{"after", "wait_seconds", "limit"}, readOnly: true},
		"reply":             {required: []string{"event_id", "body"}, optional: []string{"format", "room_id"}, idempotent: true},
		// key is required, but checked by the tool: a missing key is the
		// API's bad_request, not a schema failure.
		"send":   {required: []string{"room_id", "body"}, optional: []string{"key", "format", "thread", "reply_to"}, idempotent: true},
		"react":  {required: []string{"event_id", "key"}, idempotent: true},
		"ignore": {required: []string{"event_id"}, idempotent: true},
		"leave":  {required: []string{"room_id"}, idempotent: true, destructive: true},
		"request_approval": {required: []string{"event_id", "call_id", "tool", "arguments"},
			optional: []string{"approvers", "expires_in_s", "secret", "rendering", "context"}, idempotent: true},
		"wait_for_decision": {required: []string{"event_id", "call_id"}, optional: []string{"wait_seconds"}, readOnly: true},
	}
	if len(tools) != len(want) {
		t.Fatalf("tools = %v, want %d", slices.Collect(func(yield func(string) bool) {
			for n := range tools {
				if !yield(n) {
					return
				}
			}
		}), len(want))
	}
	for name, w := range want {
		tool := tools[name]
		if tool == nil {
			t.Fatalf("no tool %s", name)
		}
		if tool.Description == "" || tool.OutputSchema == nil {
			t.Errorf("%s: description %q, output schema %v", name, tool.Description, tool.OutputSchema)
		}
		var s schema
		b, _ := json.Marshal(tool.InputSchema)
		if err := json.Unmarshal(b, &s); err != nil || s.Type != "object" {
			t.Fatalf("%s: input schema %s", name, b)
		}
		if got := slices.Sorted(slices.Values(s.Required)); !slices.Equal(got, slices.Sorted(slices.Values(w.required))) {
			t.Errorf("%s: required %v, want %v", name, got, w.required)
		}
		for _, p := range append(slices.Clone(w.required), w.optional...) {
			if s.Properties[p] == nil || s.Properties[p]["description"] == "" {
				t.Errorf("%s: property %s missing or undescribed in %s", name, p, b)
			}
		}
		if len(s.Properties) != len(w.required)+len(w.optional) {
			t.Errorf("%s: properties %s", name, b)
		}
		a := tool.Annotations
		if a == nil || a.ReadOnlyHint != w.readOnly || a.Title == "" {
			t.Fatalf("%s: annotations %+v", name, a)
		}
		if !w.readOnly {
			if a.IdempotentHint != w.idempotent || a.DestructiveHint == nil || *a.DestructiveHint != w.destructive {
				t.Errorf("%s: idempotent %v destructive %v, want %v %v", name, a.IdempotentHint, a.DestructiveHint, w.idempotent, w.destructive)
			}
		}
		if a.OpenWorldHint == nil {
			t.Errorf("%s: no openWorldHint", name)
		}
	}
	b, _ := json.Marshal(tools["wait_for_work"].InputSchema)
	var s schema
	_ = json.Unmarshal(b, &s)
	if w := s.Properties["wait_seconds"]; w["maximum"] != 300.0 || w["minimum"] != 0.0 || w["default"] != 30.0 {
		t.Errorf("wait_seconds schema %v", w)
	}
	b, _ = json.Marshal(tools["reply"].InputSchema)
	_ = json.Unmarshal(b, &s)
	if f := s.Properties["format"]; !slices.Equal(f["enum"].([]any), []any{"markdown", "plain"}) {
		t.Errorf("format schema %v", f)
	}
}

func TestMCPReadConversationPagesBackThroughARoom(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "one"), mx.Message("$e2", alice, 1001, "two"),
		mx.ThreadReply("$t1", alice, 1002, "$e1", "in the thread"))
	cs := fx.overNetwork(t)
	first := ok[messagesOut](t, cs, "read_conversation", map[string]any{"room_id": room, "limit": 1})
	if len(first.Messages) != 1 || first.Messages[0].EventID != "$e2" || first.NextCursor == nil {
		t.Fatalf("first page = %+v", first)
	}
	if first.OwedRefetch == nil || !strings.Contains(string(first.Messages[0].Content), `"two"`) {
		t.Fatalf("first page = %+v", first)
	}
	second := ok[messagesOut](t, cs, "read_conversation", map[string]any{"room_id": room, "limit": 1, "before": *first.NextCursor})
	if len(second.Messages) != 1 || second.Messages[0].EventID != "$e1" {
		t.Fatalf("second page = %+v", second)
	}
	thread := ok[messagesOut](t, cs, "read_conversation", map[string]any{"room_id": room, "thread": "$e1"})
	var ids []string
	for _, m := range thread.Messages {
		ids = append(ids, m.EventID)
	}
	if !slices.Equal(ids, []string{"$e1", "$t1"}) {
		t.Fatalf("thread = %v", ids)
	}
	// The API's refusal comes back as the tool's error, code first.
	fails(t, cs, "read_conversation", map[string]any{"room_id": room, "before": "not-a-cursor"}, "bad_request", 400)
	fails(t, cs, "read_conversation", map[string]any{"room_id": "not-a-room"}, "bad_request", 400)
}

func TestMCPWaitForWorkReturnsAdmittedPendingEventsAndACursor(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "question"))
	cs := fx.overNetwork(t)
	page := ok[pendingOut](t, cs, "wait_for_work", map[string]any{"wait_seconds": 0})
	if len(page.Events) != 1 || page.Events[0].EventID != "$q" || page.Events[0].RoomID != room ||
		page.Events[0].Sender != alice || !strings.Contains(string(page.Events[0].Content), "question") {
		t.Fatalf("pending = %+v", page)
	}
	if page.NextAfter != page.Events[0].Position || page.TimedOut {
		t.Fatalf("next_after %d timed_out %v", page.NextAfter, page.TimedOut)
	}
	// Nothing behind the cursor: the wait runs out.
	empty := ok[pendingOut](t, cs, "wait_for_work", map[string]any{"after": page.NextAfter, "wait_seconds": 1})
	if len(empty.Events) != 0 || !empty.TimedOut || empty.NextAfter != page.NextAfter {
		t.Fatalf("after the cursor = %+v", empty)
	}
	// A long-poll is answered by the admission it waited for.
	done := make(chan pendingOut, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "wait_for_work",
			Arguments: map[string]any{"after": page.NextAfter}})
		var out pendingOut
		if err == nil && !res.IsError {
			b, _ := json.Marshal(res.StructuredContent)
			_ = json.Unmarshal(b, &out)
		}
		done <- out
	}()
	time.Sleep(100 * time.Millisecond)
	fx.admit(t, room, mx.Message("$late", alice, 1001, "late"))
	select {
	case late := <-done:
		if len(late.Events) != 1 || late.Events[0].EventID != "$late" {
			t.Fatalf("long-poll = %+v", late)
		}
	case <-time.After(testTimeout):
		t.Fatal("the long-poll did not end with the admission")
	}
	// Work is not taken by reading it: from 0 it all comes again.
	again := ok[pendingOut](t, cs, "wait_for_work", map[string]any{"wait_seconds": 0})
	if len(again.Events) != 2 {
		t.Fatalf("pending from 0 = %+v", again)
	}
}

func TestMCPReplyEnqueuesOnceAndSettlesTheEvent(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "question"))
	cs := fx.overNetwork(t)
	first := ok[deliveryOut](t, cs, "reply", map[string]any{"event_id": "$q", "body": "answer"})
	if first.DeliveryID != "reply:$q" || first.Outcome != "created" || first.TxnID == "" {
		t.Fatalf("first reply = %+v", first)
	}
	again := ok[deliveryOut](t, cs, "reply", map[string]any{"event_id": "$q", "body": "answer"})
	if again.DeliveryID != first.DeliveryID || again.TxnID != first.TxnID || again.Outcome != "replayed" {
		t.Fatalf("second reply = %+v, first %+v", again, first)
	}
	ctx := context.Background()
	rows, err := fx.alpha.Unacknowledged(ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].TxnID != first.TxnID {
		t.Fatalf("outbox holds %d rows, want the one reply", len(rows))
	}
	d, err := fx.alpha.Delivery(ctx, "reply:$q", journal.StageFinal)
	if err != nil || !strings.Contains(string(d.Content), `"answer"`) {
		t.Fatalf("delivery %s %v", d.Content, err)
	}
	e := fails(t, cs, "reply", map[string]any{"event_id": "$q", "body": "another answer"}, "conflict", 409)
	if !strings.Contains(e.Message, "different reply") {
		t.Fatalf("conflict message %q", e.Message)
	}
	if page := ok[pendingOut](t, cs, "wait_for_work", map[string]any{"wait_seconds": 0}); len(page.Events) != 0 {
		t.Fatalf("still pending after the reply: %+v", page)
	}
	fails(t, cs, "reply", map[string]any{"event_id": "$never", "body": "answer"}, "not_found", 404)
}

func TestMCPIgnoreSettlesAndLeaveLeaves(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "question"))
	cs := fx.overNetwork(t)
	out := ok[map[string]any](t, cs, "ignore", map[string]any{"event_id": "$q"})
	if out["event_id"] != "$q" || out["settled"] != true {
		t.Fatalf("ignore = %v", out)
	}
	fails(t, cs, "ignore", map[string]any{"event_id": "$q"}, "not_found", 404)
	left := ok[map[string]any](t, cs, "leave", map[string]any{"room_id": room})
	if left["room_id"] != room || left["left"] != true {
		t.Fatalf("leave = %v", left)
	}
	select {
	case got := <-fx.left:
		if got != room {
			t.Fatalf("left %s, want %s", got, room)
		}
	default:
		t.Fatal("the principal was not asked to leave")
	}
}

func TestMCPAnUnknownToolIsAnError(t *testing.T) {
	fx := newFixture(t)
	cs := fx.overNetwork(t)
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "delete_everything", Arguments: map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Fatalf("unknown tool: %v", err)
	}
}

func TestMCPArgumentsOfTheWrongTypeAreAnErrorAndReachNoRoute(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "question"))
	cs := fx.overNetwork(t)
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"read_conversation", map[string]any{"room_id": 42}},
		{"read_conversation", map[string]any{}},
		{"read_conversation", map[string]any{"room_id": room, "limit": 1001}},
		{"wait_for_work", map[string]any{"wait_seconds": 301}},
		{"wait_for_work", map[string]any{"wait_seconds": "soon"}},
		{"wait_for_work", map[string]any{"after": -1}},
		{"reply", map[string]any{"event_id": "$q", "body": "answer", "format": "html"}},
		{"reply", map[string]any{"event_id": "$q", "body": "answer", "placeholder": true}},
		{"reply", map[string]any{"event_id": "$q", "body": []string{"answer"}}},
		{"ignore", map[string]any{"event_id": true}},
	} {
		res := call(t, cs, tc.tool, tc.args)
		if !res.IsError {
			t.Errorf("%s(%v) succeeded: %s", tc.tool, tc.args, text(res))
		}
	}
	if fx.called("/reply") || fx.called("/ignore") || fx.called("/messages") || fx.called("/pending") {
		t.Fatalf("a refused argument reached the API: %v", fx.calls)
	}
	rows, err := fx.alpha.Unacknowledged(context.Background(), 10, nil)
	if err != nil || len(rows) != 0 {
		t.Fatalf("outbox holds %d rows (%v)", len(rows), err)
	}
}

func TestMCPSendWithoutAKeyIsABadRequestAndAsksNothing(t *testing.T) {
	fx := newFixture(t)
	cs := fx.overNetwork(t)
	e := fails(t, cs, "send", map[string]any{"room_id": room, "body": "hello"}, "bad_request", 400)
	if !strings.Contains(e.Message, "key") {
		t.Fatalf("message %q does not name the key", e.Message)
	}
	if fx.called("/send") {
		t.Fatalf("the API was asked: %v", fx.calls)
	}
	rows, err := fx.alpha.Unacknowledged(context.Background(), 10, nil)
	if err != nil || len(rows) != 0 {
		t.Fatalf("outbox holds %d rows (%v)", len(rows), err)
	}
}

func TestMCPAnotherAgentsTokenFailsEveryToolAsTheAPIRefusesIt(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "for alpha only"))
	cs := connect(t, mcpserver.Options{Agent: "alpha", API: fx.srv.URL, Token: betaToken}, nil)
	fails(t, cs, "wait_for_work", map[string]any{"wait_seconds": 0}, "forbidden", 403)
	fails(t, cs, "reply", map[string]any{"event_id": "$q", "body": "answer"}, "forbidden", 403)
	wrong := connect(t, mcpserver.Options{Agent: "alpha", API: fx.srv.URL, Token: "not-a-token"}, nil)
	fails(t, wrong, "read_conversation", map[string]any{"room_id": room}, "unauthorized", 401)
}

func TestMCPAnAPINobodyServesIsUnavailable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close() // its port now refuses connections
	cs := connect(t, mcpserver.Options{Agent: "alpha", API: srv.URL, Token: alphaToken}, nil)
	fails(t, cs, "list_rooms", map[string]any{}, "unavailable", 0)
}

func TestMCPToolsServedInMemoryCallTheHandler(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "question"))
	cs := connect(t, mcpserver.Options{Agent: "alpha", Handler: fx.api, Token: alphaToken}, nil)
	page := ok[pendingOut](t, cs, "wait_for_work", map[string]any{"wait_seconds": 0})
	if len(page.Events) != 1 || page.Events[0].EventID != "$q" {
		t.Fatalf("pending = %+v", page)
	}
	if got := ok[deliveryOut](t, cs, "reply", map[string]any{"event_id": "$q", "body": "answer", "room_id": room}); got.Outcome != "created" {
		t.Fatalf("reply = %+v", got)
	}
	// A long-poll in memory is cancelled with its MCP request.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "wait_for_work", Arguments: map[string]any{"wait_seconds": 300}})
	if err == nil || time.Since(start) > 10*time.Second {
		t.Fatalf("a cancelled wait ended after %s: %v", time.Since(start), err)
	}
}

// waitFor polls cond until it holds or the test's time runs out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMCPListRoomsListsTheJoinedRoomsWithTheirWork(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "question"))
	cs := fx.overNetwork(t)
	out := ok[struct {
		Rooms []struct {
			RoomID          string `json:"room_id"`
			Name            string `json:"name"`
			Encrypted       bool   `json:"encrypted"`
			Members         int    `json:"members"`
			NewestMessageTS int64  `json:"newest_message_ts"`
			Pending         int64  `json:"pending"`
		} `json:"rooms"`
	}](t, cs, "list_rooms", map[string]any{})
	if len(out.Rooms) != 1 {
		t.Fatalf("rooms = %+v", out.Rooms)
	}
	if r := out.Rooms[0]; r.RoomID != room || r.Name != "Support" || !r.Encrypted || r.Members != 3 ||
		r.NewestMessageTS != 1000 || r.Pending != 1 {
		t.Fatalf("room = %+v", r)
	}
	// Beta has no homeserver here: the API's 501 is the tool's error.
	beta := connect(t, mcpserver.Options{Agent: "beta", API: fx.srv.URL, Token: betaToken}, nil)
	fails(t, beta, "list_rooms", map[string]any{}, "not_implemented", 501)
}

func TestMCPSendIsOneMessagePerKey(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "question"))
	cs := fx.overNetwork(t)
	first := ok[deliveryOut](t, cs, "send", map[string]any{"room_id": room, "key": "report-1", "body": "**all** green"})
	if first.Outcome != "created" || !strings.HasPrefix(first.DeliveryID, "send:") {
		t.Fatalf("send = %+v", first)
	}
	again := ok[deliveryOut](t, cs, "send", map[string]any{"room_id": room, "key": "report-1", "body": "**all** green"})
	if again.Outcome != "replayed" || again.DeliveryID != first.DeliveryID || again.TxnID != first.TxnID {
		t.Fatalf("send again = %+v, first %+v", again, first)
	}
	fails(t, cs, "send", map[string]any{"room_id": room, "key": "report-1", "body": "all red"}, "conflict", 409)
	// A room the agent is not in.
	fails(t, cs, "send", map[string]any{"room_id": otherRoom, "key": "report-1", "body": "hello"}, "conflict", 409)
	reply := ok[deliveryOut](t, cs, "send", map[string]any{"room_id": room, "key": "follow-up", "body": "and more",
		"format": "plain", "reply_to": "$q"})
	if reply.Outcome != "created" || reply.DeliveryID == first.DeliveryID {
		t.Fatalf("send as a reply = %+v", reply)
	}
	ctx := context.Background()
	rows, err := fx.alpha.Unacknowledged(ctx, 10, nil)
	if err != nil || len(rows) != 2 {
		t.Fatalf("outbox holds %d rows (%v), want the two sends", len(rows), err)
	}
	d, err := fx.alpha.Delivery(ctx, reply.DeliveryID, journal.StageFinal)
	if err != nil || !strings.Contains(string(d.Content), `"m.in_reply_to"`) || strings.Contains(string(d.Content), "formatted_body") {
		t.Fatalf("the reply's content %s (%v)", d.Content, err)
	}
	// Sending settles nothing.
	if page := ok[pendingOut](t, cs, "wait_for_work", map[string]any{"wait_seconds": 0}); len(page.Events) != 1 {
		t.Fatalf("pending after the sends = %+v", page)
	}
}

func TestMCPReactIsOncePerEventAndKey(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "question"))
	cs := fx.overNetwork(t)
	first := ok[deliveryOut](t, cs, "react", map[string]any{"event_id": "$q", "key": "👍"})
	if first.Outcome != "created" || first.State != "queued" {
		t.Fatalf("react = %+v", first)
	}
	again := ok[deliveryOut](t, cs, "react", map[string]any{"event_id": "$q", "key": "👍"})
	if again.Outcome != "replayed" || again.DeliveryID != first.DeliveryID {
		t.Fatalf("react again = %+v, first %+v", again, first)
	}
	d, err := fx.alpha.Delivery(context.Background(), first.DeliveryID, journal.StageFinal)
	if err != nil || !strings.Contains(string(d.Content), `"m.annotation"`) || !strings.Contains(string(d.Content), "👍") {
		t.Fatalf("the reaction's content %s (%v)", d.Content, err)
	}
	fails(t, cs, "react", map[string]any{"event_id": "$never", "key": "👍"}, "not_found", 404)
	fails(t, cs, "react", map[string]any{"event_id": "$q", "key": ""}, "bad_request", 400)
}
