package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/journal"
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

	// requestTimeout bounds every request of a test; nothing here takes
	// more than a fraction of it.
	requestTimeout = 20 * time.Second
)

// readSignal tells a test each time the API read the pending backlog and
// found nothing, so a test can act while a long-poll waits.
type readSignal struct {
	journal.PrincipalStore
	empty chan struct{}
}

func (s *readSignal) Pending(ctx context.Context, limit int, after int64) (journal.PendingPage, error) {
	page, err := s.PrincipalStore.Pending(ctx, limit, after)
	if err == nil && len(page.Events) == 0 {
		select {
		case s.empty <- struct{}{}:
		default:
		}
	}
	return page, err
}

type fixture struct {
	st    *store.Store
	alpha journal.PrincipalStore
	beta  journal.PrincipalStore
	srv   *httptest.Server
	left  chan string
	empty chan struct{}
}

func newFixture(t *testing.T, tune func(*api.Deps)) *fixture {
	t.Helper()
	st, _ := testsupport.MustOpen(t)
	ctx := context.Background()
	alpha, err := st.Principal(ctx, "alpha", "@alpha:example.org")
	if err != nil {
		t.Fatalf("principal: %v", err)
	}
	beta, err := st.Principal(ctx, "beta", "@beta:example.org")
	if err != nil {
		t.Fatalf("principal: %v", err)
	}
	fx := &fixture{st: st, alpha: alpha, beta: beta, left: make(chan string, 1), empty: make(chan struct{}, 1)}
	deps := api.Deps{
		Agents: map[string]api.Agent{
			"alpha": {Store: &readSignal{PrincipalStore: alpha, empty: fx.empty}, Token: alphaToken, Hints: st.Hints(),
				Leave: func(_ context.Context, roomID string) error { fx.left <- roomID; return nil }},
			"beta": {Store: beta, Token: betaToken, Hints: st.Hints()},
		},
		Log:       zerolog.Nop(),
		CursorKey: []byte("test cursor key"),
	}
	if tune != nil {
		tune(&deps)
	}
	fx.srv = httptest.NewServer(api.New(deps))
	t.Cleanup(fx.srv.Close)
	return fx
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

func (fx *fixture) pendingIDs(t *testing.T) []string {
	t.Helper()
	page, err := fx.alpha.Pending(context.Background(), 100, 0)
	if err != nil {
		t.Fatalf("pending: %v", err)
	}
	var ids []string
	for _, e := range page.Events {
		ids = append(ids, e.EventID)
	}
	return ids
}

// do sends a request with a bearer token ("" for none) and returns the
// status and body.
func (fx *fixture) do(t *testing.T, method, path, token string, body io.Reader) (int, []byte) {
	t.Helper()
	resp := fx.send(t, method, path, token, body, nil)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp.StatusCode, b
}

func (fx *fixture) send(t *testing.T, method, path, token string, body io.Reader, header http.Header) *http.Response {
	t.Helper()
	// Bounded, so a stream or poll that never answers fails the test
	// instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, method, fx.srv.URL+path, body)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := fx.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// wantError checks a refusal's status and that its body is the JSON error.
func wantError(t *testing.T, status int, body []byte, wantStatus int, wantCode string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status = %d, want %d (body %s)", status, wantStatus, body)
	}
	if got := decode[apiError](t, body).Error.Code; got != wantCode {
		t.Fatalf("error code = %q, want %q (body %s)", got, wantCode, body)
	}
}

type messagesBody struct {
	Messages []struct {
		EventID   string          `json:"event_id"`
		Sender    string          `json:"sender"`
		CreatedTS int64           `json:"created_ts"`
		Content   json.RawMessage `json:"content"`
	} `json:"messages"`
	NextCursor  *string  `json:"next_cursor"`
	OwedRefetch []string `json:"owed_refetch"`
}

type pendingItem struct {
	Position int64           `json:"position"`
	EventID  string          `json:"event_id"`
	RoomID   string          `json:"room_id"`
	ThreadID *string         `json:"thread_id"`
	Sender   string          `json:"sender"`
	Content  json.RawMessage `json:"content"`
}

type pendingBody struct {
	Events    []pendingItem `json:"events"`
	NextAfter int64         `json:"next_after"`
	TimedOut  bool          `json:"timed_out"`
}

type replyBody struct {
	DeliveryID string `json:"delivery_id"`
	TxnID      string `json:"txn_id"`
	Outcome    string `json:"outcome"`
}

func eventIDs(items []pendingItem) []string {
	var ids []string
	for _, it := range items {
		ids = append(ids, it.EventID)
	}
	return ids
}

func TestHealthzAnswersWithoutAToken(t *testing.T) {
	fx := newFixture(t, nil)
	status, body := fx.do(t, "GET", "/healthz", "", nil)
	if status != http.StatusOK || strings.TrimSpace(string(body)) != `{"status":"ok"}` {
		t.Fatalf("healthz = %d %s", status, body)
	}
}

func TestEveryAgentRouteNeedsTheAgentsOwnToken(t *testing.T) {
	fx := newFixture(t, nil)
	routes := []struct{ method, path string }{
		{"GET", "/v1/agents/alpha/rooms/" + room + "/messages"},
		{"GET", "/v1/agents/alpha/pending"},
		{"GET", "/v1/agents/alpha/pending/stream"},
		{"POST", "/v1/agents/alpha/events/$e1/reply"},
		{"POST", "/v1/agents/alpha/events/$e1/ignore"},
		{"POST", "/v1/agents/alpha/rooms/" + room + "/leave"},
		{"GET", "/v1/agents/alpha/rooms/" + room + "/export"},
	}
	for _, rt := range routes {
		t.Run(rt.method+" "+rt.path, func(t *testing.T) {
			status, body := fx.do(t, rt.method, rt.path, "", nil)
			wantError(t, status, body, http.StatusUnauthorized, "unauthorized")
			status, body = fx.do(t, rt.method, rt.path, "not-a-token", nil)
			wantError(t, status, body, http.StatusUnauthorized, "unauthorized")
			status, body = fx.do(t, rt.method, rt.path, betaToken, nil)
			wantError(t, status, body, http.StatusForbidden, "forbidden")
		})
	}
	if got := len(fx.left); got != 0 {
		t.Fatalf("a refused leave reached the principal")
	}
}

func TestAnUnknownAgentIsNotFound(t *testing.T) {
	fx := newFixture(t, nil)
	status, body := fx.do(t, "GET", "/v1/agents/gamma/pending", alphaToken, nil)
	wantError(t, status, body, http.StatusNotFound, "not_found")
}

func TestAnotherAgentsTokenCannotReadItsConversation(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "for alpha only"))
	status, body := fx.do(t, "GET", "/v1/agents/alpha/rooms/"+room+"/messages", betaToken, nil)
	wantError(t, status, body, http.StatusForbidden, "forbidden")
	if bytes.Contains(body, []byte("for alpha only")) {
		t.Fatalf("refusal leaked the conversation: %s", body)
	}
}

