package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// outboxState is the agent's whole outbox, for a check that a refused
// request enqueued nothing.
func (fx *fuzzAPI) outboxState(t *testing.T) string {
	t.Helper()
	rows, err := fx.alpha.Unacknowledged(context.Background(), 100000, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, d := range rows {
		fmt.Fprintf(&b, "%s %d %s %s\n", d.DeliveryID, d.State, d.TxnID, d.Content)
	}
	return b.String()
}

// FuzzSend posts fuzzed sends: a fuzzed key (in the header or the body),
// room and body. A send taken is exactly one delivery under the key's ID,
// and the same request again is that delivery replayed; a refused one
// enqueues nothing.
func FuzzSend(f *testing.F) {
	for _, seed := range []struct {
		room, key string
		inBody    bool
		body      string
	}{
		{fuzzRoom, "k1", false, `{"body":"hello"}`},
		{fuzzRoom, "k2", true, `{"body":"hello","format":"plain","msgtype":"m.notice"}`},
		{fuzzRoom, "k3", false, `{"body":"hi","thread":"$fz.root"}`},
		{fuzzRoom, "k4", false, `{"body":"hi","reply_to":"$fz.root"}`},
		{fuzzRoom, "k5", false, `{"body":"hi","reply_to":"$nope"}`},
		{fuzzRoom, "", false, `{"body":"no key"}`},
		{fuzzRoom, strings.Repeat("k", 256), false, `{"body":"long key"}`},
		{fuzzRoom, "k\x00", false, `{"body":"control"}`},
		{fuzzRoom, "k6", false, `{"body":""}`},
		{fuzzRoom, "k7", false, `{"body":"x","msgtype":"m.image"}`},
		{fuzzRoom, "k8", false, `{"body":"x","extra":1}`},
		{fuzzRoom, "k9", false, `not json`},
		{"!elsewhere:example.org", "k10", false, `{"body":"not in it"}`},
		{"room", "k11", false, `{"body":"bad room"}`},
		{fuzzRoom, "k12", false, `{"body":"` + strings.Repeat("x", api.MaxReplyBytes) + `"}`},
	} {
		f.Add(seed.room, seed.key, seed.inBody, []byte(seed.body))
	}
	fx := newFuzzAPI(f)
	fx.admit(f, mx.Message("$fz.root", alice, 999, "root"))
	f.Fuzz(func(t *testing.T, room, key string, inBody bool, body []byte) {
		if !routable(room) {
			return
		}
		if inBody && key != "" {
			var v map[string]any
			if json.Unmarshal(body, &v) == nil && v != nil {
				v["key"] = key
				body, _ = json.Marshal(v)
				// JSON carries the key as valid UTF-8: what the server is
				// given is the key as encoded.
				_ = json.Unmarshal(body, &v)
				key, _ = v["key"].(string)
			}
		}
		req := fuzzRequest(context.Background(), t, "POST", "/v1/agents/alpha/rooms/"+url.PathEscape(room)+"/send", body)
		headerKey := !inBody && key != "" && validHeaderValue(key)
		if headerKey {
			req.Header.Set("Idempotency-Key", key)
		}
		before := fx.outboxState(t)
		rec := serveRequest(fx, req)
		checkAnswer(t, rec)
		after := fx.outboxState(t)
		if rec.Code != http.StatusOK {
			if after != before {
				t.Fatalf("a send refused with %d changed the outbox:\n%s\nto\n%s", rec.Code, before, after)
			}
			return
		}
		got := decode[deliveryBody](t, rec.Body.Bytes())
		if !journal.ValidRoomID(room) || !journal.ValidIdempotencyKey(key) {
			t.Fatalf("a send to %q under %q was taken: %s", room, key, rec.Body.Bytes())
		}
		if got.DeliveryID != journal.SendDeliveryID(room, key) {
			t.Fatalf("delivery %q, want the key's %q", got.DeliveryID, journal.SendDeliveryID(room, key))
		}
		switch got.Outcome {
		case "created":
			if strings.Count(after, got.DeliveryID+" ") != 1 || strings.Count(before, got.DeliveryID+" ") != 0 {
				t.Fatalf("a created send is not one new row:\n%s", after)
			}
		case "replayed":
			if after != before {
				t.Fatalf("a replayed send changed the outbox")
			}
		default:
			t.Fatalf("outcome %q", got.Outcome)
		}
		// The same request again is the same delivery, replayed.
		req2 := fuzzRequest(context.Background(), t, "POST", "/v1/agents/alpha/rooms/"+url.PathEscape(room)+"/send", body)
		if headerKey {
			req2.Header.Set("Idempotency-Key", key)
		}
		rec2 := serveRequest(fx, req2)
		if rec2.Code != http.StatusOK || decode[deliveryBody](t, rec2.Body.Bytes()).Outcome != "replayed" {
			t.Fatalf("the same send again: %d %s", rec2.Code, rec2.Body.Bytes())
		}
	})
}

// serveRequest answers one request that ends by itself.
func serveRequest(fx *fuzzAPI, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	fx.handler.ServeHTTP(rec, req)
	return rec
}

// validHeaderValue reports whether net/http can send v as a header value.
func validHeaderValue(v string) bool {
	if !utf8.ValidString(v) {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return strings.TrimSpace(v) == v
}

// FuzzReact reacts to and withdraws reactions with fuzzed keys, in a
// fuzzed order: a reaction is never more than one live delivery, and a
// refused request changes nothing.
func FuzzReact(f *testing.F) {
	for _, seed := range []struct {
		key string
		ops []byte
	}{
		{"👍", []byte{0, 0, 1, 1}},
		{"👍", []byte{1}},
		{"❤️", []byte{0, 2, 1, 0, 2, 1}},
		{"", []byte{0}},
		{" x", []byte{0}},
		{strings.Repeat("x", 65), []byte{0}},
		{"a\nb", []byte{0, 1}},
	} {
		f.Add(seed.key, seed.ops)
	}
	fx := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, key string, ops []byte) {
		if len(ops) > 12 {
			ops = ops[:12]
		}
		fx.n++
		id := fmt.Sprintf("$fz.%d.r", fx.n)
		fx.admit(t, mx.Message(id, alice, int64(1000+fx.n), "react to me"))
		path := "/v1/agents/alpha/events/" + url.PathEscape(id) + "/react?key=" + url.QueryEscape(key)
		for _, op := range ops {
			before := fx.outboxState(t)
			var rec = fx.serve(t, http.MethodPost, path, nil)
			switch op % 3 {
			case 1:
				rec = fx.serve(t, http.MethodDelete, path, nil)
			case 2:
				// The outbox sends what is queued: an acknowledgement.
				for _, d := range fx.unacked(t) {
					ack(t, fx.alpha, d.DeliveryID, "$sent"+strings.ReplaceAll(d.DeliveryID, "$", "."))
				}
				continue
			}
			checkAnswer(t, rec)
			if rec.Code != http.StatusOK && fx.outboxState(t) != before {
				t.Fatalf("a refused reaction changed the outbox")
			}
			if !journal.ValidReactionKey(key) && rec.Code != http.StatusBadRequest {
				t.Fatalf("key %q: %d %s", key, rec.Code, rec.Body.Bytes())
			}
			if live := fx.liveReactions(t, id, key); live > 1 {
				t.Fatalf("%d live reactions with one key", live)
			}
		}
	})
}

