package api

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/mindroomd/mindroomd/journal"
)

// message is one message of a conversation page or export.
type message struct {
	EventID   string          `json:"event_id"`
	Sender    string          `json:"sender"`
	CreatedTS int64           `json:"created_ts"`
	Content   json.RawMessage `json:"content"`
	// Attachment is the file the message carries, if any: fetch it
	// through the media route.
	Attachment *attachment `json:"attachment,omitempty"`
}

// attachment is a file a message carries.
type attachment struct {
	Msgtype string `json:"msgtype"`
	// URL is the file's mxc:// URI; mxc://{server}/{media_id} is served
	// at media/{server}/{media_id}.
	URL  string          `json:"url"`
	Info json.RawMessage `json:"info,omitempty"`
	// Encrypted is true for a file of an encrypted room, which the
	// homeserver holds encrypted.
	Encrypted bool `json:"encrypted,omitempty"`
	// Path fetches the file in the clear, relative to the agent's routes
	// (/v1/agents/{agent}/): for an encrypted file it carries the file's
	// key, so the API can decrypt it.
	Path string `json:"path"`
}

type messagesResponse struct {
	Messages []message `json:"messages"`
	// NextCursor continues with older messages; null at the start of the
	// conversation.
	NextCursor  *string  `json:"next_cursor"`
	OwedRefetch []string `json:"owed_refetch"`
	// PrunedBefore, on the page that reached the oldest message kept, is
	// the time (unix ms) up to which retention removed the room's
	// messages; absent when it removed none.
	PrunedBefore int64 `json:"pruned_before,omitempty"`
}

func toMessage(m journal.Message) message {
	msg := message{EventID: m.EventID, Sender: m.Sender, CreatedTS: m.CreatedTS, Content: m.Content}
	if msgtype, url, info, ok := journal.MessageAttachment(m.Content); ok {
		msg.Attachment = &attachment{Msgtype: msgtype, URL: url, Info: info}
		msg.Attachment.Path, msg.Attachment.Encrypted = mediaPath(m.Content, url, info)
	}
	return msg
}

// messages serves one page of a conversation, oldest message first. The
// cursor is opaque and bound to its conversation: a cursor of another room
// or thread, or an altered one, is refused.
func (s *server) messages(w http.ResponseWriter, r *http.Request, name string, a Agent) {
	q := r.URL.Query()
	room := r.PathValue("room_id")
	// Checked here, not left to the store: the daemon's reader hydrates a
	// conversation it has not seen from the homeserver before it reads.
	if !journal.ValidRoomID(room) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "room_id is not a room ID")
		return
	}
	thread, ok := threadParam(w, q.Get("thread"))
	if !ok {
		return
	}
	limit, ok := limitParam(w, q.Get("limit"))
	if !ok {
		return
	}
	req := journal.ReadRequest{RoomID: room, Thread: thread, Limit: limit}
	if v := q.Get("strict"); v != "" {
		strict, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, codeBadRequest, "strict must be true or false")
			return
		}
		req.Strict = strict
	}
	if v := q.Get("before"); v != "" {
		cur, err := s.cursors.Decode(room, thread, v)
		if err != nil {
			writeError(w, http.StatusBadRequest, codeBadRequest, "before: "+err.Error())
			return
		}
		req.Before = &cur
	}
	page, err := a.reader().Read(r.Context(), req)
	if err != nil {
		s.fail(w, r, name, err)
		return
	}
	resp := messagesResponse{Messages: make([]message, 0, len(page.Messages)), OwedRefetch: page.OwedRefetch,
		PrunedBefore: page.PrunedBefore}
	for _, m := range page.Messages {
		resp.Messages = append(resp.Messages, toMessage(m))
	}
	if resp.OwedRefetch == nil {
		resp.OwedRefetch = []string{}
	}
	if page.NextCursor != nil {
		token := s.cursors.Encode(room, thread, *page.NextCursor)
		resp.NextCursor = &token
	}
	writeJSON(w, http.StatusOK, resp)
}

// threadParam reads the thread parameter: "" is the room itself.
func threadParam(w http.ResponseWriter, v string) (*string, bool) {
	if v == "" {
		return nil, true
	}
	if !journal.ValidEventID(v) {
		writeError(w, http.StatusBadRequest, codeBadRequest, "thread must be the event ID of a thread root")
		return nil, false
	}
	return &v, true
}

// limitParam reads a page size: DefaultLimit when absent, 1 to MaxLimit
// otherwise.
func limitParam(w http.ResponseWriter, v string) (int, bool) {
	if v == "" {
		return DefaultLimit, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 || n > MaxLimit {
		writeError(w, http.StatusBadRequest, codeBadRequest, "limit must be an integer from 1 to "+strconv.Itoa(MaxLimit))
		return 0, false
	}
	return n, true
}
