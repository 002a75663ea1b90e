package api

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/mindroomd/mindroomd/journal"
)

// sendRequest is a message the agent posts on its own.
type sendRequest struct {
	Body string `json:"body"`
	// Format is markdown (default) or plain, as for a reply.
	Format string `json:"format"`
	// Msgtype is m.text (default), m.notice or m.emote.
	Msgtype string `json:"msgtype"`
	// Key is the idempotency key, when the Idempotency-Key header does not
	// carry it.
	Key string `json:"key"`
	// Thread, optional, posts into the thread with this root.
	Thread string `json:"thread"`
	// ReplyTo, optional, posts as a reply to this event of the room.
	ReplyTo string `json:"reply_to"`
}

// deliveryResponse reports a delivery an agent asked for.
type deliveryResponse struct {
	DeliveryID string `json:"delivery_id"`
	TxnID      string `json:"txn_id"`
	// Outcome is created (enqueued now), replayed (the same request was
	// taken before; nothing new is sent) or withdrawn (a reaction removed
	// before it was ever sent).
	Outcome string `json:"outcome"`
	// State is where the delivery is: queued, attempted, acknowledged,
	// failed or retired.
	State string `json:"state"`
	// EventID is the event the homeserver gave it, once acknowledged.
	EventID string `json:"event_id,omitempty"`
}

func delivered(p journal.Principal, d journal.Delivery, outcome string) deliveryResponse {
	return deliveryResponse{DeliveryID: d.DeliveryID, TxnID: journal.TxnID(p, d.DeliveryID, d.Stage),
		Outcome: outcome, State: d.State.String(), EventID: d.EventID}
}

var sendMsgtypes = map[string]bool{"m.text": true, "m.notice": true, "m.emote": true}

// send posts a message no event asked for. Its idempotency key names one
// delivery (journal.SendDeliveryID): the same key again answers with that
// delivery and sends nothing, across restarts; the same key with other
// content is a conflict. A file may come with it (multipart/form-data).
func (s *server) send(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	ctx := r.Context()
	room := r.PathValue("room_id")
	if !journal.ValidRoomID(room) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "room_id is not a room ID")
		return
	}
	var req sendRequest
	file, ok := s.readMessage(w, r, a, &req)
	if !ok {
		return
	}
	defer file.remove()
	key, ok := idempotencyKey(w, r, req.Key)
	if !ok {
		return
	}
	thread, ok := optionalEventID(w, req.Thread, "thread")
	if !ok {
		return
	}
	if _, ok := optionalEventID(w, req.ReplyTo, "reply_to"); !ok {
		return
	}
	if req.Msgtype == "" {
		req.Msgtype = "m.text"
	}
	switch {
	case file == nil && req.Body == "":
		writeError(w, http.StatusBadRequest, codeBadRequest, "body is required")
		return
	case !sendMsgtypes[req.Msgtype]:
		writeError(w, http.StatusBadRequest, codeBadRequest, "msgtype must be m.text, m.notice or m.emote")
		return
	case !validFormat(req.Format):
		writeError(w, http.StatusBadRequest, codeBadRequest, "format must be plain or markdown")
		return
	}
	if req.ReplyTo != "" {
		// A reply goes where its target is: into the target's thread when
		// none is named, and never across threads.
		at, seen, err := a.Store.AdmittedThreadID(ctx, room, req.ReplyTo)
		if err != nil {
			s.fail(w, r, name, err)
			return
		}
		if !seen {
			writeError(w, http.StatusNotFound, codeNotFound, "no event of this room has the reply_to ID")
			return
		}
		switch {
		case thread == nil:
			thread = at
		case req.ReplyTo != *thread && (at == nil || *at != *thread):
			writeError(w, http.StatusBadRequest, codeBadRequest, "reply_to is not an event of that thread")
			return
		}
	}
	build := func(att journal.Attachment) (journal.EnqueueRequest, error) {
		content, err := textContent(req.Msgtype, req.Body)
		if file != nil {
			content, err = attachmentContent(file, att, req.Body)
		}
		if err != nil {
			return journal.EnqueueRequest{}, err
		}
		return journal.SendRequest(room, key, content, thread, req.ReplyTo, replyFormat(req.Format))
	}
	st := a.Store
	enq, err := build(journal.Attachment{})
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	defer s.lock(name, enq.DeliveryID)()
	if d, err := st.Delivery(ctx, enq.DeliveryID, journal.StageFinal); err == nil {
		s.replaySend(w, r, name, st.Principal(), d, enq.Content, file != nil)
		return
	} else if !errors.Is(err, journal.ErrNoDelivery) {
		s.fail(w, r, name, err)
		return
	}
	joined, err := st.Joined(ctx, room)
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	if !joined {
		writeError(w, http.StatusConflict, codeConflict, "the agent is not in this room")
		return
	}
	if file != nil {
		// Uploaded before the enqueue: a crash in between leaves an
		// orphan file on the homeserver, never a second message, since
		// the message exists only once the enqueue commits.
		att, ok := s.upload(w, r, name, a, room, file)
		if !ok {
			return
		}
		if enq, err = build(att); err != nil {
			s.fail(w, r, name, err)
			return
		}
	}
	s.enqueue(w, r, name, a, enq)
}