func TestUnknownRoutesAnswerWithAJSONError(t *testing.T) {
	fx := newFixture(t, nil)
	status, body := fx.do(t, "GET", "/v1/nothing", alphaToken, nil)
	wantError(t, status, body, http.StatusNotFound, "not_found")
	status, body = fx.do(t, "GET", "/v1/agents/alpha/events/$e1/reply", alphaToken, nil)
	wantError(t, status, body, http.StatusMethodNotAllowed, "method_not_allowed")
}

func TestMessagesPageBackThroughTheConversation(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "one"), mx.Message("$e2", alice, 1001, "two"),
		mx.Message("$e3", alice, 1002, "three"))
	path := "/v1/agents/alpha/rooms/" + room + "/messages?limit=2"
	status, b := fx.do(t, "GET", path, alphaToken, nil)
	if status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	first := decode[messagesBody](t, b)
	var got []string
	for _, m := range first.Messages {
		got = append(got, m.EventID)
	}
	if want := []string{"$e2", "$e3"}; !slices.Equal(got, want) {
		t.Fatalf("first page = %v, want %v", got, want)
	}
	if m := first.Messages[0]; m.Sender != alice || m.CreatedTS != 1001 || !bytes.Contains(m.Content, []byte(`"two"`)) {
		t.Fatalf("message = %+v", m)
	}
	if first.NextCursor == nil {
		t.Fatalf("first page has no cursor")
	}
	status, b = fx.do(t, "GET", path+"&before="+*first.NextCursor, alphaToken, nil)
	if status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	second := decode[messagesBody](t, b)
	if len(second.Messages) != 1 || second.Messages[0].EventID != "$e1" || second.NextCursor != nil {
		t.Fatalf("second page = %s", b)
	}
	if second.OwedRefetch == nil {
		t.Fatalf("owed_refetch is null, want a list")
	}
}

