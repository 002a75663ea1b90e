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
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// The fuzz targets drive the real handler, on a real journal, with fuzzed
// bodies, path values, query strings and headers. Every answer must be a
// 2xx or a 4xx carrying the API's JSON error (a client's input is never the
// server's fault), and a refused request must leave the journal as it was.
// One journal serves every input of a process; an input that needs an
// event to answer admits one of its own.

const fuzzRoom = "!fuzz:example.org"

// fuzzErrorCodes is the error code each 4xx status must carry.
var fuzzErrorCodes = map[int]string{
	http.StatusBadRequest:            "bad_request",
	http.StatusUnauthorized:          "unauthorized",
	http.StatusForbidden:             "forbidden",
	http.StatusNotFound:              "not_found",
	http.StatusMethodNotAllowed:      "method_not_allowed",
	http.StatusConflict:              "conflict",
	http.StatusRequestEntityTooLarge: "payload_too_large",
}

// fuzzAPI is the API of one agent, alpha, over a real journal.
type fuzzAPI struct {
	alpha   journal.PrincipalStore
	handler http.Handler
	// empty receives a signal each time the API reads an empty pending
	// backlog: a long-poll or a stream has caught up and now waits.
	empty chan struct{}
	left  chan string
	// n numbers the inputs of this process, so each admits fresh events.
	n  int
	hs *fakeHomeserver
}

func newFuzzAPI(tb testing.TB) *fuzzAPI {
	tb.Helper()
	st, _ := testsupport.MustOpen(tb)
	alpha, err := st.Principal(context.Background(), "alpha", "@alpha:example.org")
	if err != nil {
		tb.Fatalf("principal: %v", err)
	}
	fx := &fuzzAPI{alpha: alpha, empty: make(chan struct{}, 1), left: make(chan string, 1), hs: newFakeHomeserver()}
	fx.handler = api.New(api.Deps{
		Agents: map[string]api.Agent{
			"alpha": {Store: &readSignal{PrincipalStore: alpha, empty: fx.empty}, Token: alphaToken, Hints: st.Hints(),
				Leave:      func(_ context.Context, roomID string) error { fx.left <- roomID; return nil },
				Homeserver: fx.hs},
		},
		Log:       zerolog.Nop(),
		CursorKey: []byte("fuzz cursor key"),
		Heartbeat: time.Hour,
	})
	return fx
}

// admit admits events into fuzzRoom, every one of them new.
func (fx *fuzzAPI) admit(tb testing.TB, evs ...mx.Ev) {
	tb.Helper()
	res, err := fx.alpha.AdmitBatch(context.Background(), mx.Live(fuzzRoom, evs...), "")
	if err != nil {
		tb.Fatalf("admit: %v", err)
	}
	for _, r := range res {
		if r.Outcome != journal.Admitted {
			tb.Fatalf("admit %s: %s %v", r.EventID, r.Outcome, r.Err)
		}
	}
}

// fuzzRequest builds a request of alpha's to path, whose values the caller
// escaped.
func fuzzRequest(ctx context.Context, tb testing.TB, method, path string, body []byte) *http.Request {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, method, "http://mindroomd.test"+path, bytes.NewReader(body))
	if err != nil {
		tb.Fatalf("request %s: %v", path, err)
	}
	req.Header.Set("Authorization", "Bearer "+alphaToken)
	return req
}

// serve answers one request that is expected to end by itself.
func (fx *fuzzAPI) serve(tb testing.TB, method, path string, body []byte) *httptest.ResponseRecorder {
	tb.Helper()
	rec := httptest.NewRecorder()
	fx.handler.ServeHTTP(rec, fuzzRequest(context.Background(), tb, method, path, body))
	return rec
}

// routable reports whether a path value reaches its route's handler. An
// empty, "." or ".." segment is cleaned away, and the router takes a
// segment that unescapes to "/" for a trailing slash: those paths are no
// route.
func routable(v string) bool { return v != "" && v != "." && v != ".." && v != "/" }

