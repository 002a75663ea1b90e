package dendrite

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"maunium.net/go/mautrix"
)

// Timelines is what one sync says of the joined rooms' timelines: their
// events as raw JSON, and whether the server left some out.
type Timelines struct {
	NextBatch string `json:"next_batch"`
	Rooms     struct {
		Join map[string]Timeline `json:"join"`
	} `json:"rooms"`
}

// Timeline is one joined room's part of a sync.
type Timeline struct {
	Timeline struct {
		Events []json.RawMessage `json:"events"`
		// Limited says the server skipped events between the last sync's
		// and these.
		Limited bool `json:"limited"`
	} `json:"timeline"`
}

// SyncTimelines syncs cli once from since (the start when empty) with
// filter, the server holding the request up to poll when it has nothing
// new.
func SyncTimelines(ctx context.Context, cli *mautrix.Client, filter, since string, poll time.Duration) (Timelines, error) {
	query := map[string]string{"filter": filter, "timeout": strconv.Itoa(int(poll.Milliseconds()))}
	if since != "" {
		query["since"] = since
	}
	var resp Timelines
	url := cli.BuildURLWithQuery(mautrix.ClientURLPath{"v3", "sync"}, query)
	_, err := cli.MakeRequest(ctx, http.MethodGet, url, nil, &resp)
	return resp, err
}