func TestMessagesRefuseALimitOutsideItsBounds(t *testing.T) {
	fx := newFixture(t, nil)
	for _, limit := range []string{"0", "-1", "1001", "many"} {
		status, body := fx.do(t, "GET", "/v1/agents/alpha/rooms/"+room+"/messages?limit="+limit, alphaToken, nil)
		wantError(t, status, body, http.StatusBadRequest, "bad_request")
	}
}

func TestMessagesRefuseACursorTheyDidNotIssueForThisConversation(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "one"), mx.Message("$e2", alice, 1001, "two"))
	_, b := fx.do(t, "GET", "/v1/agents/alpha/rooms/"+room+"/messages?limit=1", alphaToken, nil)
	cursor := *decode[messagesBody](t, b).NextCursor
	for name, path := range map[string]string{
		"malformed":     "/v1/agents/alpha/rooms/" + room + "/messages?before=not*a*cursor",
		"altered":       "/v1/agents/alpha/rooms/" + room + "/messages?before=" + cursor[:len(cursor)-2] + "AA",
		"another room":  "/v1/agents/alpha/rooms/" + otherRoom + "/messages?before=" + cursor,
		"thread cursor": "/v1/agents/alpha/rooms/" + room + "/messages?thread=$e1&before=" + cursor,
	} {
		t.Run(name, func(t *testing.T) {
			status, body := fx.do(t, "GET", path, alphaToken, nil)
			wantError(t, status, body, http.StatusBadRequest, "bad_request")
		})
	}
}

func TestPendingListsEventsInReceiptOrderWithTheirThreads(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$root", alice, 1000, "root"), mx.ThreadReply("$in", alice, 1001, "$root", "in thread"))
	fx.admit(t, otherRoom, mx.Message("$else", "@bob:example.org", 1002, "elsewhere"))
	status, b := fx.do(t, "GET", "/v1/agents/alpha/pending?limit=2", alphaToken, nil)
	if status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	page := decode[pendingBody](t, b)
	if got, want := eventIDs(page.Events), []string{"$root", "$in"}; !slices.Equal(got, want) {
		t.Fatalf("pending = %v, want %v", got, want)
	}
	in := page.Events[1]
	if in.ThreadID == nil || *in.ThreadID != "$root" || in.RoomID != room || in.Sender != alice ||
		!bytes.Contains(in.Content, []byte(`"in thread"`)) || in.Position <= page.Events[0].Position {
		t.Fatalf("threaded item = %+v", in)
	}
	if page.Events[0].ThreadID != nil {
		t.Fatalf("room item has thread %q", *page.Events[0].ThreadID)
	}
	if page.NextAfter != in.Position || page.TimedOut {
		t.Fatalf("next_after = %d timed_out = %v, want %d false", page.NextAfter, page.TimedOut, in.Position)
	}
	_, b = fx.do(t, "GET", fmt.Sprintf("/v1/agents/alpha/pending?after=%d", page.NextAfter), alphaToken, nil)
	rest := decode[pendingBody](t, b)
	if got, want := eventIDs(rest.Events), []string{"$else"}; !slices.Equal(got, want) || rest.Events[0].Sender != "@bob:example.org" {
		t.Fatalf("next page = %s", b)
	}
}

