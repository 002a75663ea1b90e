package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/receipts"
)

// homeserver is the agent API's view of an agent's Matrix client
// (api.Homeserver): the client's answers in the API's terms, with the
// homeserver's refusals kept apart from the network's failures.
type homeserver struct{ c *matrix.Client }

// Typing implements api.Homeserver.
func (h homeserver) Typing(ctx context.Context, room string, typing bool, timeout time.Duration) error {
	return upstream(h.c.Typing(ctx, room, typing, timeout))
}

// JoinedRooms implements api.Homeserver.
func (h homeserver) JoinedRooms(ctx context.Context) ([]string, error) {
	rooms, err := h.c.JoinedRooms(ctx)
	return rooms, upstream(err)
}

// RoomSummary implements api.Homeserver.
func (h homeserver) RoomSummary(ctx context.Context, room string) (api.RoomSummary, error) {
	s, err := h.c.RoomSummary(ctx, room)
	return api.RoomSummary{Name: s.Name, Topic: s.Topic, Encrypted: s.Encrypted, Members: s.Members}, upstream(err)
}

// JoinedMembers implements api.Homeserver.
func (h homeserver) JoinedMembers(ctx context.Context, room string) ([]api.Member, error) {
	ms, err := h.c.JoinedMembers(ctx, room)
	if err != nil {
		return nil, upstream(err)
	}
	out := make([]api.Member, len(ms))
	for i, m := range ms {
		out[i] = api.Member{UserID: m.UserID, DisplayName: m.DisplayName, AvatarURL: m.AvatarURL}
	}
	return out, nil
}

// Download implements api.Homeserver.
func (h homeserver) Download(ctx context.Context, server, mediaID string, maxBytes int64) (*api.Media, error) {
	m, err := h.c.Download(ctx, server, mediaID, maxBytes)
	if err != nil {
		return nil, upstream(err)
	}
	return &api.Media{Body: mediaBody{m.Body}, ContentType: m.ContentType, Length: m.Length, Filename: m.Filename}, nil
}

// Upload implements api.Homeserver.
func (h homeserver) Upload(ctx context.Context, room, contentType, filename string, body io.Reader, size int64) (journal.Attachment, error) {
	att, err := h.c.UploadFor(ctx, room, contentType, filename, body, size)
	return att, upstream(err)
}

// mediaBody is a download's body whose cap is the API's error.
type mediaBody struct{ io.ReadCloser }

func (b mediaBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	return n, upstream(err)
}

// upstream spells the client's errors as the API's.
func upstream(err error) error {
	var he *matrix.HTTPError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, matrix.ErrMediaTooLarge):
		return errors.Join(api.ErrMediaTooLarge, err)
	case errors.Is(err, matrix.ErrBadMediaID):
		return errors.Join(api.ErrBadMediaID, err)
	case errors.As(err, &he):
		return &api.UpstreamError{Status: he.Status, ErrCode: he.ErrCode, Err: err}
	}
	return err
}

// clientRef is an agent's Matrix client, known once the agent signed in:
// its back-end is made before, and asks for files only after.
type clientRef struct{ c atomic.Pointer[matrix.Client] }

// fetchMedia downloads mxcURL whole, at most max bytes (the openai
// back-end's FetchMedia).
func (r *clientRef) fetchMedia(ctx context.Context, mxcURL string, max int64) ([]byte, string, error) {
	c := r.c.Load()
	if c == nil {
		return nil, "", errors.New("fetch media: the agent has not signed in")
	}
	server, mediaID, ok := strings.Cut(strings.TrimPrefix(mxcURL, "mxc://"), "/")
	if !ok || !strings.HasPrefix(mxcURL, "mxc://") {
		return nil, "", fmt.Errorf("fetch media: %q is not an mxc:// URL", mxcURL)
	}
	m, err := c.Download(ctx, server, mediaID, max)
	if err != nil {
		return nil, "", err
	}
	defer m.Body.Close()
	data, err := io.ReadAll(m.Body)
	if err != nil {
		return nil, "", fmt.Errorf("fetch media: %w", err)
	}
	return data, m.ContentType, nil
}

// typingRenew is principal.Deps.TypingRenew for an agent: negative, showing
// no typing, when its configuration turned typing off.
func typingRenew(a config.Agent) time.Duration {
	if a.Typing != nil && !*a.Typing {
		return -1
	}
	return 0
}

// approvalKeys are the reactions of an agent's approval cards.
func approvalKeys(a config.Agent) journal.ApprovalKeys {
	return journal.ApprovalKeys{Approve: a.ApprovalKeys.Approve, Deny: a.ApprovalKeys.Deny}
}

// receiptMode is the receipts mode an agent's configuration asks for.
func receiptMode(a config.Agent) receipts.Mode {
	switch a.ReadReceipts {
	case config.ReceiptsOnAnswer:
		return receipts.OnAnswer
	case config.ReceiptsOff:
		return receipts.Off
	}
	return receipts.OnSettle
}
