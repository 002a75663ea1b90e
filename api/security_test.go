package api_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// The two principals of the security tests: each has a room of its own and
// both are in a shared room, where each holds its own copy of one event.
const (
	secAlphaRoom  = "!alpha-only:example.org"
	secBetaRoom   = "!beta-only:example.org"
	secSharedRoom = "!shared:example.org"
	// secAlphaText and secBetaText mark each principal's private messages:
	// neither may appear in an answer to the other's token.
	secAlphaText = "alpha-private-words-7c1"
	secBetaText  = "beta-private-words-2e9"
)

// secRooms are the rooms a state snapshot reads.
var secRooms = []string{secAlphaRoom, secBetaRoom, secSharedRoom}

// secEvents are the events a state snapshot looks up.
var secEvents = []string{"$a1", "$a2", "$a3", "$b1", "$b2", "$s1"}

// leaveLog records the rooms each agent's leave function was asked for.
type leaveLog struct {
	mu   sync.Mutex
	left map[string][]string
}

func (l *leaveLog) leave(agent string) func(context.Context, string) error {
	return func(_ context.Context, room string) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.left[agent] = append(l.left[agent], room)
		return nil
	}
}

func (l *leaveLog) of(agent string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.left[agent])
}

// readLog is a conversation reader that records every read it is asked
// for before reading the store: in the daemon the reader is the hydrator,
// which goes to the homeserver with what it is given.
type readLog struct {
	journal.ConversationReader
	mu    sync.Mutex
	rooms []string
}

func (r *readLog) Read(ctx context.Context, req journal.ReadRequest) (journal.Page, error) {
	r.mu.Lock()
	r.rooms = append(r.rooms, req.RoomID)
	r.mu.Unlock()
	return r.ConversationReader.Read(ctx, req)
}

func (r *readLog) asked() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rooms)
}

// secFixture is an API over a real on-disk journal with two seeded
// principals, alpha and beta.
type secFixture struct {
	alpha, beta journal.PrincipalStore
	reads       map[string]*readLog
	leaves      *leaveLog
	srv         *httptest.Server
}

func newSecFixture(t *testing.T) *secFixture {
	t.Helper()
	st, _ := testsupport.MustOpen(t)
	ctx := context.Background()
	fx := &secFixture{reads: map[string]*readLog{}, leaves: &leaveLog{left: map[string][]string{}}}
	var err error
	if fx.alpha, err = st.Principal(ctx, "alpha", "@alpha:example.org"); err != nil {
		t.Fatal(err)
	}
	if fx.beta, err = st.Principal(ctx, "beta", "@beta:example.org"); err != nil {
		t.Fatal(err)
	}
	admit := func(v journal.PrincipalStore, room string, evs ...mx.Ev) {
		t.Helper()
		res, err := v.AdmitBatch(ctx, mx.Live(room, evs...), "")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Outcome != journal.Admitted {
				t.Fatalf("admit %s: %s %v", r.EventID, r.Outcome, r.Err)
			}
		}
	}
	admit(fx.alpha, secAlphaRoom, mx.Message("$a1", alice, 1000, secAlphaText+" one"),
		mx.Message("$a2", alice, 1001, secAlphaText+" two"), mx.Message("$a3", alice, 1002, secAlphaText+" three"))
	admit(fx.beta, secBetaRoom, mx.Message("$b1", alice, 1000, secBetaText+" one"),
		mx.Message("$b2", alice, 1001, secBetaText+" two"))
	admit(fx.alpha, secSharedRoom, mx.Message("$s1", alice, 1003, "shared question"))
	admit(fx.beta, secSharedRoom, mx.Message("$s1", alice, 1003, "shared question"))

	agents := map[string]api.Agent{}
	for name, v := range map[string]journal.PrincipalStore{"alpha": fx.alpha, "beta": fx.beta} {
		fx.reads[name] = &readLog{ConversationReader: v}
		agents[name] = api.Agent{Store: v, Conversation: fx.reads[name], Token: name + "-token-" + strings.Repeat("k", 24),
			Hints: st.Hints(), Leave: fx.leaves.leave(name), Homeserver: newFakeHomeserver()}
	}
	fx.srv = httptest.NewServer(api.New(api.Deps{Agents: agents, Log: zerolog.Nop(),
		CursorKey: []byte("security test cursor key"), Heartbeat: time.Hour}))
	t.Cleanup(fx.srv.Close)
	return fx
}

func secToken(agent string) string { return agent + "-token-" + strings.Repeat("k", 24) }

// secResponse is one answer: its status, headers and (for a stream) the
// first bytes of its body.
type secResponse struct {
	status int
	header http.Header
	body   []byte
}