func TestPendingRefusesABadLimitOrWait(t *testing.T) {
	fx := newFixture(t, nil)
	for _, q := range []string{"limit=0", "limit=1001", "after=-1", "wait=301", "wait=10m", "wait=soon", "wait=NaN"} {
		status, body := fx.do(t, "GET", "/v1/agents/alpha/pending?"+q, alphaToken, nil)
		wantError(t, status, body, http.StatusBadRequest, "bad_request")
	}
}

func TestALongPollWithNothingPendingTimesOutEmpty(t *testing.T) {
	fx := newFixture(t, nil)
	status, b := fx.do(t, "GET", "/v1/agents/alpha/pending?wait=50ms", alphaToken, nil)
	if status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	if got := strings.TrimSpace(string(b)); got != `{"events":[],"next_after":0,"timed_out":true}` {
		t.Fatalf("timeout body = %s", got)
	}
}

func TestALongPollIsAnsweredByTheAdmissionItWaitedFor(t *testing.T) {
	fx := newFixture(t, nil)
	type result struct {
		status int
		body   []byte
	}
	done := make(chan result, 1)
	go func() {
		// Errors are reported through the result: t.Fatal may not run here.
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", fx.srv.URL+"/v1/agents/alpha/pending?wait=300", nil)
		req.Header.Set("Authorization", "Bearer "+alphaToken)
		resp, err := fx.srv.Client().Do(req)
		if err != nil {
			done <- result{body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- result{resp.StatusCode, b}
	}()
	// The poll has read an empty backlog and is waiting.
	<-fx.empty
	fx.admit(t, room, mx.Message("$late", alice, 1000, "late"))
	res := <-done
	if res.status != http.StatusOK {
		t.Fatalf("status = %d: %s", res.status, res.body)
	}
	page := decode[pendingBody](t, res.body)
	if got, want := eventIDs(page.Events), []string{"$late"}; !slices.Equal(got, want) || page.TimedOut {
		t.Fatalf("woken poll = %s", res.body)
	}
}

func replyJSON(body string) io.Reader {
	b, _ := json.Marshal(map[string]any{"body": body})
	return bytes.NewReader(b)
}

func TestAReplyIsEnqueuedAsAReplyAndSettlesTheEvent(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "question"), mx.Message("$e2", alice, 1001, "another"))
	status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/reply", alphaToken, replyJSON("answer"))
	if status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	got := decode[replyBody](t, b)
	want := replyBody{DeliveryID: "reply:$e1", TxnID: journal.TxnID(fx.alpha.Principal(), "reply:$e1", journal.StageFinal),
		Outcome: "created"}
	if got != want {
		t.Fatalf("reply = %+v, want %+v", got, want)
	}
	d, err := fx.alpha.Delivery(context.Background(), "reply:$e1", journal.StageFinal)
	if err != nil {
		t.Fatalf("delivery: %v", err)
	}
	c := decode[map[string]any](t, d.Content)
	rel, _ := c["m.relates_to"].(map[string]any)
	irt, _ := rel["m.in_reply_to"].(map[string]any)
	if c["body"] != "answer" || c["msgtype"] != "m.text" || irt["event_id"] != "$e1" || d.RoomID != room {
		t.Fatalf("delivery content = %s in %s", d.Content, d.RoomID)
	}
	if got, want := fx.pendingIDs(t), []string{"$e2"}; !slices.Equal(got, want) {
		t.Fatalf("pending = %v, want %v", got, want)
	}
	rec, ok, err := fx.alpha.TurnForEvent(context.Background(), "$e1")
	if err != nil || !ok || rec.TurnID != "reply:$e1" {
		t.Fatalf("turn record = %+v %v %v", rec, ok, err)
	}
}

