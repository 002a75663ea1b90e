package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"

	"github.com/mindroomd/mindroomd/journal"
)

type replyRequest struct {
	Body string `json:"body"`
	// Format is "markdown" (default) or "plain". Markdown keeps its source
	// text in body and adds its sanitised HTML rendering as formatted_body
	// when it holds any markup; plain sends body alone.
	Format string `json:"format"`
	// Placeholder sends the reply as the answer's placeholder (the initial
	// stage the final later edits) and leaves the event pending.
	Placeholder bool `json:"placeholder"`
	// RoomID, optional, names the event's room; an event of another room
	// is not found.
	RoomID string `json:"room_id"`
}

// format is how the reply's body is sent.
func (r replyRequest) format() journal.ReplyFormat { return replyFormat(r.Format) }

type replyResponse struct {
	DeliveryID string `json:"delivery_id"`
	TxnID      string `json:"txn_id"`
	// Outcome is created, updated or frozen (what the enqueue did to the
	// outbox row), or replayed when the same reply was already recorded and
	// nothing was enqueued.
	Outcome string `json:"outcome"`
}

// reply answers a pending event. The answer is recorded in its turn record
// in the transaction that enqueues it and settles the event, so posting the
// same reply again finds the record and sends nothing; a different answer
// to an answered event is a conflict.
func (s *server) reply(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	ctx := r.Context()
	eventID := r.PathValue("event_id")
	if !journal.ValidEventID(eventID) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "event_id is not an event ID")
		return
	}
	var req replyRequest
	file, ok := s.readMessage(w, r, a, &req)
	if !ok {
		return
	}
	defer file.remove()
	if !checkReply(w, req, file) {
		return
	}
	answer, err := textContent("m.text", req.Body)
	if file != nil {
		answer, err = attachmentContent(file, journal.Attachment{}, req.Body)
	}
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	st := a.Store
	id := journal.ReplyDeliveryID(eventID)
	defer s.lock(name, eventID)()

	rec, answered, err := st.TurnForEvent(ctx, eventID)
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	if answered {
		s.replayReply(w, r, name, a, rec, eventID, answer, req, file != nil)
		return
	}

	e, seen, err := st.AdmittedEvent(ctx, eventID)
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	if !seen || (req.RoomID != "" && req.RoomID != e.RoomID) {
		writeError(w, http.StatusNotFound, codeNotFound, "no pending event has this ID")
		return
	}
	if !e.Pending {
		writeError(w, http.StatusConflict, codeConflict, "the event is no longer pending and was not answered by a reply")
		return
	}
	if file != nil {
		// Uploaded before the answer is recorded: a crash in between
		// leaves an orphan file on the homeserver, never a second message.
		att, ok := s.upload(w, r, name, a, e.RoomID, file)
		if !ok {
			return
		}
		if answer, err = attachmentContent(file, att, req.Body); err != nil {
			s.fail(w, r, name, err)
			return
		}
	}
	content, err := journal.RelateReply(answer, eventID, e.Thread, req.format())
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	enq := journal.FinalReply(e.RoomID, eventID, e.Thread, content, true)
	if req.Placeholder {
		enq = journal.PlaceholderReply(e.RoomID, eventID, e.Thread, content)
	}
	res, err := st.EnqueueAndSettle(ctx, enq)
	switch {
	case journal.DropsTurn(err):
		// Nothing may answer the event now; it is dropped, as the
		// principal's own turns drop it.
		if _, serr := st.Settle(ctx, eventID); serr != nil {
			s.fail(w, r, name, serr)
			return
		}
		writeError(w, http.StatusConflict, codeConflict, "the membership the event came under has ended")
		return
	case errors.Is(err, journal.ErrUnknownSource):
		writeError(w, http.StatusNotFound, codeNotFound, "no pending event has this ID")
		return
	case err != nil:
		s.fail(w, r, name, err)
		return
	}
	writeJSON(w, http.StatusOK, replyResponse{DeliveryID: id, TxnID: res.TxnID, Outcome: enqueueOutcome(res.Outcome)})
}

