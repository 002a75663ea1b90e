package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// Bounds of the surface routes.
const (
	// DefaultTypingTimeout is how long a typing notice lasts when the
	// request names no timeout.
	DefaultTypingTimeout = 30 * time.Second
	// MaxTypingTimeout bounds a typing notice.
	MaxTypingTimeout = 120 * time.Second
	// maxReactionGenerations bounds how many times one reaction may be
	// added and withdrawn again.
	maxReactionGenerations = 1000
	// roomSummaryWorkers bounds the homeserver requests a room list makes
	// at once.
	roomSummaryWorkers = 8
)

type reactRequest struct {
	Key string `json:"key"`
}

// reactionKey takes a reaction's key from the query (?key=) or, for a
// POST, a JSON body {"key": ...}.
func reactionKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	key := r.URL.Query().Get("key")
	if key == "" && r.ContentLength != 0 && r.Method == http.MethodPost {
		var req reactRequest
		if !decodeBody(w, r, &req) {
			return "", false
		}
		key = req.Key
	}
	if !journal.ValidReactionKey(key) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "key must be a reaction key: 1 to 64 bytes of text")
		return "", false
	}
	return key, true
}

// reaction is where one reaction stands: the generation to act on, and
// that generation's reaction delivery if it exists.
type reaction struct {
	generation int
	row        journal.Delivery
	exists     bool
}

// findReaction walks a reaction's generations to the first one not
// withdrawn: withdrawn means a withdrawal was enqueued, or the reaction was
// retired or refused before it ever showed.
func findReaction(ctx context.Context, st journal.Outbox, eventID, key string) (reaction, error) {
	for g := 0; g < maxReactionGenerations; g++ {
		d, err := st.Delivery(ctx, journal.ReactionDeliveryID(eventID, key, g), journal.StageFinal)
		if errors.Is(err, journal.ErrNoDelivery) {
			return reaction{generation: g}, nil
		}
		if err != nil {
			return reaction{}, err
		}
		gone := d.State == journal.DeliveryRetired || d.State == journal.DeliveryFailed
		if !gone {
			_, err := st.Delivery(ctx, journal.UnreactDeliveryID(eventID, key, g), journal.StageFinal)
			switch {
			case errors.Is(err, journal.ErrNoDelivery):
				return reaction{generation: g, row: d, exists: true}, nil
			case err != nil:
				return reaction{}, err
			}
		}
	}
	return reaction{}, errTooManyGenerations
}

var errTooManyGenerations = errors.New("the reaction was added and withdrawn too many times")

// reactionAt is findReaction for a route; on false the answer is written.
func (s *server) reactionAt(w http.ResponseWriter, r *http.Request, name string, a Agent, eventID, key string) (reaction, bool) {
	at, err := findReaction(r.Context(), a.Store, eventID, key)
	switch {
	case errors.Is(err, errTooManyGenerations):
		writeError(w, http.StatusConflict, codeConflict, err.Error())
		return at, false
	case err != nil:
		s.fail(w, r, name, err)
		return at, false
	}
	return at, true
}

// reactTarget reads the event a reaction route names.
func (s *server) reactTarget(w http.ResponseWriter, r *http.Request, name string, a Agent) (journal.AdmittedEvent, string, string, bool) {
	eventID := r.PathValue("event_id")
	if !journal.ValidEventID(eventID) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "event_id is not an event ID")
		return journal.AdmittedEvent{}, "", "", false
	}
	key, ok := reactionKey(w, r)
	if !ok {
		return journal.AdmittedEvent{}, "", "", false
	}
	e, seen, err := a.Store.AdmittedEvent(r.Context(), eventID)
	if err != nil {
		s.fail(w, r, name, err)
		return e, "", "", false
	}
	if !seen {
		writeError(w, http.StatusNotFound, codeNotFound, "no event has this ID")
		return e, "", "", false
	}
	return e, eventID, key, true
}

// react adds a reaction to an event, once per (event, key): the same
// reaction asked for again is the same delivery. A reaction withdrawn
// (DELETE) and then asked for again is a new one.
func (s *server) react(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	e, eventID, key, ok := s.reactTarget(w, r, name, a)
	if !ok {
		return
	}
	// One lock for every generation of the event's reactions.
	defer s.lock(name, eventID)()
	at, ok := s.reactionAt(w, r, name, a, eventID, key)
	switch {
	case !ok:
		return
	case at.exists:
		writeJSON(w, http.StatusOK, delivered(a.Store.Principal(), at.row, "replayed"))
		return
	}
	enq, err := journal.ReactionRequest(e.RoomID, eventID, key, at.generation)
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	s.enqueue(w, r, name, a, enq)
}