// checkAnswer asserts the status is a 2xx or a 4xx, that a 4xx is the JSON
// error of its status and that a JSON 2xx carries no error.
func checkAnswer(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	status, body := rec.Code, rec.Body.Bytes()
	switch {
	case status >= 200 && status < 300:
		if rec.Header().Get("Content-Type") != "application/json" {
			return
		}
		var v map[string]json.RawMessage
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatalf("%d answer %q is not a JSON object: %v", status, body, err)
		}
		if _, ok := v["error"]; ok {
			t.Fatalf("%d answer carries an error: %s", status, body)
		}
	case status >= 400 && status < 500:
		if got := rec.Header().Get("Content-Type"); got != "application/json" {
			t.Fatalf("%d answer has content type %q: %s", status, got, body)
		}
		var e apiError
		if err := json.Unmarshal(body, &e); err != nil {
			t.Fatalf("%d answer %q is not the JSON error: %v", status, body, err)
		}
		if want, ok := fuzzErrorCodes[status]; !ok || e.Error.Code != want || e.Error.Message == "" {
			t.Fatalf("%d answer %s, want the code %q and a message", status, body, want)
		}
	default:
		t.Fatalf("status %d for a client's input: %s", status, body)
	}
}

func wantStatus(t *testing.T, rec *httptest.ResponseRecorder, want int) {
	t.Helper()
	if rec.Code != want {
		t.Fatalf("status = %d, want %d: %s", rec.Code, want, rec.Body.Bytes())
	}
}

// eventState is everything a reply or an ignore may change about one event.
type eventState struct {
	Seen, Pending, Answered bool
	Room, Thread, Record    string
	Initial, Final          string
	Err                     string
}

// state reads what the journal holds about eventID.
func (fx *fuzzAPI) state(t *testing.T, eventID string) eventState {
	t.Helper()
	ctx := context.Background()
	var s eventState
	e, seen, err := fx.alpha.AdmittedEvent(ctx, eventID)
	if err != nil {
		s.Err = err.Error()
	}
	s.Seen, s.Pending, s.Room = seen, e.Pending, e.RoomID
	if e.Thread != nil {
		s.Thread = *e.Thread
	}
	rec, answered, err := fx.alpha.TurnForEvent(ctx, eventID)
	if err != nil {
		s.Err += "; " + err.Error()
	}
	s.Answered, s.Record = answered, fmt.Sprintf("%+v", rec)
	show := func(stage journal.Stage) string {
		d, err := fx.alpha.Delivery(ctx, journal.ReplyDeliveryID(eventID), stage)
		if errors.Is(err, journal.ErrNoDelivery) {
			return ""
		}
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("%s %s %s", d.State, d.TxnID, d.Content)
	}
	s.Initial, s.Final = show(journal.StageInitial), show(journal.StageFinal)
	return s
}

// The states a fuzzed reply or ignore is aimed at; the last aims at the
// fuzzed ID itself.
const (
	aimPending = iota
	aimThreaded
	aimAnswered
	aimSettled
	aimPlaceholder
	aimRawID
	aims
)

// aim admits a fresh event and brings it to the state which names,
// returning its ID; aimRawID returns raw instead.
func (fx *fuzzAPI) aim(t *testing.T, which uint8, raw string) string {
	t.Helper()
	fx.n++
	id := fmt.Sprintf("$fz.%d.q", fx.n)
	q := mx.Message(id, alice, int64(1000+fx.n), "question")
	switch which % aims {
	case aimPending:
		fx.admit(t, q)
	case aimThreaded:
		root := fmt.Sprintf("$fz.%d.root", fx.n)
		fx.admit(t, mx.Message(root, alice, int64(1000+fx.n), "root"), mx.ThreadReply(id, alice, int64(1000+fx.n), root, "question"))
	case aimAnswered:
		fx.admit(t, q)
		wantStatus(t, fx.serve(t, "POST", "/v1/agents/alpha/events/"+url.PathEscape(id)+"/reply", []byte(`{"body":"answer"}`)), http.StatusOK)
	case aimSettled:
		fx.admit(t, q)
		if _, err := fx.alpha.Settle(context.Background(), id); err != nil {
			t.Fatalf("settle: %v", err)
		}
	case aimPlaceholder:
		fx.admit(t, q)
		wantStatus(t, fx.serve(t, "POST", "/v1/agents/alpha/events/"+url.PathEscape(id)+"/reply",
			[]byte(`{"body":"thinking…","placeholder":true}`)), http.StatusOK)
	default:
		return raw
	}
	return id
}