// replayReply answers a reply to an event whose answer is recorded: the
// same answer again is the recorded delivery; any other is a conflict.
func (s *server) replayReply(w http.ResponseWriter, r *http.Request, name string, a Agent,
	rec journal.TurnRecord, eventID string, answer json.RawMessage, req replyRequest, attachment bool) {
	if req.Placeholder {
		writeError(w, http.StatusConflict, codeConflict, "the event is already answered")
		return
	}
	thread, _, err := a.Store.AdmittedThreadID(r.Context(), rec.RoomID, eventID)
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	content, err := journal.RelateReply(answer, eventID, thread, req.format())
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	same, err := sameJSON(rec.Record, content)
	if attachment && err == nil {
		same, err = sameButURL(rec.Record, content)
	}
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	if !same {
		writeError(w, http.StatusConflict, codeConflict, "the event is already answered with a different reply")
		return
	}
	id := journal.ReplyDeliveryID(eventID)
	writeJSON(w, http.StatusOK, replyResponse{DeliveryID: id,
		TxnID: journal.TxnID(a.Store.Principal(), id, journal.StageFinal), Outcome: "replayed"})
}

// decodeBody reads one JSON request object of at most MaxReplyBytes into
// v; on false the answer is written.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	err := decodeStrict(http.MaxBytesReader(w, r.Body, MaxReplyBytes), v)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, codeTooLarge, "the request body is larger than 64 KiB")
		return false
	case err != nil:
		writeError(w, http.StatusBadRequest, codeBadRequest, "the request body must be one JSON object: "+err.Error())
		return false
	}
	return true
}

// checkReply refuses a reply request that cannot be sent; file is the
// attachment it carries, if any, whose body is then an optional caption.
func checkReply(w http.ResponseWriter, req replyRequest, file *upload) bool {
	switch {
	case req.Body == "" && file == nil:
		writeError(w, http.StatusBadRequest, codeBadRequest, "body is required")
		return false
	case !validFormat(req.Format):
		writeError(w, http.StatusBadRequest, codeBadRequest, "format must be plain or markdown")
		return false
	case req.RoomID != "" && !journal.ValidRoomID(req.RoomID):
		writeError(w, http.StatusBadRequest, codeBadRequest, "room_id is not a room ID")
		return false
	case file != nil && req.Placeholder:
		writeError(w, http.StatusBadRequest, codeBadRequest, "a placeholder carries no file")
		return false
	}
	return true
}

func enqueueOutcome(o journal.EnqueueOutcome) string {
	switch o {
	case journal.EnqueueCreated:
		return "created"
	case journal.EnqueueUpdated:
		return "updated"
	case journal.EnqueueFrozen:
		return "frozen"
	}
	return "unknown"
}

// sameJSON compares two JSON documents by value: the stored record may be
// spelled differently (key order, spacing) from a fresh encoding.
func sameJSON(a, b json.RawMessage) (bool, error) {
	va, err := decodeNumbers(a)
	if err != nil {
		return false, err
	}
	vb, err := decodeNumbers(b)
	if err != nil {
		return false, err
	}
	return reflect.DeepEqual(va, vb), nil
}

func decodeNumbers(b json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	return v, dec.Decode(&v)
}

// ignore settles a pending event without an answer. A placeholder already
// queued for it is withdrawn; one already sent stays.
func (s *server) ignore(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	eventID := r.PathValue("event_id")
	if !journal.ValidEventID(eventID) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "event_id is not an event ID")
		return
	}
	n, err := a.Store.Settle(r.Context(), eventID)
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	if n == 0 {
		writeError(w, http.StatusNotFound, codeNotFound, "no pending event has this ID")
		return
	}
	err = a.Store.Retire(r.Context(), journal.ReplyDeliveryID(eventID), journal.StageInitial)
	if err != nil && !errors.Is(err, journal.ErrNoDelivery) && !errors.Is(err, journal.ErrNotClaimable) {
		s.log.Warn().Err(err).Str("agent", name).Str("event_id", eventID).Msg("Withdrawing the placeholder failed")
	}
	writeJSON(w, http.StatusOK, map[string]any{"event_id": eventID, "settled": true})
}

// leave asks the principal to leave a room.
func (s *server) leave(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	room := r.PathValue("room_id")
	if !journal.ValidRoomID(room) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "room_id is not a room ID")
		return
	}
	if a.Leave == nil {
		writeError(w, http.StatusNotImplemented, codeNotImplemented, "this agent cannot leave rooms here")
		return
	}
	if err := a.Leave(r.Context(), room); err != nil {
		s.fail(w, r, name, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"room_id": room, "left": true})
}
