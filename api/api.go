// Package api is the HTTP API external agents use: they read conversations,
// take their principal's pending work (a page, a long-poll or a stream),
// answer it, ignore it, leave rooms and export conversations; they ask a
// person to approve a tool call before it runs.
//
// Every /v1 route is scoped to one agent and needs that agent's bearer
// token: a token reads and answers only its own principal's data. Errors
// are JSON, {"error":{"code":...,"message":...}}, with a matching status;
// a 200 never carries an error.
//
// Routes:
//
//	GET  /healthz                                     no token; {"status":"ok"}
//	GET  /v1/agents/{agent}/rooms/{room_id}/messages  a conversation page (thread, limit, before, strict)
//	GET  /v1/agents/{agent}/pending                   pending work (limit, after, wait: a long-poll)
//	GET  /v1/agents/{agent}/pending/stream            pending work as server-sent events (Last-Event-ID)
//	POST /v1/agents/{agent}/events/{event_id}/reply   answer an event, idempotently
//	POST /v1/agents/{agent}/events/{event_id}/ignore  settle an event unanswered
//	POST /v1/agents/{agent}/rooms/{room_id}/leave     leave a room
//	GET  /v1/agents/{agent}/rooms/{room_id}/export    a whole conversation, oldest first (jsonl, markdown)
//	POST /v1/agents/{agent}/rooms/{room_id}/send      post a message under an idempotency key
//	POST /v1/agents/{agent}/events/{event_id}/react   react to an event, once per key
//	DELETE /v1/agents/{agent}/events/{event_id}/react withdraw that reaction, once
//	PUT  /v1/agents/{agent}/rooms/{room_id}/typing    show or stop showing typing
//	GET  /v1/agents/{agent}/rooms                     the joined rooms
//	GET  /v1/agents/{agent}/rooms/{room_id}/members   a room's joined members
//	GET  /v1/agents/{agent}/media/{server}/{media_id} a file a message carries
//	GET  /v1/agents/{agent}/changes                   rooms whose conversation changed, as server-sent events
//	POST /v1/agents/{agent}/events/{event_id}/approvals           ask a person to approve a tool call
//	GET  /v1/agents/{agent}/events/{event_id}/approvals           an event's approvals
//	GET  /v1/agents/{agent}/events/{event_id}/approvals/{call_id} one approval (wait: until it is decided)
package api

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"hash/fnv"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// Defaults and bounds of the API.
const (
	// DefaultLimit is the page size of a list given no limit.
	DefaultLimit = 50
	// MaxLimit is the largest page a list may ask for.
	MaxLimit = 1000
	// MaxWait is the longest a long-poll may wait.
	MaxWait = 300 * time.Second
	// MaxReplyBytes bounds a reply request's body.
	MaxReplyBytes = 64 << 10
	// DefaultMaxStreams caps each agent's concurrent pending streams when
	// Deps gives no cap.
	DefaultMaxStreams = 64
	// DefaultStreamWriteTimeout bounds one write to a pending stream when
	// Deps gives no bound.
	DefaultStreamWriteTimeout = 30 * time.Second
	// DefaultHeartbeat spaces the comments that keep an idle stream open
	// through proxies.
	DefaultHeartbeat = 15 * time.Second
	// DefaultExportPage is the page size an export reads with.
	DefaultExportPage = journal.DefaultExportPage
)

// Agent is one agent as the API serves it.
type Agent struct {
	// Store is the agent's principal-bound view of the journal.
	Store journal.PrincipalStore
	// Token is the bearer token that authorizes this agent's routes; it must
	// differ from every other agent's. An empty token authorizes nothing.
	// It is a secret: never logged.
	Token string
	// Hints carries the store's after-commit wake-ups; long-polls and
	// streams wait on it. Required.
	Hints *hint.Bus
	// Conversation, when set, serves the agent's conversation pages and
	// exports instead of Store: a reader that hydrates a cold conversation
	// from the homeserver and answers strict reads. Nil reads the journal
	// as it stands, and a strict read pays no refresh debt.
	Conversation journal.ConversationReader
	// Leave asks the agent's principal to leave a room (fence first, then
	// the homeserver). Nil refuses leave requests.
	Leave func(ctx context.Context, roomID string) error
	// Homeserver, signed in as the agent's account, serves what is asked
	// of the homeserver directly: typing, room and member lists, files.
	// Nil answers those routes 501.
	Homeserver Homeserver
	// ApprovalKeys are the reactions an approval card asks for (zero:
	// journal.DefaultApprovalKeys). They must be the keys the principal
	// reads votes by.
	ApprovalKeys journal.ApprovalKeys
}

// approvalKeys are the reactions the agent's approval cards ask for.
func (a Agent) approvalKeys() journal.ApprovalKeys {
	if a.ApprovalKeys == (journal.ApprovalKeys{}) {
		return journal.DefaultApprovalKeys
	}
	return a.ApprovalKeys
}

// reader is what the agent's conversation pages are read through.
func (a Agent) reader() journal.ConversationReader {
	if a.Conversation != nil {
		return a.Conversation
	}
	return a.Store
}