// replySeeds are reply bodies: good ones of every option, then bad ones of
// every kind, then ones at and past the 64 KiB cap.
func replySeeds() [][]byte {
	seeds := []string{
		`{"body":"answer"}`,
		`{"body":"**bold**","format":"markdown"}`,
		`{"body":"plain","format":"plain","room_id":"` + fuzzRoom + `"}`,
		`{"body":"thinking…","placeholder":true}`,
		`{"body":"done","placeholder":false}`,
		`{"BODY":"keys match without case"}`,
		`{"body":"a","body":"b"}`,
		`{"body":" padded answer\n"}`,
		`{"body":"` + "\xff\xfe" + ` not UTF-8"}`,
		`{"body":"\ud800 a lone surrogate"}`,
		`  {"body":"spaced"}  ` + "\n",
		`{"body":"a","room_id":"!elsewhere:example.org"}`,
		``,
		`{"body":`,
		`[]`,
		`null`,
		`"answer"`,
		`{}`,
		`{"body":""}`,
		`{"body":7}`,
		`{"body":null}`,
		`{"body":"a","format":"html"}`,
		`{"body":"a","colour":"red"}`,
		`{"body":"a"} {"body":"b"}`,
		`{"body":"a"}x`,
		`{"body":"a","room_id":"nope"}`,
		`{"body":"a","room_id":7}`,
		`{"body":"a","placeholder":"yes"}`,
		strings.Repeat("[", 10000),
		`{"body":"` + strings.Repeat("<", 20000) + `"}`,
	}
	out := make([][]byte, 0, len(seeds)+3)
	for _, s := range seeds {
		out = append(out, []byte(s))
	}
	fill := func(n int) string { return strings.Repeat("x", n-len(`{"body":""}`)) }
	return append(out,
		[]byte(`{"body":"`+fill(api.MaxReplyBytes)+`"}`),
		[]byte(`{"body":"`+fill(api.MaxReplyBytes+1)+`"}`),
		// The object closes early; the padding after it passes the cap.
		append([]byte(`{"body":"a"}`), bytes.Repeat([]byte(" "), api.MaxReplyBytes)...),
	)
}

// FuzzReply posts a fuzzed body, aimed at an event in a chosen state or at
// a fuzzed event ID. An accepted reply is enqueued with the body asked for;
// a refused one changes nothing.
func FuzzReply(f *testing.F) {
	// Every body at a pending event, and at one other state in turn.
	for i, body := range replySeeds() {
		f.Add(uint8(aimPending), "", body)
		f.Add(uint8(1+i%(aims-2)), "", body)
	}
	for _, id := range []string{"$never", "not-an-event", "$", "$a b", "$é", "$a/b", "$a%2Fb", "$a?b=c", ".", "..", "", "/", "$/",
		"$" + strings.Repeat("x", 254), "$" + strings.Repeat("x", 255)} {
		f.Add(uint8(aimRawID), id, []byte(`{"body":"answer"}`))
	}
	fx := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, which uint8, raw string, body []byte) {
		id := fx.aim(t, which, raw)
		before := fx.state(t, id)
		rec := fx.serve(t, "POST", "/v1/agents/alpha/events/"+url.PathEscape(id)+"/reply", body)
		checkAnswer(t, rec)
		after := fx.state(t, id)
		switch {
		case !routable(id):
			wantStatus(t, rec, http.StatusNotFound)
		case !journal.ValidEventID(id):
			wantStatus(t, rec, http.StatusBadRequest)
		case rec.Code == http.StatusRequestEntityTooLarge && len(body) <= api.MaxReplyBytes:
			t.Fatalf("a body of %d bytes refused as too large", len(body))
		}
		if rec.Code >= 400 {
			if after != before {
				t.Fatalf("refused with %d (%s), yet the event changed:\n%+v\nto\n%+v", rec.Code, rec.Body.Bytes(), before, after)
			}
			return
		}
		checkReplied(t, fx, id, body, rec, before, after)
	})
}

