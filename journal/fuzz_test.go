package journal_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// The fuzz targets judge events as of one fixed moment, in one room, for
// one account; fuzzSelf is who Classify answers for.
var fuzzNow = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

const (
	fuzzRoom  = "!fuzz:example.org"
	fuzzSelf  = "@bot:example.org"
	fuzzAlice = "@alice:example.org"
)

// fuzzOrdinarySeeds are well-formed events of every shape the rules read.
func fuzzOrdinarySeeds() []mx.Ev {
	return []mx.Ev{
		mx.Message("$m1", fuzzAlice, 1000, "hello"),
		mx.Notice("$n1", fuzzAlice, 1000, "a bot speaks"),
		mx.Image("$i1", fuzzAlice, 1000),
		mx.Encrypted("$c1", fuzzAlice, 1000),
		mx.Edit("$e1", fuzzAlice, 2000, "$m1", "hello, edited"),
		mx.ThreadReply("$t1", fuzzAlice, 3000, "$m1", "in the thread"),
		mx.Reaction("$r1", fuzzAlice, 4000, "$m1", "+1"),
		// Both redaction shapes: the target at the top level only (before
		// room version 11) and in the content only (room version 11).
		mx.Redaction("$x1", fuzzAlice, 5000, "$m1").With("content", map[string]any{}),
		mx.Redaction("$x2", fuzzAlice, 5000, "$m1").With("redacts", nil),
		mx.Member("$j1", fuzzAlice, 6000, "join"),
		mx.Sidecar("$s1", fuzzAlice, 7000, "The first lines..."),
		mx.StreamEdit("$p1", fuzzSelf, 8000, "$m1", "halfway", "streaming"),
		mx.StreamEdit("$p2", fuzzSelf, 8001, "$m1", "done", "completed"),
	}
}

// fuzzHostileSeeds are events built to make two readers of one event
// disagree: keys that differ only in case, repeated keys, an oversized
// field beside a small look-alike, integers beyond 64 bits and bytes that
// are not UTF-8.
func fuzzHostileSeeds() [][]byte {
	const head = `"type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1000`
	big := strings.Repeat("x", 70<<10)
	return [][]byte{
		[]byte(`{"event_id":"$h1",` + head + `,"content":{"msgtype":"m.text","MSGTYPE":"m.notice","body":"hi"}}`),
		[]byte(`{"event_id":"$h2",` + head + `,"content":{"msgtype":"m.text","body":"* x",` +
			`"M.RELATES_TO":{"rel_type":"m.replace","event_id":"$own"},"M.NEW_CONTENT":{"msgtype":"m.text","body":"hijack"}}}`),
		[]byte(`{"event_id":"$a","EVENT_ID":"$b",` + head + `,"content":{"msgtype":"m.text","body":"hi"}}`),
		[]byte(`{"event_id":"$h3",` + head + `,"content":{"msgtype":"m.text","body":"hi",` +
			`"m.relates_to":{"event_id":"$own"},"m.relates_to":{"rel_type":"m.replace"}}}`),
		[]byte(`{"event_id":"$h4",` + head + `,"content":{"msgtype":"m.text","body":"` + big + `"},` +
			`"CONTENT":{"msgtype":"m.text","body":"small"}}`),
		[]byte(`{"event_id":"$h5",` + head + `,"content":{"msgtype":"m.text","body":"small"},` +
			`"CONTENT":{"msgtype":"m.text","body":"` + big + `"}}`),
		[]byte(`{"event_id":"$h6","type":"m.room.message","sender":"@alice:example.org",` +
			`"origin_server_ts":123456789012345678901234567890,"content":{"msgtype":"m.text","body":"hi"}}`),
		[]byte(`{"event_id":"$h7",` + head + `,"content":{"msgtype":"m.text","body":"hi","n":123456789012345678901234567890,"f":1e400}}`),
		[]byte(`{"event_id":"$h8",` + head + `,"content":{"msgtype":"m.text","body":"` + "\xff\xfe" + ` not UTF-8"}}`),
		[]byte(`{"event_id":"$h9",` + head + `,"content":{"msgtype":"m.text","body":"\ud800 a lone surrogate"}}`),
		[]byte(`{"event_id":"$h10",` + head + `,"content":{}} {"trailing":true}`),
	}
}

// reading is everything the journal's rules take from a parsed event, as
// one comparable value.
type reading struct {
	ID, Type, Sender, RoomID       string
	TS                             int64
	Kind                           journal.Kind
	Provenance                     journal.Provenance
	StateKey                       string
	HasStateKey                    bool
	Membership, Target, Thread     string
	Notice, Preview                bool
	Class, ClassDeparted           journal.Class
	ClassForSender                 journal.Class
	TransportProgress              bool
	Content, NewContent, Canonical string
}

