package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// streamPage is how many pending events a stream reads at a time.
const streamPage = 100

// stream serves the principal's pending work as server-sent events: one
// event per pending item, its receipt position as the event ID, then each
// item a commit adds. A client resumes behind the last item it saw with
// Last-Event-ID (or ?after=). Each agent's streams are capped: past the
// cap the client is told to come back later. Every write has a deadline, so
// a client that stops reading loses its stream instead of keeping its
// place under the cap.
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
	streams := s.streams[name]
	select {
	case streams <- struct{}{}:
		defer func() { <-streams }()
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
	rc := http.NewResponseController(w)
	// A write deadline is on the connection's clock, the wall clock. It is
	// renewed before each page and heartbeat. A writer that cannot take one
	// (a wrapper that hides the connection) is served without.
	deadlines := true
	renew := func() bool {
		if !deadlines {
			return true
		}
		err := rc.SetWriteDeadline(time.Now().Add(s.writeTimeout))
		if errors.Is(err, http.ErrNotSupported) {
			deadlines = false
			s.log.Warn().Str("agent", name).Msg("Pending stream writes cannot have a deadline; a client that stops reading keeps its stream")
			return true
		}
		return err == nil
	}
	if !renew() {
		return
	}
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return
	}
	heartbeat := time.NewTicker(s.heartbeat)
	defer heartbeat.Stop()
	var buf []byte
	for {
		for {
			if !renew() {
				return
			}
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
			if !renew() {
				return
			}
			if _, err := w.Write([]byte(": keepalive\n\n")); err != nil || rc.Flush() != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}