// call sends one request. auth is the whole Authorization header, "" for
// none. A stream is read only to its headers: it never ends by itself.
func (fx *secFixture) call(t *testing.T, method, path, auth string, body io.Reader, header http.Header) secResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, fx.srv.URL+path, body)
	if err != nil {
		t.Fatalf("request %s %s: %v", method, path, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := fx.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var b []byte
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		// The backlog is written before the first flush; a heartbeat an
		// hour away never comes, so a short read is all there is to have.
		buf := make([]byte, 64<<10)
		n, _ := resp.Body.Read(buf)
		b = buf[:n]
	} else if b, err = io.ReadAll(resp.Body); err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return secResponse{status: resp.StatusCode, header: resp.Header, body: b}
}

// viewSnapshot is everything a principal's view shows: its pending work, its
// outbox, its turn records and its conversations.
func viewSnapshot(t *testing.T, v journal.PrincipalStore) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	page, err := v.Pending(ctx, 1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range page.Events {
		fmt.Fprintf(&b, "pending %d %s %s\n", e.Seq, e.RoomID, e.EventID)
	}
	outbox, err := v.Unacknowledged(ctx, 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range outbox {
		fmt.Fprintf(&b, "outbox %s %d %s %s\n", d.DeliveryID, d.Stage, d.TxnID, d.Content)
	}
	for _, id := range secEvents {
		rec, ok, err := v.TurnForEvent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			fmt.Fprintf(&b, "turn %s %s %d %s\n", id, rec.TurnID, rec.State, rec.Record)
		}
		ev, seen, err := v.AdmittedEvent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		thread := "-"
		if ev.Thread != nil {
			thread = *ev.Thread
		}
		fmt.Fprintf(&b, "admitted %s %v %s %s %v\n", id, seen, ev.RoomID, thread, ev.Pending)
		approvals, err := v.ApprovalsForEvent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range approvals {
			fmt.Fprintf(&b, "approval %s %s %s %s %s\n", id, a.CallID, a.Tool, a.Arguments, a.State)
		}
	}
	for _, room := range secRooms {
		p, err := v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range p.Messages {
			fmt.Fprintf(&b, "message %s %s %s\n", room, m.EventID, m.Content)
		}
	}
	return b.String()
}

// securityProbe is how the matrix exercises one route.
type securityProbe struct {
	// public routes need no token.
	public bool
	// room and event fill the pattern's {room_id} and {event_id}.
	room, event string
	// body is the request body of the authorized call.
	body string
	// ok is the status of the authorized call.
	ok int
	// query, when set, follows the path.
	query string
	// call fills the pattern's {call_id}.
	call string
}

// securityMatrix holds every route api.New serves, by its pattern. A route
// added to the handler without an entry here fails
// TestEveryRouteRefusesAMissingOrForeignToken.
var securityMatrix = map[string]securityProbe{
	"GET /healthz": {public: true, ok: http.StatusOK},
	"GET /v1/agents/{agent}/rooms/{room_id}/messages":  {room: secAlphaRoom, ok: http.StatusOK},
	"GET /v1/agents/{agent}/pending":                   {ok: http.StatusOK},
	"GET /v1/agents/{agent}/pending/stream":            {ok: http.StatusOK},
	"POST /v1/agents/{agent}/events/{event_id}/reply":  {event: "$a1", body: `{"body":"an answer"}`, ok: http.StatusOK},
	"POST /v1/agents/{agent}/events/{event_id}/ignore": {event: "$a2", ok: http.StatusOK},
	"POST /v1/agents/{agent}/rooms/{room_id}/leave":    {room: secAlphaRoom, ok: http.StatusOK},
	"GET /v1/agents/{agent}/rooms/{room_id}/export":    {room: secAlphaRoom, ok: http.StatusOK},
	"POST /v1/agents/{agent}/rooms/{room_id}/send": {room: secAlphaRoom, body: `{"body":"a note","key":"k1"}`,
		ok: http.StatusOK},
	"POST /v1/agents/{agent}/events/{event_id}/react": {event: "$a3", body: `{"key":"👍"}`, ok: http.StatusOK},
	// Sorted before the POST, it finds no reaction to withdraw.
	"DELETE /v1/agents/{agent}/events/{event_id}/react": {event: "$a3", query: "?key=%F0%9F%91%8D",
		ok: http.StatusNotFound},
	"PUT /v1/agents/{agent}/rooms/{room_id}/typing":    {room: secAlphaRoom, body: `{"typing":true}`, ok: http.StatusOK},
	"GET /v1/agents/{agent}/rooms":                     {ok: http.StatusOK},
	"GET /v1/agents/{agent}/rooms/{room_id}/members":   {room: secAlphaRoom, ok: http.StatusOK},
	"GET /v1/agents/{agent}/media/{server}/{media_id}": {ok: http.StatusOK},
	"GET /v1/agents/{agent}/changes":                   {ok: http.StatusOK},
	"POST /v1/agents/{agent}/events/{event_id}/approvals": {event: "$a1",
		body: `{"call_id":"c1","tool":"send_mail","arguments":{"to":"bob@example.org"}}`, ok: http.StatusOK},
	"GET /v1/agents/{agent}/events/{event_id}/approvals": {event: "$a1", ok: http.StatusOK},
	// Sorted before the POST, it finds no approval to read.
	"GET /v1/agents/{agent}/events/{event_id}/approvals/{call_id}": {event: "$a1", call: "c1", ok: http.StatusNotFound},
}

