package mcpserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"
)

// scheme starts every conversation URI.
const scheme = "matrix://"

// The conversation templates.
const (
	roomTemplate   = "matrix://{agent}/{room}"
	threadTemplate = "matrix://{agent}/{room}/{thread}"
)

// ConversationURI is the resource URI of a room's conversation, or of a
// thread in it when thread is not empty: matrix://{agent}/{room}[/{thread}],
// each segment percent-encoded (every byte but A-Z a-z 0-9 - . _ ~).
func ConversationURI(agent, room, thread string) string {
	uri := scheme + escape(agent) + "/" + escape(room)
	if thread != "" {
		uri += "/" + escape(thread)
	}
	return uri
}

// escape percent-encodes every byte but RFC 3986's unreserved ones: a
// URI template's simple variable matches nothing else, and Matrix IDs hold
// ! $ : and may hold a slash.
func escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// conversation is what a conversation URI names.
type conversation struct {
	agent, room, thread string
}

// parseConversation reads a conversation URI.
func parseConversation(uri string) (conversation, error) {
	rest, ok := strings.CutPrefix(uri, scheme)
	if !ok {
		return conversation{}, fmt.Errorf("%q is not a matrix:// URI", uri)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 2 && len(parts) != 3 {
		return conversation{}, fmt.Errorf("%q is not matrix://{agent}/{room} or matrix://{agent}/{room}/{thread}", uri)
	}
	var segs [3]string
	for i, p := range parts {
		s, err := url.PathUnescape(p)
		if err != nil || s == "" {
			return conversation{}, fmt.Errorf("%q: segment %d is empty or badly percent-encoded", uri, i+1)
		}
		segs[i] = s
	}
	return conversation{agent: segs[0], room: segs[1], thread: segs[2]}, nil
}

// addResources adds the conversation templates to srv.
func addResources(srv *mcp.Server, c *client) {
	read := func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		uri := req.Params.URI
		conv, err := parseConversation(uri)
		if err != nil || conv.agent != c.agent {
			return nil, mcp.ResourceNotFoundError(uri)
		}
		page, aerr := c.messages(callerContext(ctx, req.Extra), messagesQuery{room: conv.room, thread: conv.thread})
		switch {
		case aerr == nil:
		case aerr.Code == "bad_request" || aerr.Code == "not_found":
			// A room or thread ID the API refuses names no conversation.
			return nil, mcp.ResourceNotFoundError(uri)
		default:
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: aerr.Error()}
		}
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{
			{URI: uri, MIMEType: "application/json", Text: string(page)},
		}}, nil
	}
	srv.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:  "room",
		Title: "A room's conversation",
		Description: "The newest page of a room's conversation (the read_conversation answer). Percent-encode the " +
			"room ID: !r:example.org is %21r%3Aexample.org. Subscribe to be told when the room changes.",
		URITemplate: roomTemplate,
		MIMEType:    "application/json",
	}, read)
	srv.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:  "thread",
		Title: "A thread's conversation",
		Description: "The newest page of a thread (the read_conversation answer with thread). Percent-encode the " +
			"IDs: $root is %24root. Subscribe to be told when its room changes.",
		URITemplate: threadTemplate,
		MIMEType:    "application/json",
	}, read)
}

// The change stream's reconnection backoff and idle bound. The API sends a
// keep-alive every 15 s, so a stream silent for three of them is dead (a
// half-open connection would otherwise hang it forever).
const (
	changesRetryBase = time.Second
	changesRetryMax  = 30 * time.Second
	changesIdle      = 45 * time.Second
	maxSSELine       = 1 << 20
	// openWait bounds how long a subscription waits for the stream to open.
	openWait = 5 * time.Second
)

// errIdle ends a change stream silent past changesIdle.
var errIdle = fmt.Errorf("no keep-alive on the change stream for %s", changesIdle)

// watcher follows the agent's change stream while any client is
// subscribed to a conversation, and tells the subscribers of a room's
// URIs when the room changes.
type watcher struct {
	c   *client
	srv *mcp.Server
	log zerolog.Logger

	mu sync.Mutex
	// subs are each session's subscribed URIs.
	subs map[*mcp.ServerSession]map[string]struct{}
	// waiting are the sessions whose end is awaited, to drop their
	// subscriptions then.
	waiting map[*mcp.ServerSession]struct{}
	// stop ends the stream's goroutine; nil when none runs. started closes
	// when its first connection opened or failed.
	stop    context.CancelFunc
	started chan struct{}
}

