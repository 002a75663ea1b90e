package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// streamPage is how many pending events a stream reads at a time.
const streamPage = 100

// stream serves the principal's pending work as server-sent events: one
// event per pending item, its receipt position as the event ID, then each
// item a commit adds. A client resumes behind the last item it saw with
// Last-Event-ID (or ?after=). Streams are capped: past the cap the client
// is told to come back later.
func (s *server) stream(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	var (
		after int64
		ok    bool
	)
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		after, ok = afterParam(w, v, "Last-Event-ID")
	} else {
		after, ok = afterParam(w, r.URL.Query().Get("after"), "after")
	}
	if !ok {
		return
	}
	select {
	case s.streams <- struct{}{}:
		defer func() { <-s.streams }()
	default:
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, codeUnavailable, "too many pending streams are open")
		return
	}
	ctx := r.Context()
	// Subscribed before the first read, so a commit between a read and the
	// wait still wakes the stream.
	sub := a.Hints.Subscribe(a.Store.Principal().String())
	defer sub.Close()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	heartbeat := time.NewTicker(s.heartbeat)
	defer heartbeat.Stop()
	var buf []byte
	for {
		for {
			items, next, err := readPending(ctx, a.Store, streamPage, after)
			if err != nil {
				if ctx.Err() == nil {
					s.log.Error().Err(err).Str("agent", name).Msg("Pending stream read failed; stream closed")
				}
				return
			}
			for _, it := range items {
				data, err := json.Marshal(it)
				if err != nil {
					s.log.Error().Err(err).Str("agent", name).Msg("Pending stream encode failed; stream closed")
					return
				}
				buf = append(buf[:0], "id: "...)
				buf = strconv.AppendInt(buf, it.Position, 10)
				buf = append(buf, "\ndata: "...)
				buf = append(buf, data...)
				buf = append(buf, "\n\n"...)
				if _, err := w.Write(buf); err != nil {
					return
				}
			}
			after = next
			if len(items) == 0 {
				break
			}
			// Each page goes out as it is read: a long backlog reaches the
			// client while the rest is read.
			if rc.Flush() != nil {
				return
			}
		}
		select {
		case <-sub.C():
		case <-heartbeat.C:
			if _, err := w.Write([]byte(": keepalive\n\n")); err != nil || rc.Flush() != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}