// servedRoutes reads the patterns api.New registers from its source, with
// whether each handler is wrapped by the token check.
func servedRoutes(t *testing.T) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "api.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	routes := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 2 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || (sel.Sel.Name != "HandleFunc" && sel.Sel.Name != "Handle") {
			return true
		}
		lit, ok := call.Args[0].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			t.Fatalf("%s: a route pattern that is not a literal cannot be checked", fset.Position(call.Pos()))
		}
		pattern, err := strconv.Unquote(lit.Value)
		if err != nil {
			t.Fatal(err)
		}
		authed := false
		if h, ok := call.Args[1].(*ast.CallExpr); ok {
			if hs, ok := h.Fun.(*ast.SelectorExpr); ok && hs.Sel.Name == "authed" {
				authed = true
			}
		}
		routes[pattern] = authed
		return true
	})
	return routes
}

// routePath fills a route pattern for agent.
func routePath(t *testing.T, pattern, agent string, p securityProbe) (method, path string) {
	t.Helper()
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		t.Fatalf("route %q has no method", pattern)
	}
	r := strings.NewReplacer("{agent}", url.PathEscape(agent), "{room_id}", url.PathEscape(p.room),
		"{event_id}", url.PathEscape(p.event), "{server}", fakeMediaServer, "{media_id}", fakeMediaID,
		"{call_id}", url.PathEscape(p.call))
	path = r.Replace(path) + p.query
	if strings.ContainsAny(path, "{}") {
		t.Fatalf("route %q has a wildcard the security matrix cannot fill", pattern)
	}
	return method, path
}

// wantRefusal checks a refusal: its status, its JSON error and that it
// shows nothing of either principal's conversations or any token.
func wantRefusal(t *testing.T, what string, r secResponse, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("%s: status %d, want %d (body %s)", what, r.status, status, r.body)
	}
	if len(r.body) > 0 || code != "" {
		wantError(t, r.status, r.body, status, code)
	}
	for _, secret := range []string{secAlphaText, secBetaText, secToken("alpha"), secToken("beta")} {
		if bytes.Contains(r.body, []byte(secret)) {
			t.Fatalf("%s: the refusal shows %q: %s", what, secret, r.body)
		}
	}
}