// checkReplied asserts that an accepted reply is the delivery its body
// asked for, and settles the event unless it is a placeholder.
func checkReplied(t *testing.T, fx *fuzzAPI, id string, body []byte, rec *httptest.ResponseRecorder, before, after eventState) {
	t.Helper()
	wantStatus(t, rec, http.StatusOK)
	if len(body) > api.MaxReplyBytes {
		t.Fatalf("a body of %d bytes accepted", len(body))
	}
	var req struct {
		Body        string `json:"body"`
		Placeholder bool   `json:"placeholder"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatalf("accepted body %q does not decode: %v", body, err)
	}
	resp := decode[replyBody](t, rec.Body.Bytes())
	if resp.DeliveryID != journal.ReplyDeliveryID(id) || !slices.Contains([]string{"created", "updated", "frozen", "replayed"}, resp.Outcome) {
		t.Fatalf("reply answer %+v", resp)
	}
	stage := journal.StageFinal
	if req.Placeholder {
		stage = journal.StageInitial
	}
	d, err := fx.alpha.Delivery(context.Background(), resp.DeliveryID, stage)
	if err != nil {
		t.Fatalf("accepted reply %+v has no delivery: %v", resp, err)
	}
	var content struct {
		Body string `json:"body"`
	}
	if err := json.Unmarshal(d.Content, &content); err != nil || content.Body != req.Body || d.TxnID != resp.TxnID {
		t.Fatalf("delivery %s (txn %s) for the reply %q (txn %s)", d.Content, d.TxnID, req.Body, resp.TxnID)
	}
	switch {
	case resp.Outcome == "replayed" && after != before:
		t.Fatalf("a replayed reply changed the event:\n%+v\nto\n%+v", before, after)
	case req.Placeholder && !after.Pending:
		t.Fatalf("a placeholder settled the event: %+v", after)
	case !req.Placeholder && (after.Pending || !after.Answered):
		t.Fatalf("an answer left the event unsettled: %+v", after)
	}
}

// FuzzIgnore posts to ignore, aimed like FuzzReply, with a fuzzed body the
// route never reads. Exactly a pending event is settled; anything else is
// refused and changes nothing.
func FuzzIgnore(f *testing.F) {
	for i, body := range [][]byte{nil, []byte(`{}`), []byte(`{"reason":"noise"}`), []byte(`not JSON`),
		bytes.Repeat([]byte("x"), api.MaxReplyBytes+1)} {
		for which := range uint8(aims - 1) {
			f.Add(which, "", body)
		}
		f.Add(uint8(aimRawID), []string{"$never", "not-an-event", "..", "$a/b", "$a b"}[i], body)
	}
	fx := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, which uint8, raw string, body []byte) {
		id := fx.aim(t, which, raw)
		before := fx.state(t, id)
		rec := fx.serve(t, "POST", "/v1/agents/alpha/events/"+url.PathEscape(id)+"/ignore", body)
		checkAnswer(t, rec)
		after := fx.state(t, id)
		switch {
		case !routable(id):
			wantStatus(t, rec, http.StatusNotFound)
		case !journal.ValidEventID(id):
			wantStatus(t, rec, http.StatusBadRequest)
		case before.Pending:
			wantStatus(t, rec, http.StatusOK)
			if got := decode[map[string]any](t, rec.Body.Bytes()); got["event_id"] != id || got["settled"] != true {
				t.Fatalf("ignore answer %v", got)
			}
			if after.Pending || after.Final != before.Final {
				t.Fatalf("ignore left %+v, from %+v", after, before)
			}
			if before.Initial != "" && !strings.HasPrefix(after.Initial, journal.DeliveryRetired.String()+" ") {
				t.Fatalf("ignore left the queued placeholder %q", after.Initial)
			}
			return
		default:
			wantStatus(t, rec, http.StatusNotFound)
		}
		if after != before {
			t.Fatalf("refused with %d, yet the event changed:\n%+v\nto\n%+v", rec.Code, before, after)
		}
	})
}

// FuzzLeave posts to leave a fuzzed room with a fuzzed body the route never
// reads: the principal is asked to leave exactly a valid room ID, and
// nothing else reaches it.
func FuzzLeave(f *testing.F) {
	for _, room := range []string{fuzzRoom, "!r", "!a/b:example.org", "!a%2Fb", "!a b", "!é:example.org", "room", "@alice:example.org",
		"", ".", "..", "/", "!/..", "!", "!" + strings.Repeat("x", 254), "!" + strings.Repeat("x", 255)} {
		f.Add(room, []byte(nil))
	}
	f.Add(fuzzRoom, []byte(`{"reason":"bye"}`))
	f.Add(fuzzRoom, bytes.Repeat([]byte("x"), api.MaxReplyBytes+1))
	fx := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, room string, body []byte) {
		rec := fx.serve(t, "POST", "/v1/agents/alpha/rooms/"+url.PathEscape(room)+"/leave", body)
		checkAnswer(t, rec)
		var left []string
		select {
		case r := <-fx.left:
			left = append(left, r)
		default:
		}
		switch {
		case !routable(room):
			wantStatus(t, rec, http.StatusNotFound)
		case !journal.ValidRoomID(room):
			wantStatus(t, rec, http.StatusBadRequest)
		default:
			wantStatus(t, rec, http.StatusOK)
			if !slices.Equal(left, []string{room}) {
				t.Fatalf("left %q, want %q", left, room)
			}
			return
		}
		if len(left) != 0 {
			t.Fatalf("a refused leave reached the principal: %q", left)
		}
	})
}

// The conversation of admitConversation: a room with a thread, every event
// still pending.
const (
	convRoot   = "$conv.root"
	convEvents = 6
)

// admitConversation admits the conversation the read targets page through.
func (fx *fuzzAPI) admitConversation(tb testing.TB) {
	tb.Helper()
	fx.admit(tb,
		mx.Message(convRoot, alice, 1000, "root"),
		mx.Message("$conv.2", alice, 1001, "two"),
		mx.ThreadReply("$conv.3", alice, 1002, convRoot, "in the thread"),
		mx.Message("$conv.4", "@bob:example.org", 1003, "**four**"),
		mx.ThreadReply("$conv.5", "@bob:example.org", 1004, convRoot, "in the thread too"),
		mx.Image("$conv.6", alice, 1005),
	)
}

// position is one pending event where the API shows it.
type position struct {
	Position int64
	EventID  string
}

// pendingAfter lists the pending events after position after, as the
// journal holds them.
func (fx *fuzzAPI) pendingAfter(tb testing.TB, after int64) []position {
	tb.Helper()
	page, err := fx.alpha.Pending(context.Background(), api.MaxLimit, after)
	if err != nil {
		tb.Fatalf("pending: %v", err)
	}
	var items []position
	for _, e := range page.Events {
		items = append(items, position{e.Seq, e.EventID})
	}
	return items
}

// drain forgets a stale empty-backlog signal, so the next one is the next
// request's.
func (fx *fuzzAPI) drain() {
	select {
	case <-fx.empty:
	default:
	}
}

// run serves a request that may wait: once the API has read an empty
// backlog (a long-poll or a stream caught up), the request is cancelled.
// It reports whether it was.
func (fx *fuzzAPI) run(t *testing.T, path, rawQuery string, header http.Header) (*httptest.ResponseRecorder, bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := fuzzRequest(ctx, t, "GET", path, nil)
	req.URL.RawQuery = rawQuery
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	fx.drain()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fx.handler.ServeHTTP(rec, req)
	}()
	select {
	case <-done:
		return rec, false
	case <-fx.empty:
		cancel()
		<-done
		return rec, true
	}
}

// readSeeds are query strings of the read routes: good ones of every
// parameter, then bad ones of every kind.
func readSeeds() []string {
	return []string{
		"",
		"limit=1", "limit=1000", "limit=50&strict=false", "strict=true", "strict=1", "thread=" + url.QueryEscape(convRoot),
		"thread=" + url.QueryEscape(convRoot) + "&limit=1", "format=jsonl", "format=markdown", "after=2", "after=0&limit=2",
		"wait=0", "wait=0s", "wait=1ms", "wait=0.001", "wait=300", "wait=5m", "after=999999&wait=1ns", "after=6&wait=300",
		"limit=0", "limit=-1", "limit=1001", "limit=many", "limit=1e3", "limit=%zz", "limit=1&limit=2",
		"strict=yes", "thread=not-an-event", "thread=$a%20b", "before=not*a*cursor", "before=", "before=AAAA",
		"format=pdf", "format=JSONL", "after=-1", "after=-0", "after=+3", "after=9223372036854775808",
		"wait=301", "wait=10m", "wait=soon", "wait=NaN", "wait=Inf", "wait=-1", "wait=-1s", "wait=1e400", "wait=0x10",
		"wait=2562047h", "wait=9223372036854775807ns", "wait=300.000000001", "after=6&wait=1e-300", "after=6&wait=0.0000000015",
		";", "&&&", "=", "limit", "%", "a=b#c", strings.Repeat("limit=1&", 500),
	}
}

// FuzzReadParams sends fuzzed query strings (and room IDs) to the read
// routes: conversation pages, pending work (a long-poll too) and exports.
// Each answers what its parameters ask for or refuses them with a 4xx, and
// no read changes the pending work.
func FuzzReadParams(f *testing.F) {
	fx := newFuzzAPI(f)
	fx.admitConversation(f)
	// A real cursor: fuzzing from one reaches what a forged cursor cannot.
	first := fx.serve(f, "GET", "/v1/agents/alpha/rooms/"+url.PathEscape(fuzzRoom)+"/messages?limit=2", nil)
	var page messagesBody
	if err := json.Unmarshal(first.Body.Bytes(), &page); err != nil || first.Code != http.StatusOK || page.NextCursor == nil {
		f.Fatalf("the first page (%d %s) has no cursor: %v", first.Code, first.Body.Bytes(), err)
	}
	cursor := *page.NextCursor
	const (
		routeMessages = iota
		routePending
		routeExport
		routes
	)
	for _, q := range append(readSeeds(), "before="+cursor, "limit=1&before="+cursor, "thread="+url.QueryEscape(convRoot)+"&before="+cursor) {
		for route := range uint8(routes) {
			f.Add(route, fuzzRoom, q)
		}
	}
	for _, room := range []string{"!other:example.org", "!r", "room", "", "..", "/", "!a/b", "!" + strings.Repeat("x", 255)} {
		f.Add(uint8(routeMessages), room, "")
		f.Add(uint8(routeExport), room, "")
	}
	pendingBefore := fx.pendingAfter(f, 0)
	if len(pendingBefore) != convEvents {
		f.Fatalf("pending = %+v, want the %d events", pendingBefore, convEvents)
	}
	f.Fuzz(func(t *testing.T, route uint8, room, rawQuery string) {
		q, _ := url.ParseQuery(rawQuery) // as the API reads it: a malformed pair is dropped
		limit, limitOK := api.DefaultLimit, true
		if v := q.Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			limit, limitOK = n, err == nil && n >= 1 && n <= api.MaxLimit
		}
		var (
			rec       *httptest.ResponseRecorder
			cancelled bool
		)
		switch route % routes {
		case routeMessages:
			rec, cancelled = fx.run(t, "/v1/agents/alpha/rooms/"+url.PathEscape(room)+"/messages", rawQuery, nil)
		case routePending:
			rec, cancelled = fx.run(t, "/v1/agents/alpha/pending", rawQuery, nil)
		default:
			rec, cancelled = fx.run(t, "/v1/agents/alpha/rooms/"+url.PathEscape(room)+"/export", rawQuery, nil)
		}
		if got := fx.pendingAfter(t, 0); !slices.Equal(got, pendingBefore) {
			t.Fatalf("a read changed the pending work: %+v, was %+v", got, pendingBefore)
		}
		if cancelled && rec.Code == http.StatusOK && rec.Body.Len() == 0 {
			// A long-poll that found nothing and was waiting.
			if route%routes != routePending || q.Get("wait") == "" {
				t.Fatalf("a read without wait waited")
			}
			return
		}
		checkAnswer(t, rec)
		if !limitOK && route%routes != routeExport && rec.Code < 400 {
			t.Fatalf("limit %q accepted: %d", q.Get("limit"), rec.Code)
		}
		if rec.Code != http.StatusOK {
			return
		}
		switch route % routes {
		case routeMessages:
			page := decode[messagesBody](t, rec.Body.Bytes())
			if len(page.Messages) > limit || page.OwedRefetch == nil {
				t.Fatalf("page of %d messages for limit %d: %s", len(page.Messages), limit, rec.Body.Bytes())
			}
		case routePending:
			page := decode[pendingBody](t, rec.Body.Bytes())
			checkPendingPage(t, page, limit, q.Get("after"), pendingBefore)
			// An empty page ends a long-poll only once its wait is over.
			waits := nonZeroWait(q.Get("wait"))
			if (len(page.Events) == 0 && page.TimedOut != waits) || (len(page.Events) > 0 && page.TimedOut) {
				t.Fatalf("wait %q answered %d events with timed_out %v", q.Get("wait"), len(page.Events), page.TimedOut)
			}
		default:
			checkExport(t, rec, q.Get("format"))
		}
	})
}

// nonZeroWait reports whether an accepted wait parameter asks to wait: a
// duration or a number of seconds of at least a nanosecond.
func nonZeroWait(v string) bool {
	if d, err := time.ParseDuration(v); err == nil {
		return d != 0
	}
	secs, err := strconv.ParseFloat(v, 64)
	return err == nil && time.Duration(secs*float64(time.Second)) != 0
}

// checkPendingPage asserts a page holds at most limit of the pending events,
// in receipt order, all after the position asked for.
func checkPendingPage(t *testing.T, page pendingBody, limit int, afterParam string, pending []position) {
	t.Helper()
	after, _ := strconv.ParseInt(afterParam, 10, 64)
	if len(page.Events) > limit {
		t.Fatalf("%d events for limit %d", len(page.Events), limit)
	}
	var want []position
	for _, p := range pending {
		if p.Position > after && len(want) < limit {
			want = append(want, p)
		}
	}
	var got []position
	for _, e := range page.Events {
		got = append(got, position{e.Position, e.EventID})
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pending after %d limit %d = %+v, want %+v", after, limit, got, want)
	}
	if page.NextAfter < after {
		t.Fatalf("next_after %d went back behind %d", page.NextAfter, after)
	}
}

// checkExport asserts an export has the content type of its format and that
// a JSON lines export is one JSON object a line.
func checkExport(t *testing.T, rec *httptest.ResponseRecorder, format string) {
	t.Helper()
	ct := rec.Header().Get("Content-Type")
	if format == "markdown" {
		if ct != "text/markdown; charset=utf-8" {
			t.Fatalf("markdown export has content type %q", ct)
		}
		return
	}
	if ct != "application/x-ndjson" {
		t.Fatalf("%q export has content type %q", format, ct)
	}
	sc := bufio.NewScanner(rec.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("export line %q: %v", sc.Bytes(), err)
		}
	}
}

// FuzzStreamLastEventID opens the pending stream with a fuzzed Last-Event-ID
// header (and after parameter, which the header wins over). A position is
// answered with exactly the pending events behind it, each under its
// position as the event ID; anything else is refused before the stream
// starts.
func FuzzStreamLastEventID(f *testing.F) {
	for _, id := range []string{"", "0", "1", "3", "6", "7", "999999", "9223372036854775807",
		"-1", "-0", "+3", "03", " 3", "3 ", "3\n", "1e3", "0x10", "٣", "3.0", "9223372036854775808",
		"yesterday", strings.Repeat("9", 1000)} {
		f.Add(id, "")
	}
	f.Add("", "2")
	f.Add("", "-1")
	f.Add("4", "not a position")
	f.Add("nope", "2")
	fx := newFuzzAPI(f)
	fx.admitConversation(f)
	f.Fuzz(func(t *testing.T, lastEventID, after string) {
		header := http.Header{}
		if lastEventID != "" {
			header.Set("Last-Event-ID", lastEventID)
		}
		rec, cancelled := fx.run(t, "/v1/agents/alpha/pending/stream", "after="+url.QueryEscape(after), header)
		asked, what := lastEventID, "Last-Event-ID"
		if asked == "" {
			asked, what = after, "after"
		}
		at, err := strconv.ParseInt(asked, 10, 64)
		valid := asked == "" || (err == nil && at >= 0)
		if !cancelled {
			checkAnswer(t, rec)
			if rec.Code == http.StatusOK || valid {
				t.Fatalf("%s %q: a stream answered %d and ended by itself: %s", what, asked, rec.Code, rec.Body.Bytes())
			}
			return
		}
		if !valid {
			t.Fatalf("%s %q opened a stream", what, asked)
		}
		wantStatus(t, rec, http.StatusOK)
		if ct := rec.Header().Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("stream content type %q", ct)
		}
		var got []position
		r := bufio.NewReader(rec.Body)
		for {
			if _, err := r.Peek(1); errors.Is(err, io.EOF) {
				break
			}
			ev := readSSE(t, r)
			item := decode[pendingItem](t, []byte(ev.data))
			if ev.comment || ev.id != strconv.FormatInt(item.Position, 10) {
				t.Fatalf("stream event %+v", ev)
			}
			got = append(got, position{item.Position, item.EventID})
		}
		want := fx.pendingAfter(t, at)
		if !slices.Equal(got, want) {
			t.Fatalf("%s %q streamed %+v, want %+v", what, asked, got, want)
		}
	})
}