// subscribe records a subscription and starts the stream if none runs. The
// token it runs with is the subscriber's (inside the daemon) or the
// server's own.
func (w *watcher) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	uri := req.Params.URI
	conv, err := parseConversation(uri)
	if err != nil || conv.agent != w.c.agent {
		return mcp.ResourceNotFoundError(uri)
	}
	w.mu.Lock()
	set, known := w.subs[req.Session]
	if !known {
		set = make(map[string]struct{})
		w.subs[req.Session] = set
	}
	set[uri] = struct{}{}
	if _, ok := w.waiting[req.Session]; !ok && req.Session != nil {
		// A session that ends without unsubscribing (a client gone, an
		// HTTP session timed out) must not keep the stream open.
		w.waiting[req.Session] = struct{}{}
		go func(ss *mcp.ServerSession) {
			_ = ss.Wait()
			w.mu.Lock()
			delete(w.waiting, ss)
			w.mu.Unlock()
			w.drop(ss, "")
		}(req.Session)
	}
	if w.stop == nil {
		// Not the request's context: the stream outlives the request.
		sctx, stop := context.WithCancel(withToken(context.Background(), w.c.tokenFor(callerContext(ctx, req.Extra))))
		w.stop, w.started = stop, make(chan struct{})
		go w.run(sctx, w.started)
	}
	started := w.started
	w.mu.Unlock()
	// The subscription answers once the stream's first connection is open
	// (or failed), so a change the client makes or sees after it is not
	// missed; a stream that opens later tells every subscriber to read
	// again. The wait is bounded: a slow API does not hold the client.
	t := time.NewTimer(openWait)
	defer t.Stop()
	select {
	case <-started:
	case <-t.C:
	case <-ctx.Done():
	}
	return nil
}

// unsubscribe forgets a subscription.
func (w *watcher) unsubscribe(_ context.Context, req *mcp.UnsubscribeRequest) error {
	w.drop(req.Session, req.Params.URI)
	return nil
}

// drop forgets one URI of a session, or all of them when uri is empty, and
// stops the stream when no subscription is left.
func (w *watcher) drop(ss *mcp.ServerSession, uri string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if set, ok := w.subs[ss]; ok {
		delete(set, uri)
		if uri == "" || len(set) == 0 {
			delete(w.subs, ss)
		}
	}
	if len(w.subs) == 0 && w.stop != nil {
		w.stop()
		w.stop = nil
	}
}

// subscribed lists the subscribed URIs of a room, or all of them when
// room is empty, each once.
func (w *watcher) subscribed(room string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := make(map[string]struct{})
	var uris []string
	for _, set := range w.subs {
		for uri := range set {
			if _, dup := seen[uri]; dup {
				continue
			}
			conv, err := parseConversation(uri)
			if err == nil && (room == "" || conv.room == room) {
				seen[uri] = struct{}{}
				uris = append(uris, uri)
			}
		}
	}
	return uris
}

// notify sends resources/updated for each URI.
func (w *watcher) notify(ctx context.Context, uris []string) {
	for _, uri := range uris {
		if err := w.srv.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: uri}); err != nil {
			w.log.Warn().Err(err).Str("uri", uri).Msg("Telling subscribers of a change failed")
		}
	}
}

// run follows the change stream until ctx ends, reconnecting with
// exponential backoff and jitter when it drops or is refused. It closes
// started when the first connection opened or failed.
func (w *watcher) run(ctx context.Context, started chan struct{}) {
	signal := func() {
		if started != nil {
			close(started)
			started = nil
		}
	}
	defer signal()
	for failures, attempts := 0, 0; ctx.Err() == nil; attempts++ {
		// After the first attempt a change may have come while no stream
		// was open: every subscriber is told to read again, once.
		opened, err := w.follow(ctx, attempts > 0, signal)
		signal()
		if ctx.Err() != nil {
			return
		}
		if opened {
			failures = 0
		}
		failures++
		delay := min(changesRetryBase<<min(failures-1, 16), changesRetryMax)
		delay = delay/2 + rand.N(delay/2+1)
		ev := w.log.Warn()
		if opened {
			ev = w.log.Info()
		}
		ev.Err(err).Int("failures", failures).Dur("retry_in", delay).Msg("The change stream ended; reconnecting")
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// follow reads one connection of the change stream, telling subscribers
// of each change, until it ends; with reopened, it first tells every
// subscriber. opened reports that the API accepted it, and onOpen runs
// then.
func (w *watcher) follow(ctx context.Context, reopened bool, onOpen func()) (opened bool, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	resp, aerr := w.c.changes(ctx)
	if aerr != nil {
		return false, aerr
	}
	defer resp.Body.Close()
	onOpen()
	if reopened {
		w.notify(ctx, w.subscribed(""))
	}

	idle := time.AfterFunc(changesIdle, func() { cancel(errIdle) })
	defer idle.Stop()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), maxSSELine)
	var event string
	var data strings.Builder
	for sc.Scan() {
		idle.Reset(changesIdle)
		line := sc.Text()
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch {
		case line == "":
			switch event {
			case "change":
				w.change(ctx, data.String())
			case "resync":
				// Changes may have been missed: any room may have changed.
				w.notify(ctx, w.subscribed(""))
			}
			event = ""
			data.Reset()
		case field == "":
			// A comment: the keep-alive.
		case field == "event":
			event = value
		case field == "data":
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(value)
		}
	}
	if cause := context.Cause(ctx); errors.Is(cause, errIdle) {
		return true, cause
	}
	if err := sc.Err(); err != nil {
		return true, err
	}
	return true, errors.New("the API closed the change stream")
}

// change tells the subscribers of the changed room.
func (w *watcher) change(ctx context.Context, data string) {
	var ch struct {
		RoomID string `json:"room_id"`
	}
	if err := json.Unmarshal([]byte(data), &ch); err != nil || ch.RoomID == "" {
		w.log.Warn().Err(err).Msg("A change event without a room was skipped")
		return
	}
	w.notify(ctx, w.subscribed(ch.RoomID))
}
