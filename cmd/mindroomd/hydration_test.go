package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// A thread written before the agent was invited is served, edits applied,
// by a strict read of the daemon's API: the daemon fetches it from the
// homeserver first. None of it becomes work, and the hydration shows in the
// metrics.
func TestAStrictReadThroughTheAPIServesAThreadWrittenBeforeTheAgentWasInvited(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "late", "late-password-77ab")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom()
	root := alice.SendText(room, "an old question")
	var last string
	for i := range 5 {
		last = alice.ThreadReply(room, root, fmt.Sprintf("old reply %d", i))
	}
	alice.Edit(room, last, "old reply 4, edited")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	marker := alice.SendText(room, "marker")
	alice.AwaitEvent(ctx, room, dendrite.WithID(marker))
	alice.Invite(room, bot.UserID)

	const token = "api-token-of-the-late-agent"
	cfg := writeHTTPAgentConfig(t, hs.URL, bot, "late", token)
	d := runInProcess(cfg)
	defer d.stopCleanly(t)
	base := "http://" + daemonAddress(t, d.log) + "/v1/agents/late"
	alice.AwaitEvent(ctx, room, dendrite.Joined(bot.UserID, 1))

	var page struct {
		Messages []struct {
			Content struct {
				Body string `json:"body"`
			} `json:"content"`
		} `json:"messages"`
		OwedRefetch []string `json:"owed_refetch"`
	}
	// Alice sees the agent's join before the agent's own sync brings it
	// back, and until then the journal has the room as left (an invite to
	// a room it never heard of fences it first): a strict read answers 503
	// meanwhile, and is asked again until the join is recorded.
	url := base + "/rooms/" + room + "/messages?strict=true&limit=50&thread=" + root
	for deadline := time.Now().Add(time.Minute); ; {
		code := apiCall(t, "GET", url, token, "", &page)
		if code == http.StatusOK {
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("strict thread read: status %d; the daemon's log:\n%s", code, d.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var got []string
	for _, m := range page.Messages {
		got = append(got, m.Content.Body)
	}
	want := []string{"an old question", "old reply 0", "old reply 1", "old reply 2", "old reply 3", "old reply 4, edited"}
	if !slices.Equal(got, want) || len(page.OwedRefetch) != 0 {
		t.Fatalf("the thread = %q owing %v, want %q", got, page.OwedRefetch, want)
	}
	var pending struct {
		Events []json.RawMessage `json:"events"`
	}
	if code := apiCall(t, "GET", base+"/pending", token, "", &pending); code != http.StatusOK || len(pending.Events) != 0 {
		t.Fatalf("pending after hydration: status %d, %d events; want none", code, len(pending.Events))
	}
	// A read asked before the join was recorded may have started a walk
	// that failed: one walk, and one only, succeeded.
	metrics := metricsOf(t, d.log)
	walks := sampleOf(t, metrics, `mindroomd_hydration_total{agent="late",counted="walks",kind="thread"}`)
	failures := sampleOf(t, metrics, `mindroomd_hydration_total{agent="late",counted="failures",kind="thread"}`)
	if walks-failures != 1 {
		t.Fatalf("the metrics do not count one thread walk that succeeded:\n%s", grepLines(metrics, "mindroomd_hydration"))
	}
}

// sampleOf is the value of the sample series in the metrics text, 0 when
// it has none.
func sampleOf(t *testing.T, metrics, series string) float64 {
	t.Helper()
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	return 0
}

// grepLines keeps the lines of s that contain substr.
func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// pendingIDs lists the agent's pending work through the API.
func pendingIDs(t *testing.T, base, token string) []string {
	t.Helper()
	var page struct {
		Events []struct {
			EventID string `json:"event_id"`
		} `json:"events"`
	}
	if code := apiCall(t, "GET", base+"/pending", token, "", &page); code != http.StatusOK {
		t.Fatalf("pending: status %d", code)
	}
	var ids []string
	for _, e := range page.Events {
		ids = append(ids, e.EventID)
	}
	return ids
}

// A conversation read while the sync lags behind the room must not take
// the messages the sync has yet to bring: fetched first as history, they
// would never be owed an answer.
func TestAReadWhileTheSyncLagsTakesNoMessageTheSyncOwesAsWork(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "lagging", "lagging-password-9c2e")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	proxy := startFaultProxy(t, hs.URL)
	const token = "api-token-of-the-lagging-agent"
	d := runInProcess(writeHTTPAgentConfig(t, proxy.URL, bot, "lagging", token))
	defer d.stopCleanly(t)
	base := "http://" + daemonAddress(t, d.log) + "/v1/agents/lagging"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice.AwaitEvent(ctx, room, dendrite.Joined(bot.UserID, 1))
	first := alice.SendText(room, "first, by sync")
	awaitPendingID(t, base, token, first)

	// The sync fails for a while (the long-poll in flight loses its answer
	// too); meanwhile a message arrives and the room is read, the read's
	// hydration fetching from the homeserver.
	proxy.arm(epSync, fault{status: 502, lost: true})
	for range 50 {
		proxy.arm(epSync, fault{status: 503})
	}
	second := alice.SendText(room, "second, while the sync lags")
	alice.AwaitEvent(ctx, room, dendrite.WithID(second))
	d.awaitLog(t, "Sync failed; retrying from the same token", 1)
	if code := apiCall(t, "GET", base+"/rooms/"+room+"/messages?limit=10", token, "", nil); code != http.StatusOK {
		t.Fatalf("messages: status %d", code)
	}
	proxy.disarm(epSync)
	third := alice.SendText(room, "third, by sync")
	awaitPendingID(t, base, token, third)
	if got := pendingIDs(t, base, token); !slices.Equal(got, []string{first, second, third}) {
		t.Fatalf("pending = %v, want all three messages %v", got, []string{first, second, third})
	}
}

// awaitPendingID waits until eventID is pending work.
func awaitPendingID(t *testing.T, base, token, eventID string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !slices.Contains(pendingIDs(t, base, token), eventID) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never became pending work", eventID)
		}
		var page struct{}
		apiCall(t, "GET", base+"/pending?wait=5s&after=0", token, "", &page)
	}
}
