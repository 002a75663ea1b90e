package journal_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

func TestCursorTokensRoundTripWithinTheirConversation(t *testing.T) {
	codec := journal.CursorCodec{Key: []byte("generation-key")}
	thread := "$root"
	for _, tc := range []struct {
		name   string
		thread *string
		cur    journal.Cursor
	}{
		{"room", nil, journal.Cursor{CreatedTS: 1_790_000_000_123, EventID: "$abc-DEF_123"}},
		{"thread", &thread, journal.Cursor{CreatedTS: 1, EventID: "$x:example.org"}},
		{"negative", nil, journal.Cursor{CreatedTS: -5, EventID: "$y"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := codec.Encode("!room:example.org", tc.thread, tc.cur)
			if strings.ContainsAny(tok, "+/=") {
				t.Fatalf("token %q is not URL-safe", tok)
			}
			got, err := codec.Decode("!room:example.org", tc.thread, tok)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if got != tc.cur {
				t.Fatalf("cursor=%+v, want %+v", got, tc.cur)
			}
		})
	}
}

func TestACursorFromAnotherConversationIsRefused(t *testing.T) {
	codec := journal.CursorCodec{Key: []byte("k")}
	thread := "$root"
	tok := codec.Encode("!a:example.org", nil, journal.Cursor{CreatedTS: 10, EventID: "$e"})
	for name, decode := range map[string]func() error{
		"other room":   func() error { _, err := codec.Decode("!b:example.org", nil, tok); return err },
		"thread of it": func() error { _, err := codec.Decode("!a:example.org", &thread, tok); return err },
	} {
		if err := decode(); !errors.Is(err, journal.ErrCursorConversation) {
			t.Fatalf("%s: err=%v, want ErrCursorConversation", name, err)
		}
	}
}

func TestATamperedCursorIsRefused(t *testing.T) {
	codec := journal.CursorCodec{Key: []byte("k")}
	tok := codec.Encode("!a:example.org", nil, journal.Cursor{CreatedTS: 10, EventID: "$event"})
	flip := []byte(tok)
	flip[len(flip)/2] ^= 0x01 // a middle character: every bit of it counts
	for name, bad := range map[string]string{
		"flipped":   string(flip),
		"truncated": tok[:len(tok)-3],
		"garbage":   "not*base64",
		"empty":     "",
		"other key": journal.CursorCodec{Key: []byte("other")}.Encode("!a:example.org", nil, journal.Cursor{CreatedTS: 10, EventID: "$event"}),
	} {
		if _, err := codec.Decode("!a:example.org", nil, bad); !errors.Is(err, journal.ErrBadCursor) {
			t.Fatalf("%s: err=%v, want ErrBadCursor", name, err)
		}
	}
}
