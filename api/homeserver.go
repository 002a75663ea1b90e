package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// Homeserver is what an agent's routes ask of the homeserver directly, as
// the agent's account: what is never journaled (typing, room state,
// members) and the files messages carry.
type Homeserver interface {
	// Typing shows (or stops showing) the agent typing in room, for at
	// most timeout.
	Typing(ctx context.Context, room string, typing bool, timeout time.Duration) error
	// JoinedRooms lists the rooms the account is joined to.
	JoinedRooms(ctx context.Context) ([]string, error)
	// RoomSummary describes one joined room.
	RoomSummary(ctx context.Context, room string) (RoomSummary, error)
	// JoinedMembers lists a room's joined members.
	JoinedMembers(ctx context.Context, room string) ([]Member, error)
	// Download streams a file the homeserver holds, refusing one larger
	// than maxBytes.
	Download(ctx context.Context, server, mediaID string, maxBytes int64) (*Media, error)
	// Upload stores a file of size bytes for a message into room and
	// returns it as the message carries it: encrypted first in an
	// encrypted room, its key then in Attachment.File.
	Upload(ctx context.Context, room, contentType, filename string, body io.Reader, size int64) (journal.Attachment, error)
}

// RoomSummary is what the homeserver says of a room.
type RoomSummary struct {
	Name, Topic string
	Encrypted   bool
	Members     int
}

// Member is one joined member of a room.
type Member struct {
	UserID      string `json:"user_id"`
	DisplayName string `json:"display_name,omitempty"`
	AvatarURL   string `json:"avatar_url,omitempty"`
}

// Media is a file being downloaded.
type Media struct {
	// Body yields the file; the route closes it.
	Body        io.ReadCloser
	ContentType string
	// Length is the file's size in bytes, -1 when the homeserver did not
	// say.
	Length   int64
	Filename string
}

// Homeserver errors the routes tell apart.
var (
	// ErrMediaTooLarge refuses a file larger than the cap.
	ErrMediaTooLarge = errors.New("media larger than the cap")
	// ErrBadMediaID refuses a server name or media ID that is not one.
	ErrBadMediaID = errors.New("not a media ID")
	// ErrBadFile refuses an encrypted file that does not decrypt to what
	// its message says: its hash differs.
	ErrBadFile = errors.New("the file does not match its message's hash")
)

// UpstreamError is the homeserver's refusal of a request: its HTTP status
// and Matrix error code.
type UpstreamError struct {
	Status  int
	ErrCode string
	Err     error
}

// Error implements error.
func (e *UpstreamError) Error() string {
	return fmt.Sprintf("homeserver answered %d %s: %v", e.Status, e.ErrCode, e.Err)
}

// Unwrap gives the cause.
func (e *UpstreamError) Unwrap() error { return e.Err }

// codeUpstream is the code of a homeserver failure the API cannot mend.
const codeUpstream = "homeserver_error"

// failUpstream answers a homeserver failure: what the homeserver refused
// for the caller's reasons keeps its meaning (not found, forbidden, a bad
// request, rate limited), anything else is a 502, its cause logged.
func (s *server) failUpstream(w http.ResponseWriter, r *http.Request, agent string, err error) {
	var up *UpstreamError
	switch {
	case errors.Is(err, ErrMediaTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, codeTooLarge, "the file is larger than the media cap")
	case errors.Is(err, ErrBadFile):
		s.log.Warn().Err(err).Str("agent", agent).Str("path", r.URL.Path).Msg("An encrypted file failed its hash")
		writeError(w, http.StatusBadGateway, codeUpstream, "the file does not match its message: its hash differs")
	case errors.Is(err, ErrBadMediaID):
		writeError(w, http.StatusBadRequest, codeBadRequest, "server and media ID must name a Matrix media item")
	case r.Context().Err() != nil:
	case errors.As(err, &up) && up.Status == http.StatusNotFound:
		writeError(w, http.StatusNotFound, codeNotFound, "the homeserver has no such thing")
	case errors.As(err, &up) && up.Status == http.StatusForbidden:
		writeError(w, http.StatusForbidden, codeForbidden, "the homeserver refused the agent's account: "+up.ErrCode)
	case errors.As(err, &up) && up.Status == http.StatusTooManyRequests:
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, codeUnavailable, "the homeserver is rate limiting the agent")
	case errors.As(err, &up) && up.Status == http.StatusBadRequest:
		writeError(w, http.StatusBadRequest, codeBadRequest, "the homeserver refused the request: "+up.ErrCode)
	default:
		s.log.Warn().Err(err).Str("agent", agent).Str("method", r.Method).Str("path", r.URL.Path).
			Msg("Homeserver request failed")
		writeError(w, http.StatusBadGateway, codeUpstream, "the homeserver request failed")
	}
}