// Every route is refused without a token, with a token no agent holds (or
// one almost like an agent's), and with the other agent's token, in both
// directions; none of those requests changes either principal's journal
// or reaches its leave function. The agent's own token then passes.
func TestEveryRouteRefusesAMissingOrForeignToken(t *testing.T) {
	served := servedRoutes(t)
	for pattern := range served {
		if _, ok := securityMatrix[pattern]; !ok {
			t.Errorf("route %q is served but has no entry in the security matrix", pattern)
		}
	}
	for pattern, p := range securityMatrix {
		authed, ok := served[pattern]
		switch {
		case !ok:
			t.Errorf("the security matrix lists %q, which is not served", pattern)
		case authed == p.public:
			t.Errorf("route %q: token check wrapped = %v, want %v", pattern, authed, !p.public)
		}
	}
	if t.Failed() {
		return
	}

	fx := newSecFixture(t)
	alphaBefore, betaBefore := viewSnapshot(t, fx.alpha), viewSnapshot(t, fx.beta)
	patterns := make([]string, 0, len(securityMatrix))
	for pattern := range securityMatrix {
		patterns = append(patterns, pattern)
	}
	slices.Sort(patterns)
	for _, pattern := range patterns {
		p := securityMatrix[pattern]
		if p.public {
			continue
		}
		for _, owner := range []string{"alpha", "beta"} {
			other := map[string]string{"alpha": "beta", "beta": "alpha"}[owner]
			method, path := routePath(t, pattern, owner, p)
			methods := []string{method}
			if method == http.MethodGet {
				methods = append(methods, http.MethodHead)
			}
			for _, m := range methods {
				send := func(auth string) secResponse {
					var body io.Reader
					if p.body != "" {
						body = strings.NewReader(p.body)
					}
					return fx.call(t, m, path, auth, body, nil)
				}
				code := func(c string) string {
					if m == http.MethodHead {
						return "" // a HEAD answer has no body to hold the code
					}
					return c
				}
				what := m + " " + path
				r := send("")
				wantRefusal(t, what+" without a token", r, http.StatusUnauthorized, code("unauthorized"))
				if got := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
					t.Fatalf("%s without a token: WWW-Authenticate %q", what, got)
				}
				for _, auth := range []string{
					"Basic " + secToken(owner),
					"Bearer",
					"Bearer not-a-token",
					"Bearer " + secToken(owner)[:len(secToken(owner))-1],
					"Bearer " + secToken(owner) + "x",
					"Bearer " + strings.ToUpper(secToken(owner)),
				} {
					wantRefusal(t, what+" with "+strconv.Quote(auth), send(auth), http.StatusUnauthorized, code("unauthorized"))
				}
				wantRefusal(t, what+" with "+other+"'s token", send("Bearer "+secToken(other)), http.StatusForbidden,
					code("forbidden"))
			}
		}
	}
	if got, want := viewSnapshot(t, fx.alpha), alphaBefore; got != want {
		t.Fatalf("refused requests changed alpha's journal:\n%s\nwas\n%s", got, want)
	}
	if got, want := viewSnapshot(t, fx.beta), betaBefore; got != want {
		t.Fatalf("refused requests changed beta's journal:\n%s\nwas\n%s", got, want)
	}
	for _, agent := range []string{"alpha", "beta"} {
		if got := fx.leaves.of(agent); len(got) != 0 {
			t.Fatalf("a refused request made %s leave %v", agent, got)
		}
		if got := fx.reads[agent].asked(); len(got) != 0 {
			t.Fatalf("a refused request read %s's conversations %v", agent, got)
		}
	}

	for _, pattern := range patterns {
		p := securityMatrix[pattern]
		method, path := routePath(t, pattern, "alpha", p)
		var body io.Reader
		if p.body != "" {
			body = strings.NewReader(p.body)
		}
		auth := "Bearer " + secToken("alpha")
		if p.public {
			auth = ""
		}
		if r := fx.call(t, method, path, auth, body, nil); r.status != p.ok {
			t.Fatalf("%s with alpha's own token: status %d, want %d (body %s)", pattern, r.status, p.ok, r.body)
		}
	}
	if got, want := fx.leaves.of("alpha"), []string{secAlphaRoom}; !slices.Equal(got, want) {
		t.Fatalf("alpha left %v, want %v", got, want)
	}
	if got, want := viewSnapshot(t, fx.beta), betaBefore; got != want {
		t.Fatalf("alpha's own requests changed beta's journal:\n%s\nwas\n%s", got, want)
	}
	if got := fx.leaves.of("beta"); len(got) != 0 {
		t.Fatalf("alpha's requests made beta leave %v", got)
	}
}

