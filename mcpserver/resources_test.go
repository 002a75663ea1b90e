package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/mcpserver"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

func TestMCPConversationURIsArePercentEncoded(t *testing.T) {
	for _, tc := range []struct{ agent, room, thread, want string }{
		{"alpha", "!r:example.org", "", "matrix://alpha/%21r%3Aexample.org"},
		{"alpha", "!r:example.org", "$root", "matrix://alpha/%21r%3Aexample.org/%24root"},
		{"my-agent", "!a/b:hs", "$x~y_z.w", "matrix://my-agent/%21a%2Fb%3Ahs/%24x~y_z.w"},
	} {
		if got := mcpserver.ConversationURI(tc.agent, tc.room, tc.thread); got != tc.want {
			t.Errorf("ConversationURI(%q, %q, %q) = %q, want %q", tc.agent, tc.room, tc.thread, got, tc.want)
		}
	}
}

func TestMCPResourcesReadTheNewestPageOfARoomOrThread(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$root", alice, 1000, "root"), mx.Message("$e2", alice, 1001, "in the room"),
		mx.ThreadReply("$t1", alice, 1002, "$root", "in the thread"))
	cs := fx.overNetwork(t)
	ctx := context.Background()
	templates, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tmpl := range templates.ResourceTemplates {
		got = append(got, tmpl.URITemplate)
		if tmpl.MIMEType != "application/json" || tmpl.Description == "" {
			t.Errorf("template %+v", tmpl)
		}
	}
	if want := []string{"matrix://{agent}/{room}", "matrix://{agent}/{room}/{thread}"}; !slices.Equal(slices.Sorted(slices.Values(got)), want) {
		t.Fatalf("templates = %v, want %v", got, want)
	}
	read := func(uri string) messagesOut {
		t.Helper()
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatalf("read %s: %v", uri, err)
		}
		if len(res.Contents) != 1 || res.Contents[0].MIMEType != "application/json" || res.Contents[0].URI != uri {
			t.Fatalf("read %s: %+v", uri, res.Contents)
		}
		var page messagesOut
		if err := json.Unmarshal([]byte(res.Contents[0].Text), &page); err != nil {
			t.Fatalf("read %s: %v", uri, err)
		}
		return page
	}
	ids := func(p messagesOut) []string {
		var ids []string
		for _, m := range p.Messages {
			ids = append(ids, m.EventID)
		}
		return ids
	}
	if got := ids(read(mcpserver.ConversationURI("alpha", room, ""))); !slices.Equal(got, []string{"$root", "$e2"}) {
		t.Fatalf("room page = %v", got)
	}
	if got := ids(read(mcpserver.ConversationURI("alpha", room, "$root"))); !slices.Equal(got, []string{"$root", "$t1"}) {
		t.Fatalf("thread page = %v", got)
	}
	for _, uri := range []string{
		mcpserver.ConversationURI("beta", room, ""), // another agent's
		"matrix://alpha/" + room,                    // not percent-encoded
		"matrix://alpha/not-a-room",
		"matrix://alpha",
	} {
		if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err == nil {
			t.Errorf("read %s: no error", uri)
		}
	}
}

// changeFeed stands in for the agent API's GET /v1/agents/{agent}/changes
// in front of the real API: each string sent on events goes out as a
// change of that room ("" as a resync); dropAll ends the connections.
type changeFeed struct {
	api    http.Handler
	events chan string
	mu     sync.Mutex
	opened int
	open   int
	tokens []string
	drop   chan struct{}
}

func newChangeFeed(api http.Handler) *changeFeed {
	return &changeFeed{api: api, events: make(chan string), drop: make(chan struct{})}
}