func TestAReplyToAThreadedEventGoesToItsThread(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$root", alice, 1000, "root"), mx.ThreadReply("$in", alice, 1001, "$root", "q"))
	status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$in/reply", alphaToken, replyJSON("a"))
	if status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	d, err := fx.alpha.Delivery(context.Background(), "reply:$in", journal.StageFinal)
	if err != nil {
		t.Fatalf("delivery: %v", err)
	}
	rel, _ := decode[map[string]any](t, d.Content)["m.relates_to"].(map[string]any)
	if rel["rel_type"] != "m.thread" || rel["event_id"] != "$root" || d.Thread == nil || *d.Thread != "$root" {
		t.Fatalf("threaded reply = %s thread %v", d.Content, d.Thread)
	}
}

func TestPostingTheSameReplyAgainReturnsTheSameDeliveryAndSendsNothingNew(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "question"))
	_, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/reply", alphaToken, replyJSON("answer"))
	first := decode[replyBody](t, b)
	status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/reply", alphaToken, replyJSON("answer"))
	if status != http.StatusOK {
		t.Fatalf("replay status = %d: %s", status, b)
	}
	again := decode[replyBody](t, b)
	if again.DeliveryID != first.DeliveryID || again.TxnID != first.TxnID || again.Outcome != "replayed" {
		t.Fatalf("replay = %+v, first = %+v", again, first)
	}
	rows, err := fx.alpha.Unacknowledged(context.Background(), 10, nil)
	if err != nil {
		t.Fatalf("outbox: %v", err)
	}
	if len(rows) != 1 || rows[0].TxnID != first.TxnID {
		t.Fatalf("outbox holds %d rows, want the one reply", len(rows))
	}
}

func TestADifferentReplyToAnAnsweredEventConflicts(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "question"))
	fx.do(t, "POST", "/v1/agents/alpha/events/$e1/reply", alphaToken, replyJSON("answer"))
	status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/reply", alphaToken, replyJSON("another answer"))
	wantError(t, status, b, http.StatusConflict, "conflict")
	d, err := fx.alpha.Delivery(context.Background(), "reply:$e1", journal.StageFinal)
	if err != nil || !bytes.Contains(d.Content, []byte(`"answer"`)) {
		t.Fatalf("the first answer was changed: %s %v", d.Content, err)
	}
}

func TestAReplyToAnEventNeverAdmittedIsNotFound(t *testing.T) {
	fx := newFixture(t, nil)
	status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$nope/reply", alphaToken, replyJSON("answer"))
	wantError(t, status, b, http.StatusNotFound, "not_found")
	b2, _ := json.Marshal(map[string]any{"body": "answer", "room_id": room})
	status, b = fx.do(t, "POST", "/v1/agents/alpha/events/$nope/reply", alphaToken, bytes.NewReader(b2))
	wantError(t, status, b, http.StatusNotFound, "not_found")
}

func TestAReplyToAnEventSettledWithoutAReplyConflicts(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "question"))
	if status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/ignore", alphaToken, nil); status != http.StatusOK {
		t.Fatalf("ignore = %d: %s", status, b)
	}
	// With or without its room: the event is found by its ID alone.
	for _, req := range []map[string]any{{"body": "late answer", "room_id": room}, {"body": "late answer"}} {
		body, _ := json.Marshal(req)
		status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/reply", alphaToken, bytes.NewReader(body))
		wantError(t, status, b, http.StatusConflict, "conflict")
	}
	body, _ := json.Marshal(map[string]any{"body": "late answer", "room_id": "!elsewhere:example.org"})
	status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/reply", alphaToken, bytes.NewReader(body))
	wantError(t, status, b, http.StatusNotFound, "not_found")
	if _, err := fx.alpha.Delivery(context.Background(), "reply:$e1", journal.StageFinal); !errors.Is(err, journal.ErrNoDelivery) {
		t.Fatalf("a reply was enqueued for a settled event: %v", err)
	}
}