// An agent's token, on its own routes, reaches only its own principal's
// copy: naming the other principal's rooms and events reads nothing of
// them and changes nothing of theirs, and answering the event both hold
// answers only its own copy.
func TestAnAgentsOwnRoutesNeverReachAnotherPrincipalsData(t *testing.T) {
	fx := newSecFixture(t)
	betaBefore := viewSnapshot(t, fx.beta)
	auth := "Bearer " + secToken("alpha")
	base := "/v1/agents/alpha"
	noBetaData := func(what string, r secResponse) {
		t.Helper()
		if bytes.Contains(r.body, []byte(secBetaText)) || bytes.Contains(r.body, []byte("$b1")) ||
			bytes.Contains(r.body, []byte("$b2")) {
			t.Fatalf("%s shows beta's data: %s", what, r.body)
		}
	}

	for _, path := range []string{
		base + "/rooms/" + secBetaRoom + "/messages",
		base + "/rooms/" + secBetaRoom + "/messages?thread=$b1",
		base + "/rooms/" + secBetaRoom + "/export",
		base + "/rooms/" + secBetaRoom + "/export?format=markdown",
		base + "/pending",
		base + "/pending?limit=1000",
	} {
		r := fx.call(t, http.MethodGet, path, auth, nil, nil)
		if r.status != http.StatusOK {
			t.Fatalf("GET %s: status %d (body %s)", path, r.status, r.body)
		}
		noBetaData("GET "+path, r)
	}
	// The stream's backlog is alpha's four events, in alpha's receipt
	// order; beta's were admitted between them, so a leak would show among
	// the first four.
	resp := (&fixture{srv: fx.srv}).send(t, http.MethodGet, base+"/pending/stream", secToken("alpha"), nil, nil)
	defer resp.Body.Close()
	sse := bufio.NewReader(resp.Body)
	var streamed []string
	for range 4 {
		ev := readSSE(t, sse)
		noBetaData("the pending stream", secResponse{body: []byte(ev.data)})
		streamed = append(streamed, decode[pendingItem](t, []byte(ev.data)).EventID)
	}
	if want := []string{"$a1", "$a2", "$a3", "$s1"}; !slices.Equal(streamed, want) {
		t.Fatalf("the stream's backlog = %v, want %v", streamed, want)
	}

	for _, req := range []struct{ path, body string }{
		{base + "/events/$b1/reply", `{"body":"stolen answer"}`},
		{base + "/events/$b1/reply", `{"body":"stolen answer","room_id":"` + secBetaRoom + `"}`},
		{base + "/events/$b2/reply", `{"body":"stolen placeholder","placeholder":true}`},
		{base + "/events/$b1/ignore", ""},
	} {
		r := fx.call(t, http.MethodPost, req.path, auth, strings.NewReader(req.body), nil)
		wantRefusal(t, "POST "+req.path, r, http.StatusNotFound, "not_found")
	}

	// The shared event: alpha answers its own copy; beta's stays pending,
	// unanswered and with nothing queued.
	if r := fx.call(t, http.MethodPost, base+"/events/$s1/reply", auth, strings.NewReader(`{"body":"alpha's answer"}`), nil); r.status != http.StatusOK {
		t.Fatalf("alpha's reply to its copy of $s1: %d %s", r.status, r.body)
	}
	if r := fx.call(t, http.MethodPost, base+"/rooms/"+secBetaRoom+"/leave", auth, nil, nil); r.status != http.StatusOK {
		t.Fatalf("alpha's leave: %d %s", r.status, r.body)
	}
	if got, want := fx.leaves.of("alpha"), []string{secBetaRoom}; !slices.Equal(got, want) {
		t.Fatalf("alpha's leave function got %v, want %v", got, want)
	}
	if got := fx.leaves.of("beta"); len(got) != 0 {
		t.Fatalf("alpha's token made beta leave %v", got)
	}
	if got := viewSnapshot(t, fx.beta); got != betaBefore {
		t.Fatalf("alpha's token changed beta's journal:\n%s\nwas\n%s", got, betaBefore)
	}
	if _, ok, err := fx.alpha.TurnForEvent(context.Background(), "$s1"); err != nil || !ok {
		t.Fatalf("alpha's own answer to $s1 was not recorded: %v %v", ok, err)
	}
}

// A token's comparison must not end early at the first differing byte, or
// the answer's timing tells an attacker how much of a guess was right. The
// check is on the source: no == or != on a token (except against ""), no
// byte or string equality helpers, no switch or map lookup keyed by one,
// and the token check itself calls subtle.ConstantTimeCompare. It proves
// how the comparison is written, not how long it takes.
func TestTokensAreComparedOnlyInConstantTime(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	constantTime := false
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range tokenComparisons(fset, f) {
			t.Errorf("%s", v)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "authed" && callsConstantTimeCompareOnTokens(fn) {
				constantTime = true
			}
		}
	}
	if !constantTime {
		t.Error("the token check (authed) does not compare tokens with subtle.ConstantTimeCompare")
	}
}

// The guard itself finds the comparisons it forbids.
func TestTheTokenComparisonGuardFindsAnEarlyExitComparison(t *testing.T) {
	const src = `package p
func check(token string, a struct{ Token string }, m map[string]int) bool {
	if token == "" || a.Token != "" { return false }
	_ = m[token]
	switch token { case "x": }
	if subtle.ConstantTimeCompare([]byte(token), []byte(a.Token)) == 1 { return true }
	return token == a.Token || strings.EqualFold(token, a.Token) || bytes.Equal([]byte(token), nil)
}`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(tokenComparisons(fset, f)); got != 5 {
		t.Fatalf("the guard found %d comparisons, want 5: %v", got, tokenComparisons(fset, f))
	}
}

// tokenish reports an expression that names a token: an identifier or a
// field whose name holds "token". What crypto/subtle returns is its
// verdict, not a token.
func tokenish(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.Ident:
			found = found || strings.Contains(strings.ToLower(x.Name), "token")
		case *ast.BasicLit:
			return false
		case *ast.CallExpr:
			if sel, ok := x.Fun.(*ast.SelectorExpr); ok {
				if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "subtle" {
					return false
				}
			}
		}
		return !found
	})
	return found
}

func isEmptyStringLit(e ast.Expr) bool {
	lit, ok := e.(*ast.BasicLit)
	return ok && lit.Kind == token.STRING && (lit.Value == `""` || lit.Value == "``")
}

