package mcpserver_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/mcpserver"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// daemonMux serves the API and the MCP handler on one listener, as the
// daemon mounts them.
func (fx *fixture) daemonMux(t *testing.T, api http.Handler) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/v1/agents/{agent}/mcp", mcpserver.Handler(api, []string{"alpha", "beta"}, zerolog.Nop()))
	mux.Handle("/", api)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// httpSession is an SDK client's session of an agent's MCP endpoint.
func httpSession(t *testing.T, srv *httptest.Server, agent, token, protocol string, copts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	t.Helper()
	transport := &mcp.StreamableClientTransport{Endpoint: srv.URL + "/v1/agents/" + agent + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{token: token, next: srv.Client().Transport}}, MaxRetries: -1}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, copts).Connect(ctx, transport,
		&mcp.ClientSessionOptions{ProtocolVersion: protocol})
	if err == nil {
		t.Cleanup(func() { _ = cs.Close() })
	}
	return cs, err
}

func TestMCPOverHTTPRefusesABadTokenUpFrontWithTheAPIsError(t *testing.T) {
	fx := newFixture(t)
	srv := fx.daemonMux(t, fx.api)
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"curl","version":"0"}}}`
	for _, tc := range []struct {
		name, path, token string
		status            int
		code              string
	}{
		{"no token", "/v1/agents/alpha/mcp", "", 401, "unauthorized"},
		{"a token no agent holds", "/v1/agents/alpha/mcp", "not-a-token", 401, "unauthorized"},
		{"another agent's token", "/v1/agents/alpha/mcp", betaToken, 403, "forbidden"},
		{"an unknown agent", "/v1/agents/gamma/mcp", alphaToken, 404, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+tc.path, strings.NewReader(initialize))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			if resp.StatusCode != tc.status || json.Unmarshal(b, &e) != nil || e.Error.Code != tc.code ||
				resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s %s, want %d %s", resp.StatusCode, resp.Header.Get("Content-Type"), b, tc.status, tc.code)
			}
			if tc.status == 401 && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("401 without WWW-Authenticate: %v", resp.Header)
			}
		})
	}
	if _, err := httpSession(t, srv, "alpha", betaToken, "", nil); err == nil {
		t.Fatal("an SDK client connected with another agent's token")
	}
}

func TestMCPOverHTTPCallsTheAPIInMemoryWithTheRequestsToken(t *testing.T) {
	for _, protocol := range []string{"", "2025-11-25"} {
		name := protocol
		if name == "" {
			name = "latest"
		}
		t.Run(name, func(t *testing.T) {
			fx := newFixture(t)
			fx.admit(t, room, mx.Message("$q", alice, 1000, "question"))
			feed := newChangeFeed(fx.api)
			srv := fx.daemonMux(t, feed)
			var got updates
			cs, err := httpSession(t, srv, "alpha", alphaToken, protocol, &mcp.ClientOptions{ResourceUpdatedHandler: got.handler})
			if err != nil {
				t.Fatal(err)
			}
			page := ok[pendingOut](t, cs, "wait_for_work", map[string]any{"wait_seconds": 0})
			if len(page.Events) != 1 || page.Events[0].EventID != "$q" {
				t.Fatalf("pending = %+v", page)
			}
			if d := ok[deliveryOut](t, cs, "reply", map[string]any{"event_id": "$q", "body": "answer"}); d.Outcome != "created" {
				t.Fatalf("reply = %+v", d)
			}
			fails(t, cs, "send", map[string]any{"room_id": room, "body": "hello"}, "bad_request", 400)

			// A subscription's stream runs with the subscriber's token.
			uri := mcpserver.ConversationURI("alpha", room, "")
			if err := cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: uri}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the change stream to open", func() bool { _, open := feed.counts(); return open == 1 })
			feed.events <- room
			waitFor(t, "the subscriber to be told", func() bool { return got.count(uri) == 1 })
			if feed.tokens[0] != "Bearer "+alphaToken {
				t.Fatalf("the stream ran with %q", feed.tokens[0])
			}
			// Beta's path serves beta: alpha's event is not beta's.
			other, err := httpSession(t, srv, "beta", betaToken, protocol, nil)
			if err != nil {
				t.Fatal(err)
			}
			fails(t, other, "reply", map[string]any{"event_id": "$q", "body": "answer"}, "not_found", 404)
		})
	}
}