func TestAReplyLargerThan64KiBIsRefused(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "question"))
	status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/reply", alphaToken,
		replyJSON(strings.Repeat("x", api.MaxReplyBytes)))
	wantError(t, status, b, http.StatusRequestEntityTooLarge, "payload_too_large")
	if got, want := fx.pendingIDs(t), []string{"$e1"}; !slices.Equal(got, want) {
		t.Fatalf("pending = %v, want %v", got, want)
	}
}

func TestAMalformedReplyIsRefused(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "question"))
	for _, body := range []string{`{"body":`, `[]`, `{"body":""}`, `{"body":"a","format":"html"}`,
		`{"body":"a","colour":"red"}`, `{"body":"a"} {"body":"b"}`, `{"body":"a","room_id":"nope"}`} {
		status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/reply", alphaToken, strings.NewReader(body))
		wantError(t, status, b, http.StatusBadRequest, "bad_request")
	}
	if got, want := fx.pendingIDs(t), []string{"$e1"}; !slices.Equal(got, want) {
		t.Fatalf("pending = %v, want %v", got, want)
	}
}

func TestAPlaceholderIsSentBeforeTheAnswerAndLeavesTheEventPending(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "question"))
	status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/reply", alphaToken,
		strings.NewReader(`{"body":"thinking…","placeholder":true}`))
	if status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	if got := decode[replyBody](t, b).TxnID; got != journal.TxnID(fx.alpha.Principal(), "reply:$e1", journal.StageInitial) {
		t.Fatalf("placeholder txn = %s", got)
	}
	if got, want := fx.pendingIDs(t), []string{"$e1"}; !slices.Equal(got, want) {
		t.Fatalf("pending = %v, want %v", got, want)
	}
	if status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/reply", alphaToken, replyJSON("done")); status != http.StatusOK {
		t.Fatalf("final = %d: %s", status, b)
	}
	if got := fx.pendingIDs(t); len(got) != 0 {
		t.Fatalf("pending = %v, want none", got)
	}
}

func TestIgnoreSettlesAPendingEventOnce(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "noise"))
	if status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/ignore", alphaToken, nil); status != http.StatusOK {
		t.Fatalf("ignore = %d: %s", status, b)
	}
	if got := fx.pendingIDs(t); len(got) != 0 {
		t.Fatalf("pending = %v, want none", got)
	}
	status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$e1/ignore", alphaToken, nil)
	wantError(t, status, b, http.StatusNotFound, "not_found")
	status, b = fx.do(t, "POST", "/v1/agents/alpha/events/$never/ignore", alphaToken, nil)
	wantError(t, status, b, http.StatusNotFound, "not_found")
}

func TestLeaveAsksThePrincipalToLeaveTheRoom(t *testing.T) {
	fx := newFixture(t, nil)
	status, b := fx.do(t, "POST", "/v1/agents/alpha/rooms/"+room+"/leave", alphaToken, nil)
	if status != http.StatusOK {
		t.Fatalf("leave = %d: %s", status, b)
	}
	if got := <-fx.left; got != room {
		t.Fatalf("left %q, want %q", got, room)
	}
	status, b = fx.do(t, "POST", "/v1/agents/alpha/rooms/not-a-room/leave", alphaToken, nil)
	wantError(t, status, b, http.StatusBadRequest, "bad_request")
	status, b = fx.do(t, "POST", "/v1/agents/beta/rooms/"+room+"/leave", betaToken, nil)
	wantError(t, status, b, http.StatusNotImplemented, "not_implemented")
}

// sseEvent is one server-sent event; comment lines are kept apart.
type sseEvent struct {
	id, event, data string
	comment         bool
}

func readSSE(t *testing.T, r *bufio.Reader) sseEvent {
	t.Helper()
	var ev sseEvent
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read stream: %v", err)
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			return ev
		case strings.HasPrefix(line, ":"):
			ev.comment = true
		case strings.HasPrefix(line, "id: "):
			ev.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			ev.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.data = strings.TrimPrefix(line, "data: ")
		}
	}
}