// unreact withdraws a reaction, once: never sent, it is retired; shown, it
// is redacted through the outbox. Withdrawing one already withdrawn is the
// same withdrawal.
func (s *server) unreact(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	e, eventID, key, ok := s.reactTarget(w, r, name, a)
	if !ok {
		return
	}
	ctx := r.Context()
	st := a.Store
	// One lock for every generation of the event's reactions.
	defer s.lock(name, eventID)()
	at, ok := s.reactionAt(w, r, name, a, eventID, key)
	switch {
	case !ok:
		return
	case !at.exists && at.generation == 0:
		writeError(w, http.StatusNotFound, codeNotFound, "the agent has no such reaction on this event")
		return
	case !at.exists:
		s.replayUnreact(w, r, name, a, eventID, key, at.generation-1)
		return
	}
	switch at.row.State {
	case journal.DeliveryQueued:
		err := st.Retire(ctx, at.row.DeliveryID, journal.StageFinal)
		if errors.Is(err, journal.ErrNotClaimable) {
			writeError(w, http.StatusConflict, codeConflict, "the reaction is being sent; try again")
			return
		}
		if err != nil {
			s.fail(w, r, name, err)
			return
		}
		at.row.State = journal.DeliveryRetired
		writeJSON(w, http.StatusOK, delivered(st.Principal(), at.row, "withdrawn"))
	case journal.DeliveryAcknowledged:
		enq, err := journal.UnreactRequest(e.RoomID, eventID, key, at.generation, at.row.EventID)
		if err != nil {
			s.fail(w, r, name, err)
			return
		}
		s.enqueue(w, r, name, a, enq)
	default:
		writeError(w, http.StatusConflict, codeConflict, "the reaction is being sent; try again")
	}
}

// replayUnreact answers a withdrawal asked for again: the generation's
// withdrawal, or its retired reaction.
func (s *server) replayUnreact(w http.ResponseWriter, r *http.Request, name string, a Agent, eventID, key string, g int) {
	p := a.Store.Principal()
	d, err := a.Store.Delivery(r.Context(), journal.UnreactDeliveryID(eventID, key, g), journal.StageFinal)
	if errors.Is(err, journal.ErrNoDelivery) {
		d, err = a.Store.Delivery(r.Context(), journal.ReactionDeliveryID(eventID, key, g), journal.StageFinal)
	}
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	writeJSON(w, http.StatusOK, delivered(p, d, "replayed"))
}

type typingRequest struct {
	Typing *bool `json:"typing"`
	// TimeoutMS is how long the notice lasts unless renewed (default 30 s,
	// at most 120 s).
	TimeoutMS *int64 `json:"timeout_ms"`
}

// typing shows or stops showing the agent typing: straight to the
// homeserver, never journaled, and best-effort by nature.
func (s *server) typing(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	room := r.PathValue("room_id")
	if !journal.ValidRoomID(room) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "room_id is not a room ID")
		return
	}
	var req typingRequest
	if !decodeBody(w, r, &req) {
		return
	}
	timeout := DefaultTypingTimeout
	switch {
	case req.Typing == nil:
		writeError(w, http.StatusBadRequest, codeBadRequest, "typing (true or false) is required")
		return
	case req.TimeoutMS != nil && (*req.TimeoutMS <= 0 || *req.TimeoutMS > MaxTypingTimeout.Milliseconds()):
		writeError(w, http.StatusBadRequest, codeBadRequest, "timeout_ms must be from 1 to "+
			strconv.FormatInt(MaxTypingTimeout.Milliseconds(), 10))
		return
	case req.TimeoutMS != nil:
		timeout = time.Duration(*req.TimeoutMS) * time.Millisecond
	}
	if !s.hasHomeserver(w, a) {
		return
	}
	if err := a.Homeserver.Typing(r.Context(), room, *req.Typing, timeout); err != nil {
		s.failUpstream(w, r, name, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"room_id": room, "typing": *req.Typing})
}

func (s *server) hasHomeserver(w http.ResponseWriter, a Agent) bool {
	if a.Homeserver == nil {
		writeError(w, http.StatusNotImplemented, codeNotImplemented, "this agent has no homeserver connection here")
		return false
	}
	return true
}

// roomItem is one joined room as the list shows it.
type roomItem struct {
	RoomID    string `json:"room_id"`
	Name      string `json:"name"`
	Topic     string `json:"topic,omitempty"`
	Encrypted bool   `json:"encrypted"`
	Members   int    `json:"members"`
	// Epoch is the agent's membership epoch of the room.
	Epoch int64 `json:"epoch"`
	// NewestMessageTS is the server time of the newest visible message of
	// the room's main timeline, 0 when none is journaled.
	NewestMessageTS int64 `json:"newest_message_ts"`
	// Pending counts the room's events owed their turn.
	Pending int64 `json:"pending"`
}