// tokenComparisons lists the places in f that compare a token in a way
// that can stop at the first differing byte.
func tokenComparisons(fset *token.FileSet, f *ast.File) []string {
	var found []string
	report := func(n ast.Node, what string) {
		found = append(found, fmt.Sprintf("%s: %s", fset.Position(n.Pos()), what))
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.BinaryExpr:
			if (x.Op == token.EQL || x.Op == token.NEQ) && (tokenish(x.X) || tokenish(x.Y)) &&
				!isEmptyStringLit(x.X) && !isEmptyStringLit(x.Y) {
				report(x, "a token compared with "+x.Op.String())
			}
		case *ast.CallExpr:
			sel, ok := x.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			switch pkg.Name + "." + sel.Sel.Name {
			case "strings.EqualFold", "strings.Compare", "strings.HasPrefix", "bytes.Equal", "bytes.Compare",
				"bytes.EqualFold", "bytes.HasPrefix", "reflect.DeepEqual", "slices.Equal":
				if slices.ContainsFunc(x.Args, tokenish) {
					report(x, "a token compared with "+pkg.Name+"."+sel.Sel.Name)
				}
			}
		case *ast.SwitchStmt:
			if x.Tag != nil && tokenish(x.Tag) {
				report(x, "a switch on a token")
			}
		case *ast.IndexExpr:
			if tokenish(x.Index) {
				report(x, "a lookup keyed by a token")
			}
		}
		return true
	})
	return found
}

// callsConstantTimeCompareOnTokens reports whether fn passes a token to
// subtle.ConstantTimeCompare.
func callsConstantTimeCompareOnTokens(fn *ast.FuncDecl) bool {
	found := false
	ast.Inspect(fn, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "ConstantTimeCompare" {
			if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "subtle" && len(call.Args) == 2 &&
				tokenish(call.Args[0]) && tokenish(call.Args[1]) {
				found = true
			}
		}
		return !found
	})
	return found
}

// secState is what a refused request must leave as it was: both
// principals' journals, the leave functions and the conversation readers.
func (fx *secFixture) state(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("%s\n--\n%s\n--\nleft %v %v\nread %v %v", viewSnapshot(t, fx.alpha), viewSnapshot(t, fx.beta),
		fx.leaves.of("alpha"), fx.leaves.of("beta"), fx.reads["alpha"].asked(), fx.reads["beta"].asked())
}

// Every path and query parameter is checked for its type and length before
// anything reads or writes: a malformed one is a 400 with the JSON error,
// and neither journal, nor a leave function, nor a conversation reader
// (in the daemon: the hydrator, which asks the homeserver) was touched.
func TestMalformedParametersAreRefusedBeforeAnythingIsTouched(t *testing.T) {
	fx := newSecFixture(t)
	before := fx.state(t)
	auth := "Bearer " + secToken("alpha")
	base := "/v1/agents/alpha"
	long := strings.Repeat("x", 300)
	huge := "99999999999999999999999999"
	roomPaths := func(suffix string) []string {
		var paths []string
		for _, room := range []string{"not-a-room", "!" + long, "$looks-like-an-event", "!with%20space:x",
			"!caf%C3%A9:x", "!tab%09:x", "@user:example.org"} {
			paths = append(paths, base+"/rooms/"+room+suffix)
		}
		return paths
	}
	eventPaths := func(suffix string) []string {
		var paths []string
		for _, ev := range []string{"e1", "$" + long, "!a1:x", "$with%20space", "$%C3%A9"} {
			paths = append(paths, base+"/events/"+ev+suffix)
		}
		return paths
	}
	cases := map[string][]string{http.MethodGet: nil, http.MethodPost: nil}
	cases[http.MethodGet] = append(cases[http.MethodGet], roomPaths("/messages")...)
	cases[http.MethodGet] = append(cases[http.MethodGet], roomPaths("/export")...)
	for _, q := range []string{"thread=a1", "thread=$" + long, "thread=!r:x", "thread=$a%20b",
		"limit=0", "limit=-1", "limit=1001", "limit=1.5", "limit=1e3", "limit=0x10", "limit=+5x", "limit=" + huge, "limit=%205",
		"strict=yes", "strict=2", "strict=" + long,
		"before=not*a*cursor", "before=" + strings.Repeat("A", 8<<10)} {
		cases[http.MethodGet] = append(cases[http.MethodGet], base+"/rooms/"+secAlphaRoom+"/messages?"+q)
	}
	for _, q := range []string{"thread=a1", "thread=$" + long, "format=pdf", "format=" + long, "format=JSONL"} {
		cases[http.MethodGet] = append(cases[http.MethodGet], base+"/rooms/"+secAlphaRoom+"/export?"+q)
	}
	for _, q := range []string{"limit=0", "limit=1001", "limit=" + huge, "after=-1", "after=1.0", "after=abc",
		"after=9223372036854775808", "after=" + huge, "wait=301", "wait=1e308", "wait=-1", "wait=NaN", "wait=Inf",
		"wait=-Inf", "wait=10m", "wait=-1s", "wait=soon", "wait=" + long} {
		cases[http.MethodGet] = append(cases[http.MethodGet], base+"/pending?"+q)
	}
	for _, q := range []string{"after=-1", "after=abc", "after=" + huge, "after=9223372036854775808"} {
		cases[http.MethodGet] = append(cases[http.MethodGet], base+"/pending/stream?"+q)
	}
	cases[http.MethodPost] = append(cases[http.MethodPost], eventPaths("/reply")...)
	cases[http.MethodPost] = append(cases[http.MethodPost], eventPaths("/ignore")...)
	cases[http.MethodPost] = append(cases[http.MethodPost], roomPaths("/leave")...)

	for method, paths := range cases {
		for _, path := range paths {
			var body io.Reader
			if strings.HasSuffix(path, "/reply") {
				body = strings.NewReader(`{"body":"an answer"}`)
			}
			r := fx.call(t, method, path, auth, body, nil)
			what := method + " " + path
			if len(what) > 120 {
				what = what[:120] + "…"
			}
			wantRefusal(t, what, r, http.StatusBadRequest, "bad_request")
		}
	}
	for _, id := range []string{"-1", "abc", huge, "1.5", "9223372036854775808"} {
		r := fx.call(t, http.MethodGet, base+"/pending/stream", auth, nil, http.Header{"Last-Event-Id": {id}})
		wantRefusal(t, "the stream with Last-Event-ID "+id, r, http.StatusBadRequest, "bad_request")
	}
	if got := fx.state(t); got != before {
		t.Fatalf("refused requests changed the state:\n%s\nwas\n%s", got, before)
	}
}

