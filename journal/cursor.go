package journal

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
)

// Cursor token errors.
var (
	// ErrBadCursor reports a cursor token that was altered, truncated, or
	// was never issued by this store.
	ErrBadCursor = errors.New("invalid cursor")
	// ErrCursorConversation reports a valid cursor presented for another
	// conversation than the one it came from.
	ErrCursorConversation = errors.New("cursor belongs to another conversation")
)

// cursorVersion is the first byte of every token; a new layout gets a new
// version so old tokens fail clearly instead of being misread.
const cursorVersion = 1

const (
	cursorConvLen = 8  // conversation fingerprint, in the clear
	cursorMACLen  = 16 // truncated HMAC-SHA256
)

// CursorCodec turns cursors into opaque, URL-safe tokens bound to the
// conversation they came from, and back. Key authenticates tokens, so a
// tampered one is refused instead of silently paging somewhere else.
type CursorCodec struct {
	Key []byte
}

func conversationFingerprint(room string, thread *string) []byte {
	h := sha256.New()
	h.Write([]byte(room))
	h.Write([]byte{0})
	if thread != nil {
		h.Write([]byte(*thread))
	}
	return h.Sum(nil)[:cursorConvLen]
}

func (c CursorCodec) mac(body []byte) []byte {
	m := hmac.New(sha256.New, c.Key)
	m.Write(body)
	return m.Sum(nil)[:cursorMACLen]
}

// Encode returns the token of cur in conversation (room, thread).
func (c CursorCodec) Encode(room string, thread *string, cur Cursor) string {
	body := []byte{cursorVersion}
	body = append(body, conversationFingerprint(room, thread)...)
	body = binary.AppendVarint(body, cur.CreatedTS)
	body = append(body, cur.EventID...)
	return base64.RawURLEncoding.EncodeToString(append(body, c.mac(body)...))
}

// Decode parses a token for conversation (room, thread).
func (c CursorCodec) Decode(room string, thread *string, token string) (Cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) < 1+cursorConvLen+1+cursorMACLen {
		return Cursor{}, fmt.Errorf("%w: malformed token", ErrBadCursor)
	}
	if raw[0] != cursorVersion {
		return Cursor{}, fmt.Errorf("%w: unknown version %d", ErrBadCursor, raw[0])
	}
	body, sum := raw[:len(raw)-cursorMACLen], raw[len(raw)-cursorMACLen:]
	if !hmac.Equal(sum, c.mac(body)) {
		return Cursor{}, fmt.Errorf("%w: token was altered", ErrBadCursor)
	}
	if !bytes.Equal(body[1:1+cursorConvLen], conversationFingerprint(room, thread)) {
		return Cursor{}, ErrCursorConversation
	}
	ts, n := binary.Varint(body[1+cursorConvLen:])
	if n <= 0 {
		return Cursor{}, fmt.Errorf("%w: bad timestamp", ErrBadCursor)
	}
	cur := Cursor{CreatedTS: ts, EventID: string(body[1+cursorConvLen+n:])}
	if !ValidEventID(cur.EventID) {
		return Cursor{}, fmt.Errorf("%w: bad event ID", ErrBadCursor)
	}
	return cur, nil
}