func (f *changeFeed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/agents/alpha/changes" {
		f.api.ServeHTTP(w, r)
		return
	}
	f.mu.Lock()
	f.opened++
	f.open++
	f.tokens = append(f.tokens, r.Header.Get("Authorization"))
	drop := f.drop
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.open--
		f.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	for pos := 1; ; pos++ {
		select {
		case roomID := <-f.events:
			line := fmt.Sprintf("event: change\ndata: {\"room_id\":%q,\"position\":%d}\n\n", roomID, pos)
			if roomID == "" {
				line = "event: resync\ndata: {}\n\n"
			}
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"+line); err != nil {
				return
			}
			_ = rc.Flush()
		case <-drop:
			return
		case <-r.Context().Done():
			return
		}
	}
}

func (f *changeFeed) counts() (opened, open int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opened, f.open
}

// dropAll ends the open connections.
func (f *changeFeed) dropAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.drop)
	f.drop = make(chan struct{})
}

// updates records the resources/updated notifications a client receives.
type updates struct {
	mu   sync.Mutex
	uris []string
}

func (u *updates) handler(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.uris = append(u.uris, req.Params.URI)
}

// snapshot counts the notifications of each URI.
func (u *updates) snapshot() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := make(map[string]int)
	for _, uri := range u.uris {
		n[uri]++
	}
	return n
}

// settled is the snapshot once no notification came for 200 ms.
func (u *updates) settled() map[string]int {
	prev := u.snapshot()
	for {
		time.Sleep(200 * time.Millisecond)
		now := u.snapshot()
		if maps.Equal(now, prev) {
			return now
		}
		prev = now
	}
}

func (u *updates) count(uri string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, got := range u.uris {
		if got == uri {
			n++
		}
	}
	return n
}

func TestMCPSubscribersOfARoomAreToldOfItsChanges(t *testing.T) {
	for _, protocol := range []string{"", "2025-11-25"} {
		name := protocol
		if name == "" {
			name = "latest"
		}
		t.Run(name, func(t *testing.T) {
			fx := newFixture(t)
			feed := newChangeFeed(fx.api)
			var got updates
			server := mcpserver.New(mcpserver.Options{Agent: "alpha", Handler: feed, Token: alphaToken, Log: zerolog.Nop()})
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			ct, st := mcp.NewInMemoryTransports()
			ss, err := server.Connect(ctx, st, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ss.Close()
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"},
				&mcp.ClientOptions{ResourceUpdatedHandler: got.handler}).Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: protocol})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			if res := cs.InitializeResult(); res.Capabilities.Resources == nil || !res.Capabilities.Resources.Subscribe {
				t.Fatalf("capabilities %+v", res.Capabilities)
			}
			roomURI := mcpserver.ConversationURI("alpha", room, "")
			threadURI := mcpserver.ConversationURI("alpha", room, "$root")
			otherURI := mcpserver.ConversationURI("alpha", otherRoom, "")
			for _, uri := range []string{roomURI, threadURI, otherURI} {
				if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
					t.Fatalf("subscribe %s: %v", uri, err)
				}
			}
			waitFor(t, "the change stream to open", func() bool { opened, _ := feed.counts(); return opened == 1 })
			// Under the latest protocol each subscription is made
			// asynchronously: resyncs go out until all three are in
			// place, then the counts settle.
			all := func() bool { return got.count(roomURI) > 0 && got.count(threadURI) > 0 && got.count(otherURI) > 0 }
			for deadline := time.Now().Add(testTimeout); !all(); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the subscriptions never all took: %v", got.snapshot())
				}
				feed.events <- ""
			}
			base := got.settled()
			told := func(uri string) int { return got.count(uri) - base[uri] }

			feed.events <- room
			waitFor(t, "the room's subscribers to be told", func() bool { return told(roomURI) == 1 && told(threadURI) == 1 })
			feed.events <- otherRoom
			waitFor(t, "the other room's subscriber to be told", func() bool { return told(otherURI) == 1 })
			if told(roomURI) != 1 || told(threadURI) != 1 {
				t.Fatalf("notifications %v", got.uris)
			}
			if opened, _ := feed.counts(); opened != 1 || feed.tokens[0] != "Bearer "+alphaToken {
				t.Fatalf("%d streams opened with %v, want one with the agent's token", opened, feed.tokens)
			}

			// A dropped stream is opened again, and every subscriber is
			// told to read again: a change may have come meanwhile.
			feed.dropAll()
			waitFor(t, "the stream to be opened again", func() bool { opened, open := feed.counts(); return opened == 2 && open == 1 })
			waitFor(t, "every subscriber to be told after the gap", func() bool {
				return told(roomURI) == 2 && told(threadURI) == 2 && told(otherURI) == 2
			})
			feed.events <- otherRoom
			waitFor(t, "a change after the reconnection", func() bool { return told(otherURI) == 3 })
			// A resync: any room may have changed.
			feed.events <- ""
			waitFor(t, "every subscriber to be told of a resync", func() bool {
				return told(roomURI) == 3 && told(threadURI) == 3 && told(otherURI) == 4
			})

			// With no subscription left the stream closes.
			for _, uri := range []string{roomURI, threadURI, otherURI} {
				if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri}); err != nil {
					t.Fatalf("unsubscribe %s: %v", uri, err)
				}
			}
			waitFor(t, "the stream to close", func() bool { _, open := feed.counts(); return open == 0 })
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "matrix://beta/" + strings.TrimPrefix(roomURI, "matrix://alpha/")}); err == nil && protocol != "" {
				t.Fatalf("subscribed to another agent's conversation")
			}
		})
	}
}