// The largest numbers a parameter takes are served, not overflowed.
func TestTheLargestPositionIsAnEmptyPageNotAnError(t *testing.T) {
	fx := newSecFixture(t)
	auth := "Bearer " + secToken("alpha")
	r := fx.call(t, http.MethodGet, "/v1/agents/alpha/pending?limit=1000&after=9223372036854775807", auth, nil, nil)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got := decode[pendingBody](t, r.body); len(got.Events) != 0 || got.NextAfter != 9223372036854775807 {
		t.Fatalf("page after the last position = %s", r.body)
	}
}

// A reply body of the wrong shape, with fields of the wrong type, numbers
// past any range or strings past their bound, is a 400 with the JSON
// error, and the event stays pending with nothing recorded or queued.
func TestAMistypedReplyBodyChangesNothing(t *testing.T) {
	fx := newSecFixture(t)
	before := fx.state(t)
	long := strings.Repeat("x", 300)
	for _, body := range []string{
		``, `null`, `"an answer"`, `42`, `1e999999`, `[]`, `[{"body":"a"}]`, `{`, `{"body":"a"`, `{"body":"a"}}`,
		`{"body":5}`, `{"body":1e999}`, `{"body":true}`, `{"body":null}`, `{"body":["a"]}`, `{"body":{"text":"a"}}`,
		`{"body":""}`, `{}`,
		`{"body":"a","placeholder":"true"}`, `{"body":"a","placeholder":1}`, `{"body":"a","placeholder":1e999}`,
		`{"body":"a","placeholder":[]}`,
		`{"body":"a","format":7}`, `{"body":"a","format":"html"}`, `{"body":"a","format":"` + long + `"}`,
		`{"body":"a","room_id":12345678901234567890123}`, `{"body":"a","room_id":["!r:x"]}`,
		`{"body":"a","room_id":"!` + long + `"}`, `{"body":"a","room_id":"!with space:x"}`,
		`{"body":"a","room_id":"$not-a-room"}`, `{"body":"a","room_id":"!caf\u00e9:x"}`,
		`{"body":"a","unknown":1}`, `{"body":"a"} {"body":"b"}`, `{"body":"a"} trailing`,
	} {
		r := fx.call(t, http.MethodPost, "/v1/agents/alpha/events/$a1/reply", "Bearer "+secToken("alpha"),
			strings.NewReader(body), nil)
		wantRefusal(t, "reply "+body, r, http.StatusBadRequest, "bad_request")
	}
	if got := fx.state(t); got != before {
		t.Fatalf("refused replies changed the state:\n%s\nwas\n%s", got, before)
	}
}

// endlessReader is a body of unknown length (sent chunked) that never ends
// by itself: only the server's cap can stop reading it.
type endlessReader struct{ sent, limit int }

func (r *endlessReader) Read(p []byte) (int, error) {
	if r.sent >= r.limit {
		return 0, io.EOF
	}
	n := min(len(p), r.limit-r.sent)
	for i := range n {
		p[i] = ' '
	}
	r.sent += n
	return n, nil
}