func (fx *fuzzAPI) unacked(t *testing.T) []journal.Delivery {
	t.Helper()
	rows, err := fx.alpha.Unacknowledged(context.Background(), 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// liveReactions counts the generations of a reaction that are shown or
// on their way and not withdrawn.
func (fx *fuzzAPI) liveReactions(t *testing.T, eventID, key string) int {
	t.Helper()
	live := 0
	for g := 0; g < 20; g++ {
		d, err := fx.alpha.Delivery(context.Background(), journal.ReactionDeliveryID(eventID, key, g), journal.StageFinal)
		if err != nil {
			break
		}
		if d.State == journal.DeliveryRetired || d.State == journal.DeliveryFailed {
			continue
		}
		if _, err := fx.alpha.Delivery(context.Background(), journal.UnreactDeliveryID(eventID, key, g), journal.StageFinal); err != nil {
			live++
		}
	}
	return live
}

// FuzzTyping puts fuzzed typing bodies: the homeserver is asked exactly
// when the answer is 200, with what the body said.
func FuzzTyping(f *testing.F) {
	for _, body := range []string{`{"typing":true}`, `{"typing":false}`, `{"typing":true,"timeout_ms":1}`,
		`{"typing":true,"timeout_ms":120000}`, `{"typing":true,"timeout_ms":120001}`, `{"typing":true,"timeout_ms":0}`,
		`{}`, `{"typing":"yes"}`, `[]`, ``, `{"typing":true}x`} {
		f.Add(fuzzRoom, []byte(body))
	}
	fx := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, room string, body []byte) {
		if !routable(room) {
			return
		}
		fx.hs.mu.Lock()
		n := len(fx.hs.typing)
		fx.hs.mu.Unlock()
		rec := fx.serve(t, http.MethodPut, "/v1/agents/alpha/rooms/"+url.PathEscape(room)+"/typing", body)
		checkAnswer(t, rec)
		fx.hs.mu.Lock()
		calls := fx.hs.typing[n:]
		fx.hs.mu.Unlock()
		if rec.Code != http.StatusOK {
			if len(calls) != 0 {
				t.Fatalf("a refused typing (%d) reached the homeserver: %+v", rec.Code, calls)
			}
			return
		}
		var req struct {
			Typing bool `json:"typing"`
		}
		if err := json.NewDecoder(bytes.NewReader(body)).Decode(&req); err != nil {
			t.Fatalf("a typing body %q was taken: %v", body, err)
		}
		if len(calls) != 1 || calls[0].room != room || calls[0].typing != req.Typing {
			t.Fatalf("typing %q with %s made the calls %+v", room, body, calls)
		}
	})
}
