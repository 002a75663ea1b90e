package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// streamPage is how many pending events a stream reads at a time.
const streamPage = 100

// streamDecisions sends the principal's decisions after the one numbered
// after whose turn is still pending, as events of type "approval" without
// an ID (a pending event's position stays the stream's one cursor), and
// returns the number of the last decision read.
func (s *server) streamDecisions(ctx context.Context, ev *sse, a Agent, after int64) (int64, error) {
	for {
		decisions, seqs, err := a.Store.DecidedAfter(ctx, after, streamPage)
		if err != nil {
			return after, err
		}
		var buf []byte
		for i, d := range decisions {
			after = seqs[i]
			e, seen, err := a.Store.AdmittedEvent(ctx, d.EventID)
			if err != nil {
				return after, err
			}
			if !seen || !e.Pending {
				continue
			}
			_, card, _, err := a.Store.Approval(ctx, d.CallID)
			if err != nil {
				return after, err
			}
			data, err := json.Marshal(viewApproval(d, card))
			if err != nil {
				return after, err
			}
			buf = append(buf, "event: approval\ndata: "...)
			buf = append(buf, data...)
			buf = append(buf, "\n\n"...)
		}
		if len(buf) > 0 && !ev.send(buf) {
			return after, context.Canceled
		}
		if len(decisions) < streamPage {
			return after, nil
		}
	}
}

// sse is one open server-sent events answer, holding a place under its
// agent's stream cap until closed.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	s       *server
	agent   string
	release func()
	// deadlines is false once the writer refused a write deadline.
	deadlines bool
}

// openSSE takes a place under the agent's stream cap; past the cap it
// answers 503 and returns false.
func (s *server) openSSE(w http.ResponseWriter, name string) (*sse, bool) {
	streams := s.streams[name]
	select {
	case streams <- struct{}{}:
	default:
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, codeUnavailable, "too many streams are open")
		return nil, false
	}
	return &sse{w: w, rc: http.NewResponseController(w), s: s, agent: name, deadlines: true,
		release: func() { <-streams }}, true
}

// close gives the stream's place back.
func (e *sse) close() { e.release() }

// renew sets the deadline of the next write. A write deadline is on the
// connection's clock, the wall clock; it is renewed before each write. A
// writer that cannot take one (a wrapper that hides the connection) is
// served without.
func (e *sse) renew() bool {
	if !e.deadlines {
		return true
	}
	err := e.rc.SetWriteDeadline(time.Now().Add(e.s.writeTimeout))
	if errors.Is(err, http.ErrNotSupported) {
		e.deadlines = false
		e.s.log.Warn().Str("agent", e.agent).Msg("Stream writes cannot have a deadline; a client that stops reading keeps its stream")
		return true
	}
	return err == nil
}

// start sends the stream's headers.
func (e *sse) start() bool {
	h := e.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	if !e.renew() {
		return false
	}
	e.w.WriteHeader(http.StatusOK)
	return e.rc.Flush() == nil
}

// send writes b and flushes it, within a renewed deadline.
func (e *sse) send(b []byte) bool {
	if !e.renew() {
		return false
	}
	_, err := e.w.Write(b)
	return err == nil && e.rc.Flush() == nil
}

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
	ctx := r.Context()
	// Subscribed before the first read, so a commit between a read and the
	// wait still wakes the stream.
	sub := a.Hints.Subscribe(a.Store.Principal().String())
	defer sub.Close()
	ev, ok := s.openSSE(w, name)
	if !ok {
		return
	}
	defer ev.close()
	rc, renew := ev.rc, ev.renew
	if !ev.start() {
		return
	}
	heartbeat := time.NewTicker(s.heartbeat)
	defer heartbeat.Stop()
	var (
		buf []byte
		// decided is the stream's cursor over the principal's decisions.
		// It starts at the first: every decision of a turn still pending
		// is sent again on each connection, so a client that reconnects
		// misses none, and needs no cursor of its own for them.
		decided int64
	)
	for {
		var err error
		if decided, err = s.streamDecisions(ctx, ev, a, decided); err != nil {
			if ctx.Err() == nil {
				s.log.Error().Err(err).Str("agent", name).Msg("Pending stream read failed; stream closed")
			}
			return
		}
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
			if !ev.send([]byte(": keepalive\n\n")) {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}
