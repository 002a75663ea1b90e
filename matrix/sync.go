package matrix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"maunium.net/go/mautrix"
)

// TimelineLimit is how many timeline events one sync returns per room.
// More than that since the last sync marks the timeline Limited, and the
// caller fills the gap from /messages. 50 keeps an ordinary wake-up to one
// response while bounding what a busy room puts into one admission batch.
const TimelineLimit = 50

// syncFilter asks for whole timelines (TimelineLimit per room, members not
// lazy-loaded, so no state event is left out for the client to fetch) and
// leaves out presence, typing, receipts and account data: the journal
// admits none of them, and each would wake the long poll for nothing.
var syncFilter = `{"presence":{"not_types":["*"]},"account_data":{"not_types":["*"]},` +
	`"room":{"timeline":{"limit":` + strconv.Itoa(TimelineLimit) + `},"state":{"lazy_load_members":false},` +
	`"ephemeral":{"not_types":["*"]},"account_data":{"not_types":["*"]}}}`

// syncGrace is how much longer than its long-poll timeout a sync may take
// before it is abandoned: the server answers at the timeout, plus the time
// to build and send a large response.
const syncGrace = 30 * time.Second

// SyncBatch is one sync response, reduced to what the journal admits.
type SyncBatch struct {
	NextBatch string
	// Joined are the rooms the user is in that have news, by room ID.
	Joined []RoomTimeline
	// Invited are the room IDs the user is invited to, sorted.
	Invited []string
	// Left are the rooms the user left or was removed from, with their
	// final timeline, by room ID.
	Left []RoomTimeline
	// Crypto is what the response holds for the account's device: its
	// to-device messages, the device lists that changed and its one-time
	// key counts. The journal admits none of it; the crypto engine takes
	// it before the batch is admitted.
	Crypto DeviceNews
}

// DeviceNews is the part of a sync response addressed to the device.
type DeviceNews struct {
	// ToDevice are the to-device events, each the raw JSON the server sent.
	ToDevice []json.RawMessage
	// DeviceLists names the users whose devices changed, or who share no
	// encrypted room with the account any more.
	DeviceLists mautrix.DeviceLists
	// OneTimeKeys counts the device's one-time keys left on the server.
	OneTimeKeys mautrix.OTKCount
}

// RoomTimeline is one room's timeline in a sync.
type RoomTimeline struct {
	RoomID string
	// Events are the timeline events in order, each the raw JSON the
	// server sent.
	Events []json.RawMessage
	// Limited is set when events between the previous sync and these were
	// left out.
	Limited bool
	// PrevBatch is the /messages token just before Events.
	PrevBatch string
	// State are the room's state events the response holds apart from its
	// timeline (the whole state at the first sync of a room), raw.
	State []json.RawMessage
}

// syncResponse is the part of a sync body the port reads. Events stay
// json.RawMessage: decoding copies their bytes untouched.
type syncResponse struct {
	NextBatch string `json:"next_batch"`
	Rooms     struct {
		Join   map[string]roomResponse    `json:"join"`
		Invite map[string]json.RawMessage `json:"invite"`
		Leave  map[string]roomResponse    `json:"leave"`
	} `json:"rooms"`
	ToDevice struct {
		Events []json.RawMessage `json:"events"`
	} `json:"to_device"`
	DeviceLists mautrix.DeviceLists `json:"device_lists"`
	OneTimeKeys mautrix.OTKCount    `json:"device_one_time_keys_count"`
}

type roomResponse struct {
	State struct {
		Events []json.RawMessage `json:"events"`
	} `json:"state"`
	Timeline struct {
		Events    []json.RawMessage `json:"events"`
		Limited   bool              `json:"limited"`
		PrevBatch string            `json:"prev_batch"`
	} `json:"timeline"`
}

// Sync long-polls for news after since ("" for the first sync) for up to
// timeout. It never stores the token: the caller commits NextBatch with
// the events it admitted.
func (c *Client) Sync(ctx context.Context, since string, timeout time.Duration) (*SyncBatch, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout+syncGrace)
	defer cancel()
	query := map[string]string{"filter": syncFilter, "timeout": strconv.FormatInt(timeout.Milliseconds(), 10)}
	if since != "" {
		query["since"] = since
	}
	var resp syncResponse
	url := c.mx.BuildURLWithQuery(mautrix.ClientURLPath{"v3", "sync"}, query)
	if err := c.do(ctx, http.MethodGet, url, nil, &resp); err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	if resp.NextBatch == "" {
		return nil, errors.New("sync: the homeserver returned no next_batch")
	}
	b := &SyncBatch{NextBatch: resp.NextBatch, Joined: timelines(resp.Rooms.Join), Left: timelines(resp.Rooms.Leave),
		Crypto: DeviceNews{ToDevice: resp.ToDevice.Events, DeviceLists: resp.DeviceLists, OneTimeKeys: resp.OneTimeKeys}}
	for room := range resp.Rooms.Invite {
		b.Invited = append(b.Invited, room)
	}
	slices.Sort(b.Invited)
	return b, nil
}

// timelines orders rooms by ID, so a batch is the same for the same
// response.
func timelines(rooms map[string]roomResponse) []RoomTimeline {
	out := make([]RoomTimeline, 0, len(rooms))
	for room, r := range rooms {
		out = append(out, RoomTimeline{RoomID: room, Events: r.Timeline.Events, Limited: r.Timeline.Limited, PrevBatch: r.Timeline.PrevBatch,
			State: r.State.Events})
	}
	slices.SortFunc(out, func(a, b RoomTimeline) int { return strings.Compare(a.RoomID, b.RoomID) })
	return out
}