// rooms lists the rooms the agent is joined to: the homeserver says which
// and describes each, the journal adds what it holds of them.
func (s *server) rooms(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	if !s.hasHomeserver(w, a) {
		return
	}
	ctx := r.Context()
	joined, err := a.Homeserver.JoinedRooms(ctx)
	if err != nil {
		s.failUpstream(w, r, name, err)
		return
	}
	known, err := a.Store.Rooms(ctx)
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	activity := make(map[string]journal.RoomActivity, len(known))
	for _, k := range known {
		activity[k.RoomID] = k
	}
	sort.Strings(joined)
	items := make([]roomItem, len(joined))
	errs := make([]error, len(joined))
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(roomSummaryWorkers, len(joined)) {
		wg.Go(func() {
			for i := range work {
				sum, err := a.Homeserver.RoomSummary(ctx, joined[i])
				k := activity[joined[i]]
				items[i] = roomItem{RoomID: joined[i], Name: sum.Name, Topic: sum.Topic, Encrypted: sum.Encrypted,
					Members: sum.Members, Epoch: k.Epoch, NewestMessageTS: k.NewestTS, Pending: k.Pending}
				errs[i] = err
			}
		})
	}
	for i := range joined {
		work <- i
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		s.failUpstream(w, r, name, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"rooms": items})
}

// members lists a room's joined members, as the homeserver has them.
func (s *server) members(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	room := r.PathValue("room_id")
	if !journal.ValidRoomID(room) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "room_id is not a room ID")
		return
	}
	if !s.hasHomeserver(w, a) {
		return
	}
	members, err := a.Homeserver.JoinedMembers(r.Context(), room)
	if err != nil {
		s.failUpstream(w, r, name, err)
		return
	}
	if members == nil {
		members = []Member{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"room_id": room, "members": members})
}

// media streams a file through the homeserver's authenticated media API,
// capped. A file of unknown length is read whole (within the cap) before
// the answer starts, so a file past the cap is refused, never cut short.
func (s *server) media(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	key, ctype, err := fileKey(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, err.Error())
		return
	}
	if !s.hasHomeserver(w, a) {
		return
	}
	m, err := a.Homeserver.Download(r.Context(), r.PathValue("server"), r.PathValue("media_id"), s.maxMedia)
	if err != nil {
		s.failUpstream(w, r, name, err)
		return
	}
	defer m.Body.Close()
	if m.Length > s.maxMedia {
		s.failUpstream(w, r, name, ErrMediaTooLarge)
		return
	}
	var body io.Reader = io.LimitReader(m.Body, s.maxMedia)
	length := m.Length
	if length < 0 || key != nil {
		buf, err := io.ReadAll(io.LimitReader(m.Body, s.maxMedia+1))
		switch {
		case errors.Is(err, ErrMediaTooLarge), err == nil && int64(len(buf)) > s.maxMedia:
			s.failUpstream(w, r, name, ErrMediaTooLarge)
			return
		case err != nil:
			s.failUpstream(w, r, name, err)
			return
		}
		if key != nil {
			// Decrypted whole: the hash is checked before a byte goes out,
			// so a file altered on the homeserver is refused, never served.
			if err := key.DecryptInPlace(buf); err != nil {
				s.failUpstream(w, r, name, errors.Join(ErrBadFile, err))
				return
			}
			m.ContentType = ctype
			if m.ContentType == "" {
				m.ContentType = http.DetectContentType(buf)
			}
		}
		body, length = bytes.NewReader(buf), int64(len(buf))
	}
	h := w.Header()
	ctype = m.ContentType
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	h.Set("Content-Type", ctype)
	h.Set("Content-Length", strconv.FormatInt(length, 10))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	// Shown as a download, never rendered as a page of this origin.
	disp := mime.FormatMediaType("attachment", map[string]string{"filename": m.Filename})
	if m.Filename == "" || disp == "" {
		disp = "attachment"
	}
	h.Set("Content-Disposition", disp)
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := io.Copy(w, body); err != nil && r.Context().Err() == nil {
		s.log.Warn().Err(err).Str("agent", name).Msg("Streaming a file was cut short")
	}
}

// changes streams the rooms whose conversation a commit changed, as
// server-sent events: "change" with {"room_id"} once per room
// per wake-up, and "resync" when changes may have been missed (every room
// may have changed). It is a wake-up, never the payload: the client reads
// the conversation again.
func (s *server) changes(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	ctx := r.Context()
	sub := a.Hints.SubscribeRooms(a.Store.Principal().String())
	defer sub.Close()
	ev, ok := s.openSSE(w, name)
	if !ok {
		return
	}
	defer ev.close()
	if !ev.start() || !ev.send([]byte(": changes\n\n")) {
		return
	}
	heartbeat := time.NewTicker(s.heartbeat)
	defer heartbeat.Stop()
	var buf []byte
	for {
		select {
		case <-sub.C():
			rooms, all := sub.Rooms()
			sort.Strings(rooms)
			buf = buf[:0]
			if all {
				buf = append(buf, "event: resync\ndata: {}\n\n"...)
			}
			for _, room := range rooms {
				data, _ := json.Marshal(map[string]string{"room_id": room})
				buf = append(buf, "event: change\ndata: "...)
				buf = append(buf, data...)
				buf = append(buf, "\n\n"...)
			}
			if len(buf) > 0 && !ev.send(buf) {
				return
			}
		case <-heartbeat.C:
			if !ev.send([]byte(": keepalive\n\n")) {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}
