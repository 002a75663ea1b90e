package matrix_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// fakeAnswer is one answer of the fake homeserver.
type fakeAnswer struct {
	status int
	header map[string]string
	body   string
}

// fakeServer answers whoami for @bot:fake on device DEV, and any other
// request by the last segment of its path (a send's transaction ID, a
// fetched event's ID, "sync"): the answers for a key are given in turn,
// the last one repeating. A key with no answers is a 404.
func fakeServer(t *testing.T, answers map[string][]fakeAnswer) *httptest.Server {
	t.Helper()
	var mu sync.Mutex
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/account/whoami") {
			_, _ = w.Write([]byte(`{"user_id":"@bot:fake","device_id":"DEV"}`))
			return
		}
		parts := strings.Split(r.URL.Path, "/")
		key := parts[len(parts)-1]
		mu.Lock()
		queue := answers[key]
		if len(queue) > 1 {
			answers[key] = queue[1:]
		}
		mu.Unlock()
		if len(queue) == 0 {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"errcode":"M_NOT_FOUND"}`))
			return
		}
		a := queue[0]
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(a.body))
	}))
	t.Cleanup(s.Close)
	return s
}

func fakeLogin(t *testing.T, url string) *matrix.Client {
	t.Helper()
	return login(t, matrix.Config{Homeserver: url, UserID: "@bot:fake", AccessToken: "token", Agent: "bot",
		StorageDir: t.TempDir(), Log: zerolog.New(zerolog.NewTestWriter(t))})
}

func TestSendFailuresReachTheOutboxWithTheServersAnswer(t *testing.T) {
	s := fakeServer(t, map[string][]fakeAnswer{
		"limited":        {{429, nil, `{"errcode":"M_LIMIT_EXCEEDED","error":"slow down","retry_after_ms":1500}`}},
		"limited-header": {{429, map[string]string{"Retry-After": "7"}, `{"errcode":"M_LIMIT_EXCEEDED"}`}},
		"forbidden":      {{403, nil, `{"errcode":"M_FORBIDDEN","error":"not in room"}`}},
		"unknown-token":  {{401, nil, `{"errcode":"M_UNKNOWN_TOKEN","error":"bad token"}`}},
		"bad-gateway":    {{502, nil, `<html>upstream down</html>`}},
	})
	c := fakeLogin(t, s.URL)
	for _, tc := range []struct {
		txn        string
		status     int
		errCode    string
		retryAfter time.Duration
	}{
		{"limited", 429, "M_LIMIT_EXCEEDED", 1500 * time.Millisecond},
		{"limited-header", 429, "M_LIMIT_EXCEEDED", 7 * time.Second},
		{"forbidden", 403, "M_FORBIDDEN", 0},
		{"unknown-token", 401, "M_UNKNOWN_TOKEN", 0},
		{"bad-gateway", 502, "", 0},
	} {
		t.Run(tc.txn, func(t *testing.T) {
			d := journal.Delivery{DeliveryID: "d", Stage: journal.StageFinal, RoomID: "!r:fake", TxnID: tc.txn, EventType: "m.room.message"}
			_, err := matrix.NewSender(c).Send(t.Context(), d, json.RawMessage(`{"body":"x"}`))
			var se *journal.SendError
			if !errors.As(err, &se) || se.Status != tc.status || se.RetryAfter != tc.retryAfter {
				t.Fatalf("send: %v, want a SendError with status %d, retry after %s", err, tc.status, tc.retryAfter)
			}
			var he *matrix.HTTPError
			if !errors.As(err, &he) || he.ErrCode != tc.errCode {
				t.Errorf("send: %v, want errcode %q", err, tc.errCode)
			}
			if got := errors.Is(err, matrix.ErrInvalidToken); got != (tc.errCode == "M_UNKNOWN_TOKEN") {
				t.Errorf("errors.Is(ErrInvalidToken) = %t for %s", got, tc.errCode)
			}
		})
	}
}

func TestASendThatNeverGotAnAnswerIsStatusZero(t *testing.T) {
	s := fakeServer(t, nil)
	c := fakeLogin(t, s.URL)
	s.Close()
	d := journal.Delivery{DeliveryID: "d", Stage: journal.StageFinal, RoomID: "!r:fake", TxnID: "t", EventType: "m.room.message"}
	_, err := matrix.NewSender(c).Send(t.Context(), d, json.RawMessage(`{"body":"x"}`))
	var se *journal.SendError
	if !errors.As(err, &se) || se.Status != 0 {
		t.Fatalf("send to a closed server: %v, want a SendError with status 0", err)
	}
	var he *matrix.HTTPError
	if errors.As(err, &he) {
		t.Errorf("a network failure became %v", he)
	}
}

// The server's timestamp comes from fetching the event after the send, in
// one try: an event the server cannot serve yet (Dendrite answers the send
// first) is acknowledged without it, and its sync echo supplies it, so the
// next send never waits on the server's read lag.
func TestTheSenderLearnsTheServersTimestampWhenTheEventIsReadable(t *testing.T) {
	s := fakeServer(t, map[string][]fakeAnswer{
		"ok":      {{200, nil, `{"event_id":"$sent"}`}},
		"$sent":   {{200, nil, `{"event_id":"$sent","origin_server_ts":1234,"type":"m.room.message"}`}},
		"lagging": {{200, nil, `{"event_id":"$lag"}`}},
		"$lag":    {{404, nil, `{"errcode":"M_NOT_FOUND"}`}, {200, nil, `{"event_id":"$lag","origin_server_ts":1,"type":"m.room.message"}`}},
		"broken":  {{200, nil, `{"event_id":"$broken"}`}},
		"$broken": {{500, nil, `{"errcode":"M_UNKNOWN"}`}},
	})
	c := fakeLogin(t, s.URL)
	for txn, want := range map[string]journal.Sent{
		"ok": {EventID: "$sent", ServerTS: 1234},
		// Accepted but not readable yet, or never: acknowledged without the
		// timestamp, which the sync echo supplies.
		"lagging": {EventID: "$lag"},
		"broken":  {EventID: "$broken"},
	} {
		d := journal.Delivery{DeliveryID: "d", Stage: journal.StageFinal, RoomID: "!r:fake", TxnID: txn, EventType: "m.room.message"}
		sent, err := matrix.NewSender(c).Send(t.Context(), d, json.RawMessage(`{"body":"x"}`))
		if err != nil || sent != want {
			t.Errorf("send %s = %+v, %v; want %+v", txn, sent, err, want)
		}
	}
}

// Each event reaches the journal as the bytes the server sent: spacing,
// key order, escapes and integers beyond float64's precision untouched.
func TestSyncKeepsEachEventsBytesAsTheServerSentThem(t *testing.T) {
	events := []string{
		`{ "type" : "m.room.message", "content":{"n":9007199254740993,"body":"\u003cb\u003e <i> é \u00e9"},` +
			`"sender":"@h:fake","event_id":"$1","origin_server_ts":1}`,
		`{"event_id":"$2","origin_server_ts":2,"sender":"@h:fake","type":"m.reaction","content":{}}`,
		`{"event_id":"$3","origin_server_ts":3,"sender":"@h:fake","type":"m.room.message","content":{"body":"a"}}`,
		`{"event_id":"$4","origin_server_ts":4,"sender":"@h:fake","type":"m.room.member","state_key":"@bot:fake","content":{"membership":"leave"}}`,
	}
	body := `{"next_batch":"s2","rooms":{` +
		`"join":{"!b:fake":{"timeline":{"events":[` + events[0] + `,` + events[1] + `],"limited":true,"prev_batch":"p1"}},` +
		`"!a:fake":{"timeline":{"events":[` + events[2] + `]}}},` +
		`"invite":{"!j:fake":{"invite_state":{"events":[]}},"!i:fake":{}},` +
		`"leave":{"!l:fake":{"timeline":{"events":[` + events[3] + `],"prev_batch":"p2"}}}}}`
	c := fakeLogin(t, fakeServer(t, map[string][]fakeAnswer{"sync": {{200, nil, body}}}).URL)

	b, err := c.Sync(t.Context(), "s1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := &matrix.SyncBatch{
		NextBatch: "s2",
		Joined: []matrix.RoomTimeline{
			{RoomID: "!a:fake", Events: []json.RawMessage{json.RawMessage(events[2])}},
			{RoomID: "!b:fake", Events: []json.RawMessage{json.RawMessage(events[0]), json.RawMessage(events[1])}, Limited: true, PrevBatch: "p1"},
		},
		Invited: []string{"!i:fake", "!j:fake"},
		Left:    []matrix.RoomTimeline{{RoomID: "!l:fake", Events: []json.RawMessage{json.RawMessage(events[3])}, PrevBatch: "p2"}},
	}
	if !reflect.DeepEqual(b, want) {
		t.Errorf("batch =\n%+v\nwant\n%+v", b, want)
	}
}

func TestASyncWithoutANextBatchIsAnError(t *testing.T) {
	c := fakeLogin(t, fakeServer(t, map[string][]fakeAnswer{"sync": {{200, nil, `{"rooms":{}}`}}}).URL)
	if b, err := c.Sync(t.Context(), "s1", time.Second); err == nil {
		t.Fatalf("sync = %+v, want an error", b)
	}
}

// mautrix records every request to the logger of the request's context;
// the port keeps those per-request records (one per sync) out of whatever
// logger its caller's context carries.
func TestRequestsLeaveTheCallersContextLoggerAlone(t *testing.T) {
	c := fakeLogin(t, fakeServer(t, map[string][]fakeAnswer{"txn": {{200, nil, `{"event_id":"$e"}`}}}).URL)
	var logs bytes.Buffer
	ctx := zerolog.New(&logs).Level(zerolog.TraceLevel).WithContext(t.Context())
	if _, err := c.Send(ctx, "!r:fake", "m.room.message", "txn", json.RawMessage(`{"body":"x"}`)); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 {
		t.Errorf("the caller's logger received mautrix's records: %s", logs.String())
	}
}