// Deps configure New.
type Deps struct {
	// Agents are the served agents by agent name.
	Agents map[string]Agent
	// Serving, when set, is an agent as this process serves it at the
	// moment, for replicas that divide the agents between them: Agents
	// then only vouch for the tokens, and a request for an agent this
	// process does not serve goes to Elsewhere.
	Serving func(name string) (Agent, bool)
	// Elsewhere answers an authorized request for an agent Serving does
	// not have (required with Serving).
	Elsewhere http.Handler
	// Log receives the API's logs (default: discarded).
	Log zerolog.Logger
	// CursorKey authenticates conversation cursors. When empty a random key
	// is drawn, so cursors do not outlive the process.
	CursorKey []byte
	// MaxStreams caps each agent's concurrent pending streams (default
	// DefaultMaxStreams); past it a stream is refused with 503. Each agent
	// has its own cap, so one agent's clients cannot shut out another's.
	MaxStreams int
	// StreamWriteTimeout bounds each write (and flush) to a pending stream
	// (default DefaultStreamWriteTimeout): a client that stops reading is
	// disconnected rather than holding its stream, and its place under
	// the cap, forever.
	StreamWriteTimeout time.Duration
	// Heartbeat spaces stream keep-alive comments (default
	// DefaultHeartbeat).
	Heartbeat time.Duration
	// ExportPage is the page size of an export (default DefaultExportPage).
	ExportPage int
	// MaxMedia caps a file downloaded or uploaded through the API, in
	// bytes (default DefaultMaxMedia).
	MaxMedia int64
	// Now is the clock an approval's expiry is reckoned by (default
	// time.Now); it must agree with the journal's.
	Now func() time.Time
}

type server struct {
	agents    map[string]Agent
	serving   func(string) (Agent, bool)
	elsewhere http.Handler
	// deliveries serializes what one agent asks of one delivery: the check
	// for an earlier request and the enqueue of this one must not
	// interleave with another's, or two different answers (or two messages
	// under one key) could both be taken. Striped by the delivery's name,
	// so requests for different deliveries commit together.
	deliveries map[string]*deliveryLocks
	log        zerolog.Logger
	cursors    journal.CursorCodec
	// streams holds each agent's open pending streams, up to its cap.
	streams      map[string]chan struct{}
	writeTimeout time.Duration
	heartbeat    time.Duration
	exportPage   int
	maxMedia     int64
	now          func() time.Time
}

// New returns the API's handler.
func New(deps Deps) http.Handler {
	s := &server{
		agents:     deps.Agents,
		serving:    deps.Serving,
		elsewhere:  deps.Elsewhere,
		log:        deps.Log,
		cursors:    journal.CursorCodec{Key: deps.CursorKey},
		heartbeat:  deps.Heartbeat,
		exportPage: deps.ExportPage,
		maxMedia:   deps.MaxMedia,
		now:        deps.Now,
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.maxMedia <= 0 {
		s.maxMedia = DefaultMaxMedia
	}
	s.deliveries = make(map[string]*deliveryLocks, len(s.agents))
	for name := range s.agents {
		s.deliveries[name] = new(deliveryLocks)
	}
	if len(s.cursors.Key) == 0 {
		s.cursors.Key = make([]byte, 32)
		_, _ = rand.Read(s.cursors.Key) // never fails: see crypto/rand.Read
	}
	if deps.MaxStreams <= 0 {
		deps.MaxStreams = DefaultMaxStreams
	}
	s.streams = make(map[string]chan struct{}, len(s.agents))
	for name := range s.agents {
		s.streams[name] = make(chan struct{}, deps.MaxStreams)
	}
	s.writeTimeout = deps.StreamWriteTimeout
	if s.writeTimeout <= 0 {
		s.writeTimeout = DefaultStreamWriteTimeout
	}
	if s.heartbeat <= 0 {
		s.heartbeat = DefaultHeartbeat
	}
	if s.exportPage <= 0 {
		s.exportPage = DefaultExportPage
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /v1/agents/{agent}/rooms/{room_id}/messages", s.authed(s.messages))
	mux.HandleFunc("GET /v1/agents/{agent}/pending", s.authed(s.pending))
	mux.HandleFunc("GET /v1/agents/{agent}/pending/stream", s.authed(s.stream))
	mux.HandleFunc("POST /v1/agents/{agent}/events/{event_id}/reply", s.authed(s.reply))
	mux.HandleFunc("POST /v1/agents/{agent}/events/{event_id}/ignore", s.authed(s.ignore))
	mux.HandleFunc("POST /v1/agents/{agent}/rooms/{room_id}/leave", s.authed(s.leave))
	mux.HandleFunc("GET /v1/agents/{agent}/rooms/{room_id}/export", s.authed(s.export))
	mux.HandleFunc("POST /v1/agents/{agent}/rooms/{room_id}/send", s.authed(s.send))
	mux.HandleFunc("POST /v1/agents/{agent}/events/{event_id}/react", s.authed(s.react))
	mux.HandleFunc("DELETE /v1/agents/{agent}/events/{event_id}/react", s.authed(s.unreact))
	mux.HandleFunc("PUT /v1/agents/{agent}/rooms/{room_id}/typing", s.authed(s.typing))
	mux.HandleFunc("GET /v1/agents/{agent}/rooms", s.authed(s.rooms))
	mux.HandleFunc("GET /v1/agents/{agent}/rooms/{room_id}/members", s.authed(s.members))
	mux.HandleFunc("GET /v1/agents/{agent}/media/{server}/{media_id}", s.authed(s.media))
	mux.HandleFunc("GET /v1/agents/{agent}/changes", s.authed(s.changes))
	mux.HandleFunc("POST /v1/agents/{agent}/events/{event_id}/approvals", s.authed(s.requestApproval))
	mux.HandleFunc("GET /v1/agents/{agent}/events/{event_id}/approvals", s.authed(s.listApprovals))
	mux.HandleFunc("GET /v1/agents/{agent}/events/{event_id}/approvals/{call_id}", s.authed(s.approval))
	// The mux's own 404 and 405 are plain text; every answer of this API is
	// JSON, so they are caught and spelled as JSON.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		rec := &statusRecorder{header: make(http.Header)}
		h.ServeHTTP(rec, r)
		if allow := rec.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		if rec.status == http.StatusMethodNotAllowed {
			writeError(w, rec.status, codeMethodNotAllowed, "method not allowed")
			return
		}
		writeError(w, http.StatusNotFound, codeNotFound, "no such route")
	})
}

