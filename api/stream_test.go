package api_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// Each agent has a cap of its own: one agent's open streams never shut out
// another agent's.
func TestOneAgentsStreamsDoNotUseAnotherAgentsCap(t *testing.T) {
	fx := newFixture(t, func(d *api.Deps) { d.MaxStreams = 1; d.Heartbeat = time.Hour })
	open := fx.send(t, "GET", "/v1/agents/alpha/pending/stream", alphaToken, nil, nil)
	defer open.Body.Close()
	if open.StatusCode != http.StatusOK {
		t.Fatalf("alpha's stream = %d", open.StatusCode)
	}
	other := fx.send(t, "GET", "/v1/agents/beta/pending/stream", betaToken, nil, nil)
	defer other.Body.Close()
	if other.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(other.Body)
		t.Fatalf("beta's stream beside alpha's = %d %s, want 200", other.StatusCode, b)
	}
}

// A client that stops reading fills the connection and blocks the
// stream's writes: the write deadline ends the stream, and its place under
// the cap is free again.
func TestAStreamWhoseClientStopsReadingIsClosedAndFreesItsPlace(t *testing.T) {
	fx := newFixture(t, func(d *api.Deps) {
		d.MaxStreams = 1
		d.Heartbeat = 20 * time.Millisecond
		d.StreamWriteTimeout = 200 * time.Millisecond
	})
	// More than the socket buffers of both ends hold.
	big := strings.Repeat("x", 60<<10)
	for batch := range 4 {
		var evs []mx.Ev
		for i := range 50 {
			n := batch*50 + i
			evs = append(evs, mx.Message(fmt.Sprintf("$big%03d", n), alice, int64(1000+n), big))
		}
		fx.admit(t, room, evs...)
	}
	u, err := url.Parse(fx.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	stalled, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	if err := stalled.(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(stalled, "GET /v1/agents/alpha/pending/stream HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", u.Host, alphaToken); err != nil {
		t.Fatal(err)
	}
	status := make([]byte, len("HTTP/1.1 200"))
	if _, err := io.ReadFull(stalled, status); err != nil || string(status) != "HTTP/1.1 200" {
		t.Fatalf("stalled stream answered %q, %v", status, err)
	}
	// The stalled stream holds alpha's one place until its write times out;
	// polling the refusal until then.
	deadline := time.Now().Add(20 * time.Second)
	for polls := 0; ; polls++ {
		resp := fx.send(t, "GET", "/v1/agents/alpha/pending/stream", alphaToken, nil, nil)
		code := resp.StatusCode
		resp.Body.Close()
		if code == http.StatusOK && polls > 0 {
			return
		}
		if code != http.StatusServiceUnavailable {
			t.Fatalf("stream = %d after %d polls, want 503 while the stalled one holds the place, then 200", code, polls)
		}
		if time.Now().After(deadline) {
			t.Fatal("the stream of a client that stopped reading still holds its place")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
