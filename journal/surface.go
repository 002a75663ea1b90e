package journal

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The rules of what an agent sends on its own: a message no event asked
// for, a reaction and its withdrawal, and an attachment's content. Each is
// one outbox delivery under an ID derived from what the agent named (a
// key), never from time, so the same request made again after any crash
// names the same row and the homeserver sees one transaction.

// Bounds of what an agent names.
const (
	// MaxIdempotencyKeyBytes bounds a send's idempotency key.
	MaxIdempotencyKeyBytes = 255
	// MaxReactionKeyBytes bounds a reaction's key (an emoji, or a short
	// text some clients allow).
	MaxReactionKeyBytes = 64
)

// Event types the agent surface sends.
const (
	TypeReaction  = "m.reaction"
	TypeRedaction = "m.room.redaction"
	// RelAnnotation is the relation type of a reaction.
	RelAnnotation = "m.annotation"
)

// ValidIdempotencyKey reports whether key may name a send: 1 to
// MaxIdempotencyKeyBytes of printable UTF-8.
func ValidIdempotencyKey(key string) bool {
	return key != "" && len(key) <= MaxIdempotencyKeyBytes && printable(key)
}

// ValidReactionKey reports whether key may be a reaction's key: 1 to
// MaxReactionKeyBytes of UTF-8 with no control characters. Emoji carry
// joiners and variation selectors, which are format characters, so only
// controls and surrounding white space are refused.
func ValidReactionKey(key string) bool {
	return key != "" && len(key) <= MaxReactionKeyBytes && printable(key) && strings.TrimSpace(key) == key
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// keyDigest names an agent-chosen key inside a delivery ID: bounded in
// length and free of the separators IDs use, whatever the key holds.
func keyDigest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// SendDeliveryID names the message an agent posts into roomID under key.
// With the principal in the transaction ID (TxnID), it is derived from
// agent, room and key alone.
func SendDeliveryID(roomID, key string) string { return "send:" + roomID + ":" + keyDigest(key) }

// ReactionDeliveryID names the generation-th reaction with key to eventID:
// generation counts the times the same reaction was withdrawn before, so
// a reaction added again after its withdrawal is a new delivery.
func ReactionDeliveryID(eventID, key string, generation int) string {
	return "react:" + eventID + ":" + keyDigest(key) + generationSuffix(generation)
}

// UnreactDeliveryID names the withdrawal of the reaction
// ReactionDeliveryID(eventID, key, generation) names.
func UnreactDeliveryID(eventID, key string, generation int) string {
	return "unreact:" + eventID + ":" + keyDigest(key) + generationSuffix(generation)
}

func generationSuffix(n int) string {
	if n == 0 {
		return ""
	}
	return "#" + strconv.Itoa(n)
}

// SendRequest is the enqueue request of a message the agent posts into
// roomID under key. content is the message (a JSON object); it goes into
// thread when thread is set, and as a reply to replyTo when that is set
// (replyTo must be an event of that thread, or of the room). It has no
// sources: it settles nothing, and it is authorized by the room's current
// membership.
func SendRequest(roomID, key string, content []byte, thread *string, replyTo string, format ReplyFormat) (EnqueueRequest, error) {
	if !ValidIdempotencyKey(key) {
		return EnqueueRequest{}, fmt.Errorf("%w: the idempotency key must be 1 to %d printable bytes",
			ErrInvalidArgument, MaxIdempotencyKeyBytes)
	}
	var (
		c   []byte
		err error
	)
	if replyTo != "" {
		c, err = RelateReply(content, replyTo, thread, format)
	} else {
		c, err = FormatContent(content, format)
	}
	if err != nil {
		return EnqueueRequest{}, err
	}
	req := EnqueueRequest{DeliveryID: SendDeliveryID(roomID, key), Stage: StageFinal, RoomID: roomID,
		Thread: thread, EventType: DefaultEventType, Content: c}
	return req, req.Validate()
}

// ReactionContent is the content of a reaction with key to eventID.
func ReactionContent(eventID, key string) json.RawMessage {
	c, _ := json.Marshal(map[string]any{"m.relates_to": map[string]string{
		"rel_type": RelAnnotation, "event_id": eventID, "key": key}})
	return c
}

// ReactionRequest is the enqueue request of the generation-th reaction
// with key to eventID, an event of roomID. It settles nothing.
func ReactionRequest(roomID, eventID, key string, generation int) (EnqueueRequest, error) {
	if !ValidReactionKey(key) {
		return EnqueueRequest{}, fmt.Errorf("%w: a reaction key must be 1 to %d bytes of text", ErrInvalidArgument,
			MaxReactionKeyBytes)
	}
	req := EnqueueRequest{DeliveryID: ReactionDeliveryID(eventID, key, generation), Stage: StageFinal,
		RoomID: roomID, EventType: TypeReaction, Content: ReactionContent(eventID, key)}
	return req, req.Validate()
}

// ReactionReply is the enqueue request of a turn answered with a reaction
// to source: the reaction settles source and completes the turn's record,
// which with record set is written in the same transaction.
func ReactionReply(roomID, source, key string, record bool) (EnqueueRequest, error) {
	req, err := ReactionRequest(roomID, source, key, 0)
	if err != nil {
		return req, err
	}
	turn := ReplyDeliveryID(source)
	req.TurnID, req.Sources = turn, []string{source}
	if record {
		req.Turn = &TurnRecord{TurnID: turn, RoomID: roomID, State: TurnResultRecorded,
			Sources: []string{source}, Record: req.Content}
	}
	return req, nil
}

// RecordedReaction reports whether a turn's recorded answer is a reaction
// to source, and its key: a turn retried after a crash sends it again as
// the reaction it was, never as a message.
func RecordedReaction(record []byte, source string) (key string, ok bool) {
	var c struct {
		Relates *struct {
			RelType string `json:"rel_type"`
			EventID string `json:"event_id"`
			Key     string `json:"key"`
		} `json:"m.relates_to"`
		Body *string `json:"body"`
	}
	if json.Unmarshal(record, &c) != nil || c.Relates == nil || c.Body != nil {
		return "", false
	}
	r := c.Relates
	return r.Key, r.RelType == RelAnnotation && r.EventID == source && ValidReactionKey(r.Key)
}

// UnreactRequest is the enqueue request of the withdrawal of a reaction
// the homeserver acknowledged as reactionEventID: a redaction of it.
func UnreactRequest(roomID, eventID, key string, generation int, reactionEventID string) (EnqueueRequest, error) {
	if !ValidEventID(reactionEventID) {
		return EnqueueRequest{}, fmt.Errorf("%w: %q is not an event ID", ErrInvalidArgument, reactionEventID)
	}
	c, _ := json.Marshal(map[string]string{"redacts": reactionEventID})
	req := EnqueueRequest{DeliveryID: UnreactDeliveryID(eventID, key, generation), Stage: StageFinal,
		RoomID: roomID, EventType: TypeRedaction, Content: c}
	return req, req.Validate()
}

// Attachment is a file the homeserver holds, as a message carries it.
type Attachment struct {
	// URL is the file's mxc:// URI.
	URL string
	// File, for a file encrypted before its upload (a file of an
	// encrypted room), is its key as the message carries it: the
	// encrypted-file object without its url, which the content adds.
	File json.RawMessage
	// Name is the file's name, shown by clients without a caption.
	Name string
	// MimeType and Size describe the file (Size in bytes).
	MimeType string
	Size     int64
}

// AttachmentMsgtype is the message type clients show a file of mimeType
// as: an image, a video, a sound or any file.
func AttachmentMsgtype(mimeType string) string {
	switch {
	case strings.HasPrefix(mimeType, "image/"):
		return "m.image"
	case strings.HasPrefix(mimeType, "video/"):
		return "m.video"
	case strings.HasPrefix(mimeType, "audio/"):
		return "m.audio"
	}
	return "m.file"
}

// AttachmentContent is the content of a message carrying a (in "file"
// when a is encrypted, in "url" otherwise): its caption is
// the body when there is one (the file's name then goes in filename, as
// Matrix captions are spelled), the file's name otherwise.
func AttachmentContent(a Attachment, caption string) (json.RawMessage, error) {
	if !strings.HasPrefix(a.URL, "mxc://") {
		return nil, fmt.Errorf("%w: an attachment's URL must be an mxc:// URI", ErrInvalidArgument)
	}
	name := a.Name
	if name == "" {
		name = "file"
	}
	c := map[string]any{
		"msgtype": AttachmentMsgtype(a.MimeType),
		"info":    map[string]any{"mimetype": a.MimeType, "size": a.Size},
	}
	if len(a.File) > 0 {
		var file map[string]any
		if err := json.Unmarshal(a.File, &file); err != nil || file == nil {
			return nil, fmt.Errorf("%w: an attachment's key must be a JSON object", ErrInvalidArgument)
		}
		file["url"] = a.URL
		c["file"] = file
	} else {
		c["url"] = a.URL
	}
	if caption != "" {
		c["body"], c["filename"] = caption, name
	} else {
		c["body"] = name
	}
	return json.Marshal(c)
}

// attachmentMsgtypes are the message types that carry a file.
var attachmentMsgtypes = map[string]bool{"m.image": true, "m.file": true, "m.audio": true, "m.video": true}

// MessageAttachment is the file a message's content carries, if any: its
// message type, its mxc:// URL (or, in an encrypted room, its file's URL)
// and its info as sent.
func MessageAttachment(content []byte) (msgtype, url string, info json.RawMessage, ok bool) {
	var c struct {
		Msgtype string          `json:"msgtype"`
		URL     string          `json:"url"`
		Info    json.RawMessage `json:"info"`
		File    *struct {
			URL string `json:"url"`
		} `json:"file"`
	}
	if json.Unmarshal(content, &c) != nil || !attachmentMsgtypes[c.Msgtype] {
		return "", "", nil, false
	}
	url = c.URL
	if url == "" && c.File != nil {
		url = c.File.URL
	}
	if !strings.HasPrefix(url, "mxc://") {
		return "", "", nil, false
	}
	return c.Msgtype, url, c.Info, true
}