func TestTheStreamResumesAfterLastEventIDAndCarriesNewWork(t *testing.T) {
	fx := newFixture(t, func(d *api.Deps) { d.Heartbeat = time.Hour })
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "one"), mx.Message("$e2", alice, 1001, "two"),
		mx.Message("$e3", alice, 1002, "three"))
	_, b := fx.do(t, "GET", "/v1/agents/alpha/pending?limit=1", alphaToken, nil)
	seen := decode[pendingBody](t, b).Events[0]

	resp := fx.send(t, "GET", "/v1/agents/alpha/pending/stream", alphaToken, nil,
		http.Header{"Last-Event-Id": {fmt.Sprint(seen.Position)}})
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r := bufio.NewReader(resp.Body)
	var got []string
	for range 2 {
		ev := readSSE(t, r)
		item := decode[pendingItem](t, []byte(ev.data))
		if ev.id != fmt.Sprint(item.Position) {
			t.Fatalf("event id %s, item position %d", ev.id, item.Position)
		}
		got = append(got, item.EventID)
	}
	if want := []string{"$e2", "$e3"}; !slices.Equal(got, want) {
		t.Fatalf("resumed stream = %v, want %v", got, want)
	}
	fx.admit(t, room, mx.Message("$e4", alice, 1003, "four"))
	if item := decode[pendingItem](t, []byte(readSSE(t, r).data)); item.EventID != "$e4" || item.Sender != alice {
		t.Fatalf("new work = %+v", item)
	}
}

func TestTheStreamRefusesAMalformedLastEventID(t *testing.T) {
	fx := newFixture(t, nil)
	resp := fx.send(t, "GET", "/v1/agents/alpha/pending/stream", alphaToken, nil, http.Header{"Last-Event-Id": {"yesterday"}})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantError(t, resp.StatusCode, b, http.StatusBadRequest, "bad_request")
}

func TestAnIdleStreamSendsHeartbeats(t *testing.T) {
	fx := newFixture(t, func(d *api.Deps) { d.Heartbeat = 10 * time.Millisecond })
	resp := fx.send(t, "GET", "/v1/agents/alpha/pending/stream", alphaToken, nil, nil)
	defer resp.Body.Close()
	if ev := readSSE(t, bufio.NewReader(resp.Body)); !ev.comment || ev.data != "" {
		t.Fatalf("first frame of an idle stream = %+v, want a comment", ev)
	}
}

func TestStreamsPastTheCapAreToldToRetry(t *testing.T) {
	fx := newFixture(t, func(d *api.Deps) { d.MaxStreams = 1; d.Heartbeat = time.Hour })
	open := fx.send(t, "GET", "/v1/agents/alpha/pending/stream", alphaToken, nil, nil)
	defer open.Body.Close()
	if open.StatusCode != http.StatusOK {
		t.Fatalf("first stream = %d", open.StatusCode)
	}
	resp := fx.send(t, "GET", "/v1/agents/alpha/pending/stream", alphaToken, nil, nil)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantError(t, resp.StatusCode, b, http.StatusServiceUnavailable, "unavailable")
	if resp.Header.Get("Retry-After") == "" {
		t.Fatalf("refusal has no Retry-After")
	}
}