// enqueue writes one source-less delivery and answers with it.
func (s *server) enqueue(w http.ResponseWriter, r *http.Request, name string, a Agent, enq journal.EnqueueRequest) {
	res, err := a.Store.EnqueueAndSettle(r.Context(), enq)
	switch {
	case journal.DropsTurn(err):
		writeError(w, http.StatusConflict, codeConflict, "the agent is not in this room")
		return
	case err != nil:
		s.fail(w, r, name, err)
		return
	}
	writeJSON(w, http.StatusOK, deliveryResponse{DeliveryID: enq.DeliveryID, TxnID: res.TxnID,
		Outcome: "created", State: journal.DeliveryQueued.String()})
}

// replaySend answers a keyed send whose delivery exists: the same content
// is that delivery, other content a conflict.
func (s *server) replaySend(w http.ResponseWriter, r *http.Request, name string, p journal.Principal,
	d journal.Delivery, content json.RawMessage, attachment bool) {
	if len(d.Content) == 0 {
		// Retention cleared the sent message's content: the key, still
		// kept, is all that identifies it.
		writeJSON(w, http.StatusOK, delivered(p, d, "replayed"))
		return
	}
	same, err := sameJSON(d.Content, content)
	if attachment && err == nil {
		same, err = sameButURL(d.Content, content)
	}
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	if !same {
		writeError(w, http.StatusConflict, codeConflict, "the idempotency key was used for a different message")
		return
	}
	writeJSON(w, http.StatusOK, delivered(p, d, "replayed"))
}

// upload hands a spooled file to the homeserver, for a message into room,
// and returns it as the message carries it; on false the answer is
// written.
func (s *server) upload(w http.ResponseWriter, r *http.Request, name string, a Agent, room string, u *upload) (journal.Attachment, bool) {
	f, err := u.open()
	if err == nil {
		defer f.Close()
		var att journal.Attachment
		if att, err = a.Homeserver.Upload(r.Context(), room, u.mimeType, u.name, f, u.size); err == nil {
			return att, true
		}
	}
	s.failUpstream(w, r, name, err)
	return journal.Attachment{}, false
}

// readMessage reads a request's JSON object into v: the body, or the
// message part of a multipart request, whose file it returns spooled (the
// caller removes it). On false the answer is written.
func (s *server) readMessage(w http.ResponseWriter, r *http.Request, a Agent, v any) (*upload, bool) {
	if !multipartRequest(r) {
		return nil, decodeBody(w, r, v)
	}
	if a.Homeserver == nil {
		writeError(w, http.StatusNotImplemented, codeNotImplemented, "this agent cannot upload files here")
		return nil, false
	}
	return readForm(w, r, s.maxMedia, v)
}

// textContent is a text message's content.
func textContent(msgtype, body string) (json.RawMessage, error) {
	return json.Marshal(map[string]string{"msgtype": msgtype, "body": body})
}

// idempotencyKey takes the key from the Idempotency-Key header or the
// body's key field; both given must agree.
func idempotencyKey(w http.ResponseWriter, r *http.Request, field string) (string, bool) {
	key := r.Header.Get("Idempotency-Key")
	switch {
	case key == "" && field == "":
		writeError(w, http.StatusBadRequest, codeBadRequest, "an Idempotency-Key header (or a key field) is required")
		return "", false
	case key != "" && field != "" && key != field:
		writeError(w, http.StatusBadRequest, codeBadRequest, "the Idempotency-Key header and the key field differ")
		return "", false
	case key == "":
		key = field
	}
	if !journal.ValidIdempotencyKey(key) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "the idempotency key must be 1 to 255 bytes of printable text")
		return "", false
	}
	return key, true
}

// optionalEventID reads an optional event ID field.
func optionalEventID(w http.ResponseWriter, v, what string) (*string, bool) {
	if v == "" {
		return nil, true
	}
	if !journal.ValidEventID(v) {
		writeError(w, http.StatusBadRequest, codeBadRequest, what+" is not an event ID")
		return nil, false
	}
	return &v, true
}

func validFormat(f string) bool { return f == "" || f == "plain" || f == "markdown" }

// replyFormat is how a body is sent.
func replyFormat(f string) journal.ReplyFormat {
	if f == "plain" {
		return journal.ReplyPlain
	}
	return journal.ReplyMarkdown
}
