package matrix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"maunium.net/go/mautrix"
)

// Direction is the direction of a /messages walk.
type Direction string

// Directions.
const (
	// Backward walks from newer to older events.
	Backward Direction = "b"
	// Forward walks from older to newer events. Dendrite refuses a forward
	// walk without a from token.
	Forward Direction = "f"
)

// MessagesPage is one page of a room's history.
type MessagesPage struct {
	// Chunk holds the events in walk order, raw.
	Chunk []json.RawMessage `json:"chunk"`
	// End continues the walk; empty when there is nothing further.
	End string `json:"end"`
}

// Messages reads one page of room's history from from ("" for the newest
// end, backward only) in dir. Dendrite serves at most 100 events a page,
// and fills the store behind /messages and /relations after it answers a
// send: a page read at once may not show an event just sent yet.
func (c *Client) Messages(ctx context.Context, room, from string, dir Direction, limit int) (MessagesPage, error) {
	switch {
	case dir != Backward && dir != Forward:
		return MessagesPage{}, fmt.Errorf("messages: unknown direction %q", dir)
	case limit < 1:
		return MessagesPage{}, fmt.Errorf("messages: limit %d is not positive", limit)
	}
	query := map[string]string{"dir": string(dir), "limit": strconv.Itoa(limit)}
	if from != "" {
		query["from"] = from
	}
	var page MessagesPage
	url := c.mx.BuildURLWithQuery(mautrix.ClientURLPath{"v3", "rooms", room, "messages"}, query)
	if err := c.do(ctx, http.MethodGet, url, nil, &page); err != nil {
		return MessagesPage{}, fmt.Errorf("messages of %s: %w", room, err)
	}
	return page, nil
}

// RelationsPage is one page of the events relating to an event.
type RelationsPage struct {
	// Chunk holds the related events, newest first, raw.
	Chunk []json.RawMessage `json:"chunk"`
	// NextBatch continues the walk; empty at the end.
	NextBatch string `json:"next_batch"`
	// RecursionDepth is how deep the server followed relations of
	// relations. Dendrite ignores recurse and omits it: a non-empty page
	// without it holds direct children only.
	RecursionDepth *int `json:"recursion_depth"`
}

// Relations reads one page of the events relating to eventID, newest
// first, asking the server to recurse through the whole relation tree.
// relType, when set, keeps only relations of that type (m.replace: the
// edits). Dendrite v0.13 answers a limit above 20 with only the page's
// oldest 20 events and a next_batch past the rest: ask for at most 20.
func (c *Client) Relations(ctx context.Context, room, eventID, relType, from string, limit int) (RelationsPage, error) {
	if limit < 1 {
		return RelationsPage{}, fmt.Errorf("relations: limit %d is not positive", limit)
	}
	query := map[string]string{"dir": "b", "recurse": "true", "limit": strconv.Itoa(limit)}
	if from != "" {
		query["from"] = from
	}
	var page RelationsPage
	path := mautrix.ClientURLPath{"v1", "rooms", room, "relations", eventID}
	if relType != "" {
		path = append(path, relType)
	}
	url := c.mx.BuildURLWithQuery(path, query)
	if err := c.do(ctx, http.MethodGet, url, nil, &page); err != nil {
		return RelationsPage{}, fmt.Errorf("relations of %s: %w", eventID, err)
	}
	return page, nil
}

// Event fetches one event as the server holds it, raw.
func (c *Client) Event(ctx context.Context, room, eventID string) (json.RawMessage, error) {
	var raw json.RawMessage
	if err := c.do(ctx, http.MethodGet, c.mx.BuildClientURL("v3", "rooms", room, "event", eventID), nil, &raw); err != nil {
		return nil, fmt.Errorf("event %s: %w", eventID, err)
	}
	return raw, nil
}

// Send puts content, sent byte for byte, into room as an eventType event
// under txnID. The server deduplicates a repeated txnID from the same
// device and answers with the first send's event ID; there is no default
// transaction ID, since a random one would defeat that. In an encrypted
// room the client's Encrypter seals the event first; a retry seals it
// again, another ciphertext under the same txnID, which the server still
// answers with the first send's event.
func (c *Client) Send(ctx context.Context, room, eventType, txnID string, content json.RawMessage) (eventID string, err error) {
	switch {
	case txnID == "":
		return "", errors.New("send: a transaction ID is required")
	case eventType == "":
		return "", errors.New("send: an event type is required")
	case len(content) == 0:
		return "", errors.New("send: content is required")
	}
	eventType, content, err = c.seal(ctx, room, eventType, content)
	if err != nil {
		return "", fmt.Errorf("send to %s: %w", room, err)
	}
	var resp struct {
		EventID string `json:"event_id"`
	}
	url := c.mx.BuildClientURL("v3", "rooms", room, "send", eventType, txnID)
	if err := c.do(ctx, http.MethodPut, url, content, &resp); err != nil {
		return "", fmt.Errorf("send to %s: %w", room, err)
	}
	return resp.EventID, nil
}

// Redact redacts eventID in room under txnID and returns the redaction's
// event ID. Redacting an event twice changes nothing further.
func (c *Client) Redact(ctx context.Context, room, eventID, txnID string) (redactionID string, err error) {
	return c.RedactWithReason(ctx, room, eventID, txnID, "")
}

// RedactWithReason is Redact giving reason ("" for none) in the
// redaction's content. The server deduplicates a repeated txnID as it does
// a send's. A redaction is never sealed: every server in the room must
// read it to apply it, so encrypted rooms carry it in the clear.
func (c *Client) RedactWithReason(ctx context.Context, room, eventID, txnID, reason string) (redactionID string, err error) {
	if txnID == "" {
		return "", errors.New("redact: a transaction ID is required")
	}
	body := json.RawMessage(`{}`)
	if reason != "" {
		if body, err = json.Marshal(map[string]string{"reason": reason}); err != nil {
			return "", fmt.Errorf("redact %s: %w", eventID, err)
		}
	}
	var resp struct {
		EventID string `json:"event_id"`
	}
	url := c.mx.BuildClientURL("v3", "rooms", room, "redact", eventID, txnID)
	if err := c.do(ctx, http.MethodPut, url, body, &resp); err != nil {
		return "", fmt.Errorf("redact %s: %w", eventID, err)
	}
	return resp.EventID, nil
}

// Join joins a room by ID or alias and returns its ID.
func (c *Client) Join(ctx context.Context, roomOrAlias string) (roomID string, err error) {
	var resp struct {
		RoomID string `json:"room_id"`
	}
	if err := c.do(ctx, http.MethodPost, c.mx.BuildClientURL("v3", "join", roomOrAlias), nil, &resp); err != nil {
		return "", fmt.Errorf("join %s: %w", roomOrAlias, err)
	}
	return resp.RoomID, nil
}

// Leave leaves room.
func (c *Client) Leave(ctx context.Context, room string) error {
	if err := c.do(ctx, http.MethodPost, c.mx.BuildClientURL("v3", "rooms", room, "leave"), nil, nil); err != nil {
		return fmt.Errorf("leave %s: %w", room, err)
	}
	return nil
}
