package matrix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"maunium.net/go/mautrix"
)

// Media errors.
var (
	// ErrMediaTooLarge refuses a download past the caller's cap: before
	// any byte is read when the server announced the length, or once more
	// than the cap was read when it did not.
	ErrMediaTooLarge = errors.New("media larger than the cap")
	// ErrBadMediaID refuses a server name or media ID that is not valid:
	// checked before any request, since both become segments of the
	// request's path.
	ErrBadMediaID = errors.New("not a valid media server name or media ID")
)

// Media is one downloaded file, streamed: the caller reads Body and closes
// it.
type Media struct {
	// Body yields at most the cap; reading past it fails with
	// ErrMediaTooLarge.
	Body io.ReadCloser
	// ContentType is the server's Content-Type.
	ContentType string
	// Length is the Content-Length, -1 when unknown.
	Length int64
	// Filename is the name the server's Content-Disposition gives, "" when
	// none. It is the uploader's choice: not a safe path.
	Filename string
}

// transferIdle is how long a download or an upload may go without moving
// a byte before it is abandoned. A transfer's length is the file's, so no
// overall deadline fits; a stall does not hold the caller forever.
const transferIdle = requestTimeout

// maxErrorBody bounds how much of a refusal's body is read for its errcode.
const maxErrorBody = 64 << 10

// errStalled is why a transfer that moved nothing for transferIdle ended.
var errStalled = fmt.Errorf("the transfer made no progress for %s", transferIdle)

// Download streams the file mxc://server/mediaID, refusing one larger than
// maxBytes. It asks the authenticated media API first
// (/_matrix/client/v1/media/download, Matrix 1.11), and the legacy
// /_matrix/media/v3/download when the server does not know that endpoint.
// A refused token logs in again and asks once more: a download changes
// nothing on the server. The transfer is bound to ctx and abandoned after
// transferIdle without progress.
func (c *Client) Download(ctx context.Context, server, mediaID string, maxBytes int64) (*Media, error) {
	if !validServerName(server) || !validMediaID(mediaID) {
		return nil, fmt.Errorf("download %q %q: %w", server, mediaID, ErrBadMediaID)
	}
	mxc := "mxc://" + server + "/" + mediaID
	if maxBytes < 0 {
		return nil, fmt.Errorf("download %s: negative cap %d", mxc, maxBytes)
	}
	resp, wd, err := c.getMedia(ctx, c.mx.BuildURL(mautrix.ClientURLPath{"v1", "media", "download", server, mediaID}))
	if unrecognized(err) {
		resp, wd, err = c.getMedia(ctx, c.mx.BuildURL(mautrix.MediaURLPath{"v3", "download", server, mediaID}))
	}
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", mxc, err)
	}
	m, err := newMedia(resp, wd, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", mxc, err)
	}
	return m, nil
}

// unrecognized reports a server that does not serve an endpoint, as
// servers older than Matrix 1.11 answer the authenticated media API: 404
// M_UNRECOGNIZED (Synapse, Dendrite), or 405 or 400 M_UNRECOGNIZED (the
// spec's answer for an unknown method). A 404 with any other errcode
// (M_NOT_FOUND: no such file) is the file's absence, not the endpoint's.
func unrecognized(err error) bool {
	var he *HTTPError
	if !errors.As(err, &he) {
		return false
	}
	switch he.Status {
	case http.StatusMethodNotAllowed:
		return true
	case http.StatusNotFound, http.StatusBadRequest:
		return he.ErrCode == "M_UNRECOGNIZED"
	}
	return false
}

