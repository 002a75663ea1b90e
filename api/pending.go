package api

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// pendingItem is one pending event as agents see it.
type pendingItem struct {
	// Position is the event's receipt position: pass it as after (or
	// Last-Event-ID) to continue behind it.
	Position int64           `json:"position"`
	EventID  string          `json:"event_id"`
	RoomID   string          `json:"room_id"`
	ThreadID *string         `json:"thread_id"`
	Sender   string          `json:"sender"`
	Content  json.RawMessage `json:"content"`
}

type pendingResponse struct {
	Events    []pendingItem `json:"events"`
	NextAfter int64         `json:"next_after"`
	TimedOut  bool          `json:"timed_out"`
}

// pending serves a page of the principal's pending work in receipt order.
// With wait, an empty backlog is waited on: the request returns as soon as
// a commit brings work, or empty with timed_out once wait has passed.
func (s *server) pending(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	q := r.URL.Query()
	limit, ok := limitParam(w, q.Get("limit"))
	if !ok {
		return
	}
	after, ok := afterParam(w, q.Get("after"), "after")
	if !ok {
		return
	}
	wait, err := parseWait(q.Get("wait"))
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return
	}
	longPoll(r.Context(), a, wait, func(last bool) bool {
		items, next, err := readPending(r.Context(), a.Store, limit, after)
		if err != nil {
			s.fail(w, r, name, err)
			return true
		}
		after = next
		if len(items) == 0 && !last {
			return false
		}
		writeJSON(w, http.StatusOK, pendingResponse{Events: items, NextAfter: next, TimedOut: len(items) == 0 && wait > 0})
		return true
	})
}

// longPoll calls poll until it has answered, waking on each commit of the
// agent, for at most wait: poll returns true once it wrote the answer, and
// last is set on the read that must answer (no wait, or the wait ran
// out). It subscribes before the first read, so a commit between a read
// and the wait still wakes it; a client that goes away ends it.
func longPoll(ctx context.Context, a Agent, wait time.Duration, poll func(last bool) bool) {
	if wait <= 0 {
		poll(true)
		return
	}
	sub := a.Hints.Subscribe(a.Store.Principal().String())
	defer sub.Close()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for !poll(false) {
		select {
		case <-sub.C():
		case <-timer.C:
			poll(true)
			return
		case <-ctx.Done():
			return
		}
	}
}

// readPending reads up to limit pending events after position after. Rows
// whose payload cannot be read are skipped (the principal's own log
// reports them), so a page of them alone never ends the backlog early.
func readPending(ctx context.Context, st journal.PrincipalStore, limit int, after int64) ([]pendingItem, int64, error) {
	for {
		page, err := st.Pending(ctx, limit, after)
		if err != nil {
			return nil, after, err
		}
		items := make([]pendingItem, 0, len(page.Events))
		for _, e := range page.Events {
			item, err := toPendingItem(ctx, st, e)
			if err != nil {
				return nil, after, err
			}
			items = append(items, item)
		}
		after = page.Next
		if len(items) > 0 || !page.More {
			return items, after, nil
		}
	}
}

func toPendingItem(ctx context.Context, st journal.PrincipalStore, e journal.PendingEvent) (pendingItem, error) {
	var ev struct {
		Sender  string          `json:"sender"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(e.Event, &ev); err != nil {
		return pendingItem{}, fmt.Errorf("decode pending event %s: %w", e.EventID, err)
	}
	thread, _, err := st.AdmittedThreadID(ctx, e.RoomID, e.EventID)
	if err != nil {
		return pendingItem{}, err
	}
	if ev.Content == nil {
		ev.Content = json.RawMessage("{}")
	}
	return pendingItem{Position: e.Seq, EventID: e.EventID, RoomID: e.RoomID, ThreadID: thread,
		Sender: ev.Sender, Content: ev.Content}, nil
}

// afterParam reads a receipt position: 0 when absent, never negative.
func afterParam(w http.ResponseWriter, v, what string) (int64, bool) {
	if v == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		writeError(w, http.StatusBadRequest, codeBadRequest, what+" must be a non-negative integer position")
		return 0, false
	}
	return n, true
}

// parseWait reads a long-poll wait: a Go duration ("30s") or a number of
// seconds ("30"), at most MaxWait; absent is no wait.
func parseWait(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		secs, nerr := strconv.ParseFloat(v, 64)
		if nerr != nil || math.IsNaN(secs) || math.IsInf(secs, 0) {
			return 0, fmt.Errorf("wait must be a duration (30s) or a number of seconds")
		}
		// Bounded before the conversion, which would overflow past ~292 years.
		if secs < 0 || secs > MaxWait.Seconds() {
			return 0, fmt.Errorf("wait must be from 0 to %d seconds", int(MaxWait/time.Second))
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d < 0 || d > MaxWait {
		return 0, fmt.Errorf("wait must be from 0 to %d seconds", int(MaxWait/time.Second))
	}
	return d, nil
}