func TestMCPASessionThatEndsClosesItsChangeStream(t *testing.T) {
	fx := newFixture(t)
	feed := newChangeFeed(fx.api)
	server := mcpserver.New(mcpserver.Options{Agent: "alpha", Handler: feed, Token: alphaToken})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(ctx, ct,
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: mcpserver.ConversationURI("alpha", room, "")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the change stream to open", func() bool { _, open := feed.counts(); return open == 1 })
	// The client goes away without unsubscribing.
	_ = cs.Close()
	_ = ss.Wait()
	waitFor(t, "the stream to close", func() bool { _, open := feed.counts(); return open == 0 })
	time.Sleep(50 * time.Millisecond)
	if opened, open := feed.counts(); opened != 1 || open != 0 {
		t.Fatalf("streams opened %d, open %d after the session ended", opened, open)
	}
}

// Against the API's own change stream: a message admitted to a room tells
// the room's subscribers, over the network and in memory.
func TestMCPSubscribersAreToldOfTheJournalsChanges(t *testing.T) {
	for _, mode := range []string{"network", "memory"} {
		t.Run(mode, func(t *testing.T) {
			fx := newFixture(t)
			fx.admit(t, room, mx.Message("$q", alice, 1000, "question"))
			opts := mcpserver.Options{Agent: "alpha", API: fx.srv.URL, Token: alphaToken}
			if mode == "memory" {
				opts = mcpserver.Options{Agent: "alpha", Handler: fx.api, Token: alphaToken}
			}
			var got updates
			cs := connect(t, opts, &mcp.ClientOptions{ResourceUpdatedHandler: got.handler})
			ctx := context.Background()
			roomURI := mcpserver.ConversationURI("alpha", room, "")
			otherURI := mcpserver.ConversationURI("alpha", otherRoom, "")
			for _, uri := range []string{roomURI, otherURI} {
				if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "the change stream to open", func() bool { return fx.called("/v1/agents/alpha/changes") })
			// Under the latest protocol a subscription is asynchronous:
			// admit until told.
			for i := 0; got.count(roomURI) == 0; i++ {
				if i == 200 {
					t.Fatal("no notification of the room's change")
				}
				fx.admit(t, room, mx.Message(fmt.Sprintf("$m%d", i), alice, int64(2000+i), "more"))
				time.Sleep(50 * time.Millisecond)
			}
			if got.count(otherURI) != 0 {
				t.Fatalf("the other room's subscriber was told: %v", got.uris)
			}
		})
	}
}
