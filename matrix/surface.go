package matrix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// The homeserver calls an agent's surface makes besides sending: what it
// shows while it works (typing, read receipts) and what it may ask of its
// rooms (which ones it is in, what they are called, who is in them). None
// of them is journaled: each is answered by the homeserver as it stands.

// defaultTypingTimeout is how long a typing notice lasts when the caller
// names no timeout: the span Matrix clients commonly use, renewed by the
// caller while its work goes on.
const defaultTypingTimeout = 30 * time.Second

// RoomSummary is what the homeserver says of one joined room.
type RoomSummary struct {
	RoomID string
	// Name is the room's m.room.name, "" when none.
	Name string
	// Topic is the room's m.room.topic, "" when none.
	Topic string
	// Encrypted is set when an m.room.encryption state event exists. A
	// room's encryption cannot be turned off, so any such event counts,
	// even one whose content was since redacted.
	Encrypted bool
	// Members counts the joined members.
	Members int
}

// Member is one joined member of a room.
type Member struct{ UserID, DisplayName, AvatarURL string }

// Typing tells room the agent is typing (for timeout, or until told
// otherwise) or has stopped. The server drops a notice whose timeout has
// passed, so one the agent never withdraws (it crashed mid-reply) does not
// stay up; a non-positive timeout while typing is defaultTypingTimeout.
func (c *Client) Typing(ctx context.Context, room string, typing bool, timeout time.Duration) error {
	body := map[string]any{"typing": typing}
	if typing {
		if timeout <= 0 {
			timeout = defaultTypingTimeout
		}
		// At least a millisecond: a timeout under one would round to zero,
		// which a server may take as "no timeout".
		body["timeout"] = max(timeout.Milliseconds(), 1)
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("typing in %s: %w", room, err)
	}
	url := c.mx.BuildClientURL("v3", "rooms", room, "typing", c.UserID())
	if err := c.do(ctx, http.MethodPut, url, raw, nil); err != nil {
		return fmt.Errorf("typing in %s: %w", room, err)
	}
	return nil
}

// ReadReceipt marks eventID, and everything before it in room, read by the
// agent (a public m.read receipt).
func (c *Client) ReadReceipt(ctx context.Context, room, eventID string) error {
	url := c.mx.BuildClientURL("v3", "rooms", room, "receipt", "m.read", eventID)
	if err := c.do(ctx, http.MethodPost, url, json.RawMessage(`{}`), nil); err != nil {
		return fmt.Errorf("read receipt for %s in %s: %w", eventID, room, err)
	}
	return nil
}

// JoinedRooms lists the rooms the agent is joined to, sorted by room ID
// (the server answers in no particular order).
func (c *Client) JoinedRooms(ctx context.Context) ([]string, error) {
	var resp struct {
		JoinedRooms []string `json:"joined_rooms"`
	}
	if err := c.do(ctx, http.MethodGet, c.mx.BuildClientURL("v3", "joined_rooms"), nil, &resp); err != nil {
		return nil, fmt.Errorf("joined rooms: %w", err)
	}
	rooms := resp.JoinedRooms
	if rooms == nil {
		rooms = []string{}
	}
	slices.Sort(rooms)
	return rooms, nil
}

// RoomSummary reads room's name, topic and encryption from its current
// state, and counts its joined members. It takes four requests, not one
// full state read: a large room's state holds every member event.
func (c *Client) RoomSummary(ctx context.Context, room string) (RoomSummary, error) {
	s := RoomSummary{RoomID: room}
	var name struct {
		Name string `json:"name"`
	}
	if _, err := c.stateEvent(ctx, room, "m.room.name", &name); err != nil {
		return RoomSummary{}, fmt.Errorf("summary of %s: %w", room, err)
	}
	var topic struct {
		Topic string `json:"topic"`
	}
	if _, err := c.stateEvent(ctx, room, "m.room.topic", &topic); err != nil {
		return RoomSummary{}, fmt.Errorf("summary of %s: %w", room, err)
	}
	var encryption json.RawMessage
	encrypted, err := c.stateEvent(ctx, room, "m.room.encryption", &encryption)
	if err != nil {
		return RoomSummary{}, fmt.Errorf("summary of %s: %w", room, err)
	}
	joined, err := c.joinedMembers(ctx, room)
	if err != nil {
		return RoomSummary{}, fmt.Errorf("summary of %s: %w", room, err)
	}
	s.Name, s.Topic, s.Encrypted, s.Members = name.Name, topic.Topic, encrypted, len(joined)
	return s, nil
}

// stateEvent reads the content of room's eventType state event with the
// empty state key into out. An event the room does not have (404
// M_NOT_FOUND) is found false, not an error.
func (c *Client) stateEvent(ctx context.Context, room, eventType string, out any) (found bool, err error) {
	// The trailing empty segment is the state key: .../state/m.room.name/
	url := c.mx.BuildClientURL("v3", "rooms", room, "state", eventType, "")
	err = c.do(ctx, http.MethodGet, url, nil, out)
	var he *HTTPError
	switch {
	case errors.As(err, &he) && he.Status == http.StatusNotFound && he.ErrCode == "M_NOT_FOUND":
		return false, nil
	case err != nil:
		return false, fmt.Errorf("state %s: %w", eventType, err)
	}
	return true, nil
}

// JoinedMembers lists room's joined members, sorted by user ID.
func (c *Client) JoinedMembers(ctx context.Context, room string) ([]Member, error) {
	joined, err := c.joinedMembers(ctx, room)
	if err != nil {
		return nil, fmt.Errorf("members of %s: %w", room, err)
	}
	members := make([]Member, 0, len(joined))
	for userID, m := range joined {
		members = append(members, Member{UserID: userID, DisplayName: m.DisplayName, AvatarURL: m.AvatarURL})
	}
	slices.SortFunc(members, func(a, b Member) int {
		switch {
		case a.UserID < b.UserID:
			return -1
		case a.UserID > b.UserID:
			return 1
		}
		return 0
	})
	return members, nil
}

// joinedProfile is one member's entry in /joined_members; a name or
// avatar the member never set is null or absent, read as "".
type joinedProfile struct {
	DisplayName string `json:"display_name"`
	AvatarURL   string `json:"avatar_url"`
}

func (c *Client) joinedMembers(ctx context.Context, room string) (map[string]joinedProfile, error) {
	var resp struct {
		Joined map[string]joinedProfile `json:"joined"`
	}
	if err := c.do(ctx, http.MethodGet, c.mx.BuildClientURL("v3", "rooms", room, "joined_members"), nil, &resp); err != nil {
		return nil, fmt.Errorf("joined members: %w", err)
	}
	return resp.Joined, nil
}