func readingOf(ev *journal.Event) reading {
	r := reading{
		ID: ev.ID, Type: ev.Type, Sender: ev.Sender, RoomID: ev.RoomID, TS: ev.TS, Kind: ev.Kind,
		Provenance: ev.Provenance, Membership: ev.Membership, Target: ev.Target, Thread: ev.Thread,
		Notice: ev.Notice, Preview: ev.Preview,
		Class:          journal.Classify(ev, fuzzSelf, false),
		ClassDeparted:  journal.Classify(ev, fuzzSelf, true),
		ClassForSender: journal.Classify(ev, ev.Sender, false),
		// Asked for the sender itself, so the stream status is read for
		// every edit, not only the bot's.
		TransportProgress: journal.IsTransportProgress(ev, ev.Sender),
		Content:           string(ev.Content), NewContent: string(ev.NewContent), Canonical: string(ev.Canonical),
	}
	if ev.StateKey != nil {
		r.StateKey, r.HasStateKey = *ev.StateKey, true
	}
	return r
}

// FuzzParseEvent checks that parsing never panics, that every refusal is an
// *EventError of ErrInvalidEvent, and that an accepted event's canonical
// form, the bytes the journal stores and replays, parses again to the very
// same reading: nothing a rule decided on can read differently later.
func FuzzParseEvent(f *testing.F) {
	for _, e := range fuzzOrdinarySeeds() {
		f.Add([]byte(e.JSON()), uint8(journal.Live))
	}
	for _, raw := range fuzzHostileSeeds() {
		f.Add(raw, uint8(journal.Live))
	}
	f.Add([]byte(mx.Message("$m1", fuzzAlice, 1000, "old").JSON()), uint8(journal.History))
	f.Add([]byte(mx.Message("$m1", fuzzAlice, 1000, "any").JSON()), uint8(0))
	f.Fuzz(func(t *testing.T, raw []byte, prov uint8) {
		in := journal.Inbound{RoomID: fuzzRoom, Provenance: journal.Provenance(prov), Event: raw}
		ev, err := journal.ParseEvent(in, fuzzNow)
		if err != nil {
			var ee *journal.EventError
			if !errors.As(err, &ee) || !errors.Is(err, journal.ErrInvalidEvent) {
				t.Fatalf("refusal %v (%T) is not an *EventError wrapping ErrInvalidEvent", err, err)
			}
			if ev != nil {
				t.Fatalf("a refused event came back with %+v", ev)
			}
			return
		}
		again, err := journal.ParseEvent(journal.Inbound{RoomID: fuzzRoom, Provenance: in.Provenance, Event: ev.Canonical}, fuzzNow)
		if err != nil {
			t.Fatalf("canonical form %s is refused: %v", ev.Canonical, err)
		}
		if got, want := readingOf(again), readingOf(ev); got != want {
			t.Fatalf("canonical form reads\n%+v\nwant\n%+v", got, want)
		}
	})
}

// FuzzCanonicalJSON checks that canonicalisation never panics, accepts only
// valid JSON, keeps its meaning, and is a fixed point: the canonical form of
// a canonical form is itself, byte for byte.
func FuzzCanonicalJSON(f *testing.F) {
	for _, e := range fuzzOrdinarySeeds() {
		f.Add([]byte(e.JSON()))
	}
	for _, raw := range fuzzHostileSeeds() {
		f.Add(raw)
	}
	for _, s := range []string{
		`{"b":1,"a":[true,false,null,"<&>"],"c":{"z":{},"y":[]}}`,
		` [ 1 , -0 , 0.5e-3 , 18446744073709551616 ] `,
		`"\u2028\u2029\u0000\/"`,
		`{"a":1,"a":2}`,
		`{"a":1}x`,
		`{"A":1,"a":2,"\u0061 ":3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		out, err := journal.CanonicalJSON(raw)
		if err != nil {
			return
		}
		if !json.Valid(raw) {
			t.Fatalf("accepted %q, which is not JSON", raw)
		}
		if !json.Valid(out) {
			t.Fatalf("canonical form %q of %q is not JSON", out, raw)
		}
		again, err := journal.CanonicalJSON(out)
		if err != nil {
			t.Fatalf("canonical form %q is refused: %v", out, err)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("canonical form is not a fixed point:\n%q\n%q", out, again)
		}
		if got, want := decodeNumbers(t, out), decodeNumbers(t, raw); !reflect.DeepEqual(got, want) {
			t.Fatalf("canonical form %q means %#v, the input %q means %#v", out, got, raw, want)
		}
	})
}

// decodeNumbers decodes JSON the standard way but keeps numbers as their
// literal text, so meaning is compared without float rounding.
func decodeNumbers(t *testing.T, raw []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", raw, err)
	}
	return v
}
