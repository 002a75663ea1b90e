package dendrite

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"
)

// ephemeralSyncFilter keeps a sync to the rooms' ephemeral events (typing,
// receipts): timelines and state are left out.
const ephemeralSyncFilter = `{"room":{"timeline":{"limit":0},"state":{"types":[]}},"presence":{"types":[]},"account_data":{"types":[]}}`

// AwaitEphemeral returns the first ephemeral event of room (m.typing,
// m.receipt) in this user's sync for which match is true, syncing until
// ctx ends (which fails the test). Each call starts from a fresh sync of
// its own, which carries the current typing and receipts: an event from
// before the call is found too. It leaves AwaitEvent's position alone.
func (u *User) AwaitEphemeral(ctx context.Context, room string, match func(json.RawMessage) bool) json.RawMessage {
	u.tb.Helper()
	since := ""
	seen := 0
	for {
		query := map[string]string{"filter": ephemeralSyncFilter, "timeout": strconv.Itoa(int(awaitPoll.Milliseconds()))}
		if since != "" {
			query["since"] = since
		}
		var resp struct {
			NextBatch string `json:"next_batch"`
			Rooms     struct {
				Join map[string]struct {
					Ephemeral struct {
						Events []json.RawMessage `json:"events"`
					} `json:"ephemeral"`
				} `json:"join"`
			} `json:"rooms"`
		}
		url := u.Client.BuildURLWithQuery(mautrix.ClientURLPath{"v3", "sync"}, query)
		if _, err := u.Client.MakeRequest(ctx, http.MethodGet, url, nil, &resp); err != nil {
			u.tb.Fatalf("await an ephemeral event in %s as %s (%d seen): %v", room, u.UserID, seen, err)
		}
		for _, ev := range resp.Rooms.Join[room].Ephemeral.Events {
			seen++
			if match(ev) {
				return ev
			}
		}
		since = resp.NextBatch
	}
}

// SetState sets room's eventType state under stateKey to content and
// returns the state event's ID.
func (u *User) SetState(room, eventType, stateKey string, content any) string {
	u.tb.Helper()
	ctx, cancel := u.ctx()
	defer cancel()
	resp, err := u.Client.SendStateEvent(ctx, id.RoomID(room), event.Type{Type: eventType, Class: event.StateEventType}, stateKey, content)
	if err != nil {
		u.fatal("set "+eventType+" in "+room, err)
	}
	return resp.EventID.String()
}