// deliveryLocks are one agent's delivery locks, by stripe.
type deliveryLocks [64]sync.Mutex

// lock takes agent's lock of the delivery (or event) named id and returns
// its release.
func (s *server) lock(agent, id string) func() {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	mu := &s.deliveries[agent][h.Sum32()%uint32(len(deliveryLocks{}))]
	mu.Lock()
	return mu.Unlock
}

// statusRecorder keeps the status and headers of the mux's own answers.
type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header         { return r.header }
func (r *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *statusRecorder) WriteHeader(status int)      { r.status = status }

// agentHandler serves one authorized agent's request.
type agentHandler func(w http.ResponseWriter, r *http.Request, name string, a Agent)

// authed checks the bearer token before h runs: no token, or one no agent
// holds, is 401; an unknown agent is 404; another agent's token is 403.
// Every agent's token is compared, in constant time, so the answer's timing
// does not tell which agent's token was close.
func (s *server) authed(h agentHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearer(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mindroomd"`)
			writeError(w, http.StatusUnauthorized, codeUnauthorized, "a bearer token is required")
			return
		}
		holder := ""
		for name, a := range s.agents {
			if a.Token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(a.Token)) == 1 {
				holder = name
			}
		}
		if holder == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mindroomd", error="invalid_token"`)
			writeError(w, http.StatusUnauthorized, codeUnauthorized, "the bearer token is not valid")
			return
		}
		name := r.PathValue("agent")
		a, ok := s.agents[name]
		if !ok {
			writeError(w, http.StatusNotFound, codeNotFound, "no such agent")
			return
		}
		if holder != name {
			writeError(w, http.StatusForbidden, codeForbidden, "the token belongs to another agent")
			return
		}
		if s.serving != nil {
			if a, ok = s.serving(name); !ok {
				s.elsewhere.ServeHTTP(w, r)
				return
			}
		}
		h(w, r, name, a)
	}
}

func bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// Error codes of the JSON error body.
const (
	codeBadRequest       = "bad_request"
	codeUnauthorized     = "unauthorized"
	codeForbidden        = "forbidden"
	codeNotFound         = "not_found"
	codeConflict         = "conflict"
	codeTooLarge         = "payload_too_large"
	codeUnavailable      = "unavailable"
	codeStrictRead       = "strict_read_failed"
	codeInternal         = "internal"
	codeNotImplemented   = "not_implemented"
	codeMethodNotAllowed = "method_not_allowed"
)

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	var b errorBody
	b.Error.Code, b.Error.Message = code, message
	writeJSON(w, status, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client went away: nothing to tell it
}

// fail answers a store error: a caller's mistake is 400, a closed store
// 503, anything else 500 with the cause logged and not shown.
func (s *server) fail(w http.ResponseWriter, r *http.Request, agent string, err error) {
	switch {
	case errors.Is(err, journal.ErrInvalidArgument), errors.Is(err, journal.ErrBadCursor),
		errors.Is(err, journal.ErrCursorConversation):
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
	case errors.Is(err, journal.ErrStrictRead):
		// The homeserver could not complete the conversation; the client
		// may retry, or read without strict.
		writeError(w, http.StatusServiceUnavailable, codeStrictRead, err.Error())
	case errors.Is(err, journal.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, codeUnavailable, "the journal is closed")
	case r.Context().Err() != nil:
		// The client is gone; nobody reads an answer.
	default:
		s.log.Error().Err(err).Str("agent", agent).Str("method", r.Method).Str("path", r.URL.Path).
			Msg("API request failed")
		writeError(w, http.StatusInternalServerError, codeInternal, "internal error")
	}
}