func TestExportWritesTheWholeConversationOldestFirst(t *testing.T) {
	fx := newFixture(t, func(d *api.Deps) { d.ExportPage = 2 })
	var evs []mx.Ev
	var want []string
	for i := range 7 {
		id := fmt.Sprintf("$e%d", i)
		evs = append(evs, mx.Message(id, alice, int64(1000+i), fmt.Sprintf("message %d", i)))
		want = append(want, id)
	}
	fx.admit(t, room, evs...)
	status, b := fx.do(t, "GET", "/v1/agents/alpha/rooms/"+room+"/export", alphaToken, nil)
	if status != http.StatusOK {
		t.Fatalf("export = %d: %s", status, b)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		got = append(got, decode[struct {
			EventID string `json:"event_id"`
		}](t, []byte(line)).EventID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("export order = %v, want %v", got, want)
	}

	status, b = fx.do(t, "GET", "/v1/agents/alpha/rooms/"+room+"/export?format=markdown", alphaToken, nil)
	if status != http.StatusOK {
		t.Fatalf("markdown export = %d: %s", status, b)
	}
	md := string(b)
	last := -1
	for i := range 7 {
		at := strings.Index(md, fmt.Sprintf("message %d\n", i))
		if at <= last {
			t.Fatalf("message %d out of order in markdown:\n%s", i, md)
		}
		last = at
	}
	status, b = fx.do(t, "GET", "/v1/agents/alpha/rooms/"+room+"/export?format=pdf", alphaToken, nil)
	wantError(t, status, b, http.StatusBadRequest, "bad_request")
}

func TestConcurrentDifferentRepliesTakeExactlyOne(t *testing.T) {
	fx := newFixture(t, nil)
	fx.admit(t, room, mx.Message("$e1", alice, 1000, "question"))
	const n = 8
	statuses := make(chan int, n)
	start := make(chan struct{})
	for i := range n {
		go func() {
			<-start
			body, _ := json.Marshal(map[string]any{"body": fmt.Sprintf("answer %d", i)})
			req, _ := http.NewRequest("POST", fx.srv.URL+"/v1/agents/alpha/events/$e1/reply", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+alphaToken)
			resp, err := fx.srv.Client().Do(req)
			if err != nil {
				statuses <- 0
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	close(start)
	counts := map[int]int{}
	for range n {
		counts[<-statuses]++
	}
	if counts[http.StatusOK] != 1 || counts[http.StatusConflict] != n-1 {
		t.Fatalf("statuses = %v, want one 200 and %d 409", counts, n-1)
	}
	rec, ok, err := fx.alpha.TurnForEvent(context.Background(), "$e1")
	d, derr := fx.alpha.Delivery(context.Background(), "reply:$e1", journal.StageFinal)
	if err != nil || derr != nil || !ok {
		t.Fatalf("turn %v %v, delivery %v", ok, err, derr)
	}
	if got, want := decode[map[string]any](t, d.Content)["body"], decode[map[string]any](t, rec.Record)["body"]; got != want {
		t.Fatalf("queued answer %v, recorded answer %v", got, want)
	}
}

// failingReader is a conversation reader whose strict reads fail closed.
type failingReader struct{ journal.ConversationReader }

func (f failingReader) Read(ctx context.Context, req journal.ReadRequest) (journal.Page, error) {
	if req.Strict {
		return journal.Page{}, fmt.Errorf("%w: refetch $m: the homeserver is down", journal.ErrStrictRead)
	}
	return f.ConversationReader.Read(ctx, req)
}

func TestAStrictReadThatCannotCompleteIsRefusedWithItsReasonAndAPlainReadStillServes(t *testing.T) {
	fx := newFixture(t, func(d *api.Deps) {
		a := d.Agents["alpha"]
		a.Conversation = failingReader{a.Store}
		d.Agents["alpha"] = a
	})
	fx.admit(t, "!r:example.org", mx.Message("$m", "@u:example.org", 1000, "hi"))
	status, body := fx.do(t, http.MethodGet, "/v1/agents/alpha/rooms/!r:example.org/messages?strict=true", alphaToken, nil)
	if status != http.StatusServiceUnavailable || !strings.Contains(string(body), `"strict_read_failed"`) || !strings.Contains(string(body), "homeserver is down") {
		t.Fatalf("strict read: %d %s, want 503 strict_read_failed with the reason", status, body)
	}
	status, body = fx.do(t, http.MethodGet, "/v1/agents/alpha/rooms/!r:example.org/messages", alphaToken, nil)
	if status != http.StatusOK || !strings.Contains(string(body), `"$m"`) {
		t.Fatalf("plain read: %d %s", status, body)
	}
}