// getMedia GETs url with the current token and returns a 2xx response, its
// body unread, with the watchdog that guards reading it. A refused token
// logs in again and asks once more.
func (c *Client) getMedia(ctx context.Context, url string) (*http.Response, *watchdog, error) {
	for attempt := 0; ; attempt++ {
		c.mu.Lock()
		token, session := c.token, c.session
		c.mu.Unlock()
		wctx, wd := newWatchdog(ctx)
		req, err := http.NewRequestWithContext(wctx, http.MethodGet, url, nil)
		if err != nil {
			wd.stop()
			return nil, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		// The file as stored: Go's transparent gzip would hide its length.
		req.Header.Set("Accept-Encoding", "identity")
		resp, err := c.mx.Client.Do(req)
		if err != nil {
			err = wd.explain(err)
			wd.stop()
			return nil, nil, err
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			wd.kick()
			return resp, wd, nil
		}
		err = refusal(resp)
		wd.stop()
		if attempt > 0 || !errors.Is(err, ErrInvalidToken) {
			return nil, nil, err
		}
		if rerr := c.relogin(ctx, session); rerr != nil {
			return nil, nil, fmt.Errorf("%w; log in again: %w", err, rerr)
		}
	}
}

// newMedia hands over a 2xx response's body under the cap.
func newMedia(resp *http.Response, wd *watchdog, maxBytes int64) (*Media, error) {
	if resp.ContentLength > maxBytes {
		resp.Body.Close()
		wd.stop()
		return nil, fmt.Errorf("%w: %d bytes, the cap is %d", ErrMediaTooLarge, resp.ContentLength, maxBytes)
	}
	m := &Media{
		Body:        &cappedBody{r: resp.Body, left: maxBytes, max: maxBytes, wd: wd},
		ContentType: resp.Header.Get("Content-Type"),
		Length:      resp.ContentLength,
	}
	if cd := resp.Header.Get("Content-Disposition"); cd != "" {
		// ParseMediaType decodes RFC 2231's filename*=utf-8''... too.
		if _, params, err := mime.ParseMediaType(cd); err == nil {
			m.Filename = params["filename"]
		}
	}
	return m, nil
}

// cappedBody yields a response body up to max bytes and fails once the
// body holds more.
type cappedBody struct {
	r         io.ReadCloser
	left, max int64
	wd        *watchdog
	err       error
}

// Read implements io.Reader. A read that would cross the cap asks for one
// byte beyond it: if the body has it, the file is too large.
func (b *cappedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if int64(len(p)) > b.left {
		p = p[:b.left+1]
	}
	n, err := b.r.Read(p)
	if n > 0 {
		b.wd.kick()
	}
	if int64(n) > b.left {
		n = int(b.left)
		b.left = 0
		b.err = fmt.Errorf("%w: more than %d bytes", ErrMediaTooLarge, b.max)
		return n, b.err
	}
	b.left -= int64(n)
	if err != nil && err != io.EOF {
		b.err = b.wd.explain(err)
		return n, b.err
	}
	return n, err
}

// Close implements io.Closer; it also ends the transfer's watchdog.
func (b *cappedBody) Close() error {
	err := b.r.Close()
	b.wd.stop()
	return err
}

// Upload sends size bytes of body as one file named filename (may be "")
// of contentType ("" is application/octet-stream) and returns its mxc URI.
// It is made once: body is a stream that cannot be sent again. A refused
// token logs in again, so the next call can succeed, and is returned. size
// below zero sends no Content-Length, which some servers (Dendrite)
// refuse. body is not closed. The transfer is bound to ctx and abandoned
// after transferIdle without progress.
func (c *Client) Upload(ctx context.Context, contentType, filename string, body io.Reader, size int64) (mxcURI string, err error) {
	query := map[string]string{}
	if filename != "" {
		query["filename"] = filename
	}
	if contentType == "" {
		contentType = "application/octet-stream"
	}
	url := c.mx.BuildURLWithQuery(mautrix.MediaURLPath{"v3", "upload"}, query)
	c.mu.Lock()
	token, session := c.token, c.session
	c.mu.Unlock()
	wctx, wd := newWatchdog(ctx)
	defer wd.stop()
	// Only a reader: the transport closes a body that is an io.Closer, and
	// the body is the caller's.
	var reqBody io.Reader = progressReader{r: body, wd: wd}
	if size == 0 {
		// For a client request, ContentLength 0 with a body means unknown.
		reqBody = http.NoBody
	}
	req, err := http.NewRequestWithContext(wctx, http.MethodPost, url, reqBody)
	if err != nil {
		return "", fmt.Errorf("upload: %w", err)
	}
	req.ContentLength = size
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", contentType)
	resp, err := c.mx.Client.Do(req)
	if err != nil {
		return "", fmt.Errorf("upload: %w", wd.explain(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		err := refusal(resp)
		if errors.Is(err, ErrInvalidToken) {
			if rerr := c.relogin(ctx, session); rerr != nil {
				return "", fmt.Errorf("upload: %w; log in again: %w", err, rerr)
			}
		}
		return "", fmt.Errorf("upload: %w", err)
	}
	var answer struct {
		ContentURI string `json:"content_uri"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxErrorBody)).Decode(&answer); err != nil {
		return "", fmt.Errorf("upload: read response: %w", wd.explain(err))
	}
	if _, _, ok := splitMXC(answer.ContentURI); !ok {
		return "", fmt.Errorf("upload: the homeserver answered %q, not an mxc URI", answer.ContentURI)
	}
	return answer.ContentURI, nil
}

// progressReader kicks the watchdog as an upload's body is read.
type progressReader struct {
	r  io.Reader
	wd *watchdog
}

func (p progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.wd.kick()
	}
	return n, err
}

// refusal reads a non-2xx response into an HTTPError, as mapError makes
// one for the JSON requests, and closes its body.
func refusal(resp *http.Response) error {
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	he := mautrix.HTTPError{Response: resp}
	var re mautrix.RespError
	if json.Unmarshal(data, &re) == nil && re.ErrCode != "" {
		he.RespError = &re
	}
	return mapError(he)
}

// watchdog cancels a transfer that has moved nothing for transferIdle.
type watchdog struct {
	ctx    context.Context
	timer  *time.Timer
	cancel context.CancelCauseFunc
}

func newWatchdog(ctx context.Context) (context.Context, *watchdog) {
	wctx, cancel := context.WithCancelCause(ctx)
	timer := time.AfterFunc(transferIdle, func() { cancel(errStalled) })
	return wctx, &watchdog{ctx: wctx, timer: timer, cancel: cancel}
}

// kick restarts the idle span: the transfer moved.
func (w *watchdog) kick() { w.timer.Reset(transferIdle) }

// stop ends the transfer's context.
func (w *watchdog) stop() {
	w.timer.Stop()
	w.cancel(context.Canceled)
}

// explain names the stall as the cause of an error it caused; the
// transport reports it as a cancelled context only.
func (w *watchdog) explain(err error) error {
	if err != nil && errors.Is(context.Cause(w.ctx), errStalled) {
		return fmt.Errorf("%w: %w", errStalled, err)
	}
	return err
}

// splitMXC splits mxc://server/mediaID, checking both parts.
func splitMXC(uri string) (server, mediaID string, ok bool) {
	rest, found := strings.CutPrefix(uri, "mxc://")
	if !found {
		return "", "", false
	}
	server, mediaID, found = strings.Cut(rest, "/")
	if !found || !validServerName(server) || !validMediaID(mediaID) {
		return "", "", false
	}
	return server, mediaID, true
}

// validMediaID reports a media ID as the spec allows one: 1 to 255 of
// A-Z a-z 0-9 _ -.
func validMediaID(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isAlnum(s[i]) && s[i] != '_' && s[i] != '-' {
			return false
		}
	}
	return true
}

// validServerName reports a Matrix server name, host[:port], at most 255
// bytes: a DNS name or IPv4 address (letters, digits, dots and hyphens in
// non-empty labels, so no "." or ".." can walk the request's path), or an
// IPv6 literal in brackets; a port of 1 to 5 digits.
func validServerName(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	host, port := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return false
		}
		host, port = s[:end+1], s[end+1:]
		if !validIPv6Literal(host[1 : len(host)-1]) {
			return false
		}
	} else if i := strings.LastIndexByte(s, ':'); i >= 0 {
		host, port = s[:i], s[i:]
		if !validDNSName(host) {
			return false
		}
	} else if !validDNSName(host) {
		return false
	}
	if port == "" {
		return true
	}
	digits, ok := strings.CutPrefix(port, ":")
	if !ok || digits == "" || len(digits) > 5 {
		return false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return false
		}
	}
	return true
}

func validDNSName(s string) bool {
	if s == "" {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" {
			return false
		}
		for i := 0; i < len(label); i++ {
			if !isAlnum(label[i]) && label[i] != '-' {
				return false
			}
		}
	}
	return true
}

func validIPv6Literal(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9') && !(c >= 'a' && c <= 'f') && !(c >= 'A' && c <= 'F') && c != ':' && c != '.' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
