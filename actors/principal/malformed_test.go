package principal_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// malformedEvent is what no conforming server sends: its sender is not a
// user ID.
const malformedEvent = `{"event_id":"$malformed:localhost","type":"m.room.message","sender":"not-a-user",` +
	`"origin_server_ts":1,"content":{"msgtype":"m.text","body":"bad"}}`

const countRejected = `SELECT count(*) FROM rejected_events WHERE event_id = '$malformed:localhost'`

// injectingProxy stands in front of the homeserver and adds malformedEvent
// to the first sync response that has a timeline for room: the one fault a
// real server will not produce on demand.
func injectingProxy(t *testing.T, target, room string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	var injected atomic.Bool
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(u)
		r.Out.Header.Del("Accept-Encoding") // plain bodies, to rewrite
	}}
	proxy.ModifyResponse = func(resp *http.Response) error {
		if !strings.HasSuffix(resp.Request.URL.Path, "/sync") || resp.StatusCode != http.StatusOK || injected.Load() {
			return nil
		}
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		resp.Body.Close()
		out := raw
		var sync map[string]any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if dec.Decode(&sync) == nil {
			if tl, ok := dig(sync, "rooms", "join", room, "timeline").(map[string]any); ok {
				events, _ := tl["events"].([]any)
				tl["events"] = append(events, json.RawMessage(malformedEvent))
				if b, err := json.Marshal(sync); err == nil {
					out = b
					injected.Store(true)
				}
			}
		}
		resp.Body = io.NopCloser(bytes.NewReader(out))
		resp.ContentLength = int64(len(out))
		resp.Header.Set("Content-Length", strconv.Itoa(len(out)))
		return nil
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return srv.URL
}

// dig walks nested JSON objects by key.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func TestAMalformedEventFromTheServerIsRecordedAndSkipped(t *testing.T) {
	f := newFixture(t)
	f.homeserver = injectingProxy(t, hs.URL, f.room)
	f.start()
	f.awaitJoined()
	f.alice.SendText(f.room, "before")
	f.awaitReply("before")
	f.alice.SendText(f.room, "after")
	f.awaitReply("after")
	var rejected int
	if err := f.store.DB().QueryPool().QueryRowContext(f.ctx, countRejected).Scan(&rejected); err != nil {
		t.Fatal(err)
	}
	if rejected != 1 {
		t.Fatalf("rejected events recorded = %d, want the malformed one", rejected)
	}
	if got := f.replies(); got["echo: before"] != 1 || got["echo: after"] != 1 || got["echo: bad"] != 0 {
		t.Fatalf("answers = %v", got)
	}
}
