package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// maxResponseBytes bounds an answer of the agent API the client reads
// whole: a page of 1000 long messages stays well below it, and a broken or
// hostile server cannot make the process hold an unbounded body.
const maxResponseBytes = 64 << 20

// inProcessBase is the base URL of an API served in memory: the host is
// never resolved, only the path reaches the handler.
const inProcessBase = "http://mindroomd.in-process"

// apiError is a refusal of the agent API, or a failure to reach it, as a
// tool reports it: the API's own code and message, and the HTTP status
// (0 when no answer came).
type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Status  int    `json:"status"`
}

// Error spells the refusal as the tool's text starts: "conflict: ...".
func (e *apiError) Error() string { return e.Code + ": " + e.Message }

// badRequest is a refusal made here, before the API is asked.
func badRequest(message string) *apiError {
	return &apiError{Code: "bad_request", Message: message, Status: http.StatusBadRequest}
}

// client calls one agent's routes of the agent API. Every MCP tool is one
// call through it, whichever way the API is reached: over the network
// (mindroomd mcp) or in memory inside the daemon (/v1/agents/{agent}/mcp).
type client struct {
	base  string // no trailing slash
	agent string
	// token is the agent's bearer token. Inside the daemon it is empty, and
	// each call carries the token its MCP request came with (withToken).
	token string
	http  *http.Client
}

// tokenKey carries the bearer token of the MCP request a call serves.
type tokenKey struct{}

// withToken returns ctx carrying the bearer token calls made under it use
// instead of the client's own.
func withToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return context.WithValue(ctx, tokenKey{}, token)
}