// A reply body is capped at api.MaxReplyBytes however it comes: a long
// answer, a short object followed by padding, or a chunked body with no
// length; past the cap it is a 413 with the JSON error and nothing
// changes. A body within the cap whose answer would exceed the outbox's
// own bound is a 400, and nothing changes either.
func TestAReplyBodyIsCappedHoweverItIsSent(t *testing.T) {
	fx := newSecFixture(t)
	before := fx.state(t)
	path := "/v1/agents/alpha/events/$a1/reply"
	auth := "Bearer " + secToken("alpha")
	object := `{"body":"an answer"}`
	overCap := func(prefix string) string {
		return prefix + strings.Repeat(" ", api.MaxReplyBytes+1-len(prefix))
	}
	for what, body := range map[string]io.Reader{
		"a long answer":             strings.NewReader(`{"body":"` + strings.Repeat("x", api.MaxReplyBytes) + `"}`),
		"an answer one byte over":   strings.NewReader(`{"body":"` + strings.Repeat("x", api.MaxReplyBytes-len(`{"body":""}`)+1) + `"}`),
		"padding after the object":  strings.NewReader(overCap(object)),
		"padding before the object": strings.NewReader(strings.Repeat(" ", api.MaxReplyBytes) + object),
		"a chunked body":            io.MultiReader(strings.NewReader(object), &endlessReader{limit: 4 << 20}),
		"a chunked unclosed object": io.MultiReader(strings.NewReader(`{"body":"`), &endlessReader{limit: 4 << 20}),
	} {
		r := fx.call(t, http.MethodPost, path, auth, body, nil)
		wantRefusal(t, what, r, http.StatusRequestEntityTooLarge, "payload_too_large")
	}
	if got := fx.state(t); got != before {
		t.Fatalf("oversized replies changed the state:\n%s\nwas\n%s", got, before)
	}

	// Exactly at the cap the request is read; the answer it makes is larger
	// than a delivery may be, and is refused as such.
	atCap := `{"body":"` + strings.Repeat("x", api.MaxReplyBytes-len(`{"body":""}`)) + `"}`
	if len(atCap) != api.MaxReplyBytes {
		t.Fatalf("the body is %d bytes, want %d", len(atCap), api.MaxReplyBytes)
	}
	r := fx.call(t, http.MethodPost, path, auth, strings.NewReader(atCap), nil)
	wantRefusal(t, "a body at the cap", r, http.StatusBadRequest, "bad_request")
	if got := fx.state(t); got != before {
		t.Fatalf("a reply too large to deliver changed the state:\n%s\nwas\n%s", got, before)
	}
}

// The conversation reader is asked only for a room ID: the daemon's reader
// hydrates a conversation it has not seen from the homeserver, so a path
// value that is not a room ID must be refused before it.
func TestAMalformedRoomIDNeverReachesTheConversationReader(t *testing.T) {
	fx := newSecFixture(t)
	auth := "Bearer " + secToken("alpha")
	for _, room := range []string{"not-a-room", "!" + strings.Repeat("x", 300), "!with%20space:x", "$an-event"} {
		for _, route := range []string{"/messages", "/messages?strict=true", "/export"} {
			r := fx.call(t, http.MethodGet, "/v1/agents/alpha/rooms/"+room+route, auth, nil, nil)
			wantRefusal(t, room+route, r, http.StatusBadRequest, "bad_request")
		}
	}
	if got := fx.reads["alpha"].asked(); len(got) != 0 {
		t.Fatalf("the conversation reader was asked for %q", got)
	}
}

// A JSON error never echoes the token that was refused.
func TestARefusalNeverEchoesTheTokenItRefused(t *testing.T) {
	fx := newSecFixture(t)
	guess := "guess-" + strings.Repeat("g", 40)
	for _, auth := range []string{"Bearer " + guess, "Basic " + guess, "bearer " + guess + " trailing"} {
		r := fx.call(t, http.MethodGet, "/v1/agents/alpha/pending", auth, nil, nil)
		if r.status != http.StatusUnauthorized || bytes.Contains(r.body, []byte(guess)) ||
			strings.Contains(fmt.Sprint(r.header), guess) {
			t.Fatalf("%q: %d %v %s", auth, r.status, r.header, r.body)
		}
	}
	for _, path := range []string{"/v1/agents/gamma/pending", "/v1/agents/beta/pending"} {
		r := fx.call(t, http.MethodGet, path, "Bearer "+secToken("alpha"), nil, nil)
		if r.status/100 != 4 || bytes.Contains(r.body, []byte(secToken("alpha"))) {
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
	}
}