// bearerToken is the token of an Authorization header, or "".
func bearerToken(h http.Header) string {
	scheme, token, ok := strings.Cut(h.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// tokenFor is the bearer token a call under ctx sends.
func (c *client) tokenFor(ctx context.Context) string {
	if t, ok := ctx.Value(tokenKey{}).(string); ok && t != "" {
		return t
	}
	return c.token
}

// agentPath is the path of one of the agent's routes; each segment is
// escaped on its own, since a room ID may hold a slash.
func (c *client) agentPath(segments ...string) string {
	var b strings.Builder
	b.WriteString("/v1/agents/")
	b.WriteString(url.PathEscape(c.agent))
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}

// request builds a call of the agent's API with its token.
func (c *client) request(ctx context.Context, method, path string, query url.Values, body any) (*http.Request, error) {
	target := c.base + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	var rd io.Reader = http.NoBody
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if t := c.tokenFor(ctx); t != "" {
		req.Header.Set("Authorization", "Bearer "+t)
	}
	return req, nil
}

// call sends one request and returns the body of a 200; anything else is
// an *apiError. The token is never part of an error.
func (c *client) call(ctx context.Context, method, path string, query url.Values, header http.Header, body any) (json.RawMessage, *apiError) {
	req, err := c.request(ctx, method, path, query, body)
	if err != nil {
		return nil, &apiError{Code: "internal", Message: "building the API request: " + err.Error()}
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, unreachable(ctx, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	switch {
	case err != nil:
		return nil, unreachable(ctx, err)
	case len(b) > maxResponseBytes:
		return nil, &apiError{Code: "internal", Message: "the agent API's answer is larger than 64 MiB", Status: resp.StatusCode}
	case resp.StatusCode != http.StatusOK:
		return nil, refusal(resp.StatusCode, b)
	case !json.Valid(b):
		return nil, &apiError{Code: "internal", Message: "the agent API answered 200 with a body that is not JSON", Status: resp.StatusCode}
	}
	return bytes.TrimSpace(b), nil
}

// unreachable is the error of a call that got no whole answer.
func unreachable(ctx context.Context, err error) *apiError {
	if ctx.Err() != nil {
		return &apiError{Code: "cancelled", Message: "the request was cancelled: " + ctx.Err().Error()}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		// The url.Error names the whole URL; the reason is what helps.
		err = ue.Err
	}
	return &apiError{Code: "unavailable", Message: "cannot reach the agent API: " + err.Error()}
}

// refusal reads the API's JSON error body; a body that is not one (a proxy's
// page) is named by its status.
func refusal(status int, body []byte) *apiError {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Code != "" {
		return &apiError{Code: e.Error.Code, Message: e.Error.Message, Status: status}
	}
	return &apiError{Code: statusCode(status), Message: "the agent API answered " + http.StatusText(status), Status: status}
}

// statusCode names a status the way the API's error codes do.
func statusCode(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "bad_request"
	case http.StatusUnauthorized:
		return "unauthorized"
	case http.StatusForbidden:
		return "forbidden"
	case http.StatusNotFound:
		return "not_found"
	case http.StatusMethodNotAllowed:
		return "method_not_allowed"
	case http.StatusConflict:
		return "conflict"
	case http.StatusRequestEntityTooLarge:
		return "payload_too_large"
	case http.StatusNotImplemented:
		return "not_implemented"
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return "unavailable"
	}
	return "internal"
}

// rooms lists the agent's rooms.
func (c *client) rooms(ctx context.Context) (json.RawMessage, *apiError) {
	return c.call(ctx, http.MethodGet, c.agentPath("rooms"), nil, nil, nil)
}

// messagesQuery is one page of a conversation to read.
type messagesQuery struct {
	room, thread, before string
	limit                int
	strict               bool
}

// messages reads one page of a conversation, newest first by page.
func (c *client) messages(ctx context.Context, q messagesQuery) (json.RawMessage, *apiError) {
	v := url.Values{}
	if q.thread != "" {
		v.Set("thread", q.thread)
	}
	if q.limit > 0 {
		v.Set("limit", fmt.Sprint(q.limit))
	}
	if q.before != "" {
		v.Set("before", q.before)
	}
	if q.strict {
		v.Set("strict", "true")
	}
	return c.call(ctx, http.MethodGet, c.agentPath("rooms", q.room, "messages"), v, nil, nil)
}

// pending reads the pending work after a position, waiting up to wait for
// some when there is none.
func (c *client) pending(ctx context.Context, after int64, wait time.Duration, limit int) (json.RawMessage, *apiError) {
	v := url.Values{}
	if after > 0 {
		v.Set("after", fmt.Sprint(after))
	}
	if wait > 0 {
		v.Set("wait", wait.String())
	}
	if limit > 0 {
		v.Set("limit", fmt.Sprint(limit))
	}
	return c.call(ctx, http.MethodGet, c.agentPath("pending"), v, nil, nil)
}

// replyBody is the body of the reply route.
type replyBody struct {
	Body   string `json:"body"`
	Format string `json:"format,omitempty"`
	RoomID string `json:"room_id,omitempty"`
}

// reply answers a pending event.
func (c *client) reply(ctx context.Context, eventID string, body replyBody) (json.RawMessage, *apiError) {
	return c.call(ctx, http.MethodPost, c.agentPath("events", eventID, "reply"), nil, nil, body)
}

// sendBody is the body of the send route; the key goes in its header.
type sendBody struct {
	Body    string `json:"body"`
	Format  string `json:"format,omitempty"`
	Thread  string `json:"thread,omitempty"`
	ReplyTo string `json:"reply_to,omitempty"`
}

// send posts a new message into a room, once per idempotency key.
func (c *client) send(ctx context.Context, room, key string, body sendBody) (json.RawMessage, *apiError) {
	return c.call(ctx, http.MethodPost, c.agentPath("rooms", room, "send"), nil, http.Header{"Idempotency-Key": {key}}, body)
}

// react puts a reaction on an event.
func (c *client) react(ctx context.Context, eventID, key string) (json.RawMessage, *apiError) {
	return c.call(ctx, http.MethodPost, c.agentPath("events", eventID, "react"), nil, nil, map[string]string{"key": key})
}

// ignore settles a pending event without an answer.
func (c *client) ignore(ctx context.Context, eventID string) (json.RawMessage, *apiError) {
	return c.call(ctx, http.MethodPost, c.agentPath("events", eventID, "ignore"), nil, nil, nil)
}

// leave has the agent leave a room.
func (c *client) leave(ctx context.Context, room string) (json.RawMessage, *apiError) {
	return c.call(ctx, http.MethodPost, c.agentPath("rooms", room, "leave"), nil, nil, nil)
}

// approvalBody is the body of the approval request route.
type approvalBody struct {
	CallID     string          `json:"call_id"`
	Tool       string          `json:"tool"`
	Arguments  json.RawMessage `json:"arguments"`
	Approvers  []string        `json:"approvers,omitempty"`
	ExpiresInS int64           `json:"expires_in_s,omitempty"`
	Secret     []string        `json:"secret,omitempty"`
	Rendering  string          `json:"rendering,omitempty"`
	Context    json.RawMessage `json:"context,omitempty"`
}

// requestApproval asks a person to approve one exact call.
func (c *client) requestApproval(ctx context.Context, eventID string, body approvalBody) (json.RawMessage, *apiError) {
	return c.call(ctx, http.MethodPost, c.agentPath("events", eventID, "approvals"), nil, nil, body)
}

// approval reads one approval, waiting up to wait for its decision while
// it is open.
func (c *client) approval(ctx context.Context, eventID, callID string, wait time.Duration) (json.RawMessage, *apiError) {
	v := url.Values{}
	if wait > 0 {
		v.Set("wait", wait.String())
	}
	return c.call(ctx, http.MethodGet, c.agentPath("events", eventID, "approvals", callID), v, nil, nil)
}

// changes opens the agent's stream of room changes. The caller reads and
// closes the body of the 200; any other answer is an *apiError.
func (c *client) changes(ctx context.Context) (*http.Response, *apiError) {
	req, err := c.request(ctx, http.MethodGet, c.agentPath("changes"), nil, nil)
	if err != nil {
		return nil, &apiError{Code: "internal", Message: "building the API request: " + err.Error()}
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, unreachable(ctx, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, refusal(resp.StatusCode, b)
	}
	return resp, nil
}

// handlerTransport serves each request by calling an http.Handler in
// memory: inside the daemon the MCP tools reach the agent API without a
// socket, through the same routes, checks and errors as any client.
type handlerTransport struct{ h http.Handler }

// RoundTrip implements http.RoundTripper. The handler runs in its own
// goroutine and its body streams through a pipe, so long-polls and
// server-sent events work as over a connection; closing the response body
// cancels the handler's request context.
func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	sreq := req.Clone(ctx)
	if sreq.Body == nil {
		sreq.Body = http.NoBody
	}
	sreq.RequestURI = req.URL.RequestURI()
	sreq.RemoteAddr = "in-process"
	if sreq.Host == "" {
		sreq.Host = req.URL.Host
	}
	pr, pw := io.Pipe()
	w := &pipeWriter{header: make(http.Header), pw: pw, ready: make(chan struct{})}
	go func() {
		defer func() {
			if p := recover(); p != nil {
				// net/http would cut the connection; so does this.
				w.commit(http.StatusInternalServerError)
				pw.CloseWithError(fmt.Errorf("the in-process handler panicked: %v", p))
			} else {
				w.commit(http.StatusOK)
				pw.Close()
			}
			w.stopDeadline()
		}()
		t.h.ServeHTTP(w, sreq)
	}()
	select {
	case <-w.ready:
	case <-req.Context().Done():
		cancel()
		pr.Close()
		return nil, req.Context().Err()
	}
	return &http.Response{
		Status:        fmt.Sprintf("%d %s", w.status, http.StatusText(w.status)),
		StatusCode:    w.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        w.sent,
		Body:          &pipeBody{PipeReader: pr, cancel: cancel},
		ContentLength: -1,
		Request:       req,
	}, nil
}

// pipeBody is a response body read from the handler's pipe.
type pipeBody struct {
	*io.PipeReader
	cancel context.CancelFunc
}

// Close ends the handler's request: its writes fail from now on and its
// context is done.
func (b *pipeBody) Close() error {
	b.cancel()
	return b.PipeReader.Close()
}

// pipeWriter is the http.ResponseWriter of a handler served in memory.
type pipeWriter struct {
	header http.Header
	pw     *io.PipeWriter
	// ready closes when the status and headers are committed; sent is the
	// copy of the headers the response carries, so the handler's later
	// changes do not race with the reader.
	ready  chan struct{}
	once   sync.Once
	status int
	sent   http.Header

	mu       sync.Mutex
	deadline *time.Timer
}

// Header implements http.ResponseWriter.
func (w *pipeWriter) Header() http.Header { return w.header }

// WriteHeader implements http.ResponseWriter.
func (w *pipeWriter) WriteHeader(status int) { w.commit(status) }

// commit sends the status and headers, once.
func (w *pipeWriter) commit(status int) {
	w.once.Do(func() {
		w.status, w.sent = status, w.header.Clone()
		close(w.ready)
	})
}

// Write implements http.ResponseWriter.
func (w *pipeWriter) Write(b []byte) (int, error) {
	w.commit(http.StatusOK)
	return w.pw.Write(b)
}

// Flush implements http.Flusher: a write has reached the reader when it
// returns, so flushing only commits the headers.
func (w *pipeWriter) Flush() { w.commit(http.StatusOK) }

// SetWriteDeadline lets http.ResponseController bound the handler's
// writes as on a connection: past the deadline the pipe is broken, so a
// reader that stopped reading frees the handler.
func (w *pipeWriter) SetWriteDeadline(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.deadline != nil {
		w.deadline.Stop()
		w.deadline = nil
	}
	if t.IsZero() {
		return nil
	}
	w.deadline = time.AfterFunc(time.Until(t), func() { w.pw.CloseWithError(os.ErrDeadlineExceeded) })
	return nil
}

// stopDeadline stops a pending write deadline once the handler returned.
func (w *pipeWriter) stopDeadline() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.deadline != nil {
		w.deadline.Stop()
	}
}
