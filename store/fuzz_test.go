package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const (
	fuzzRoom  = "!fuzz:example.org"
	fuzzSelf  = "@bot:example.org"
	fuzzAlice = "@alice:example.org"
)

// fuzzAdmitSeeds are well-formed events of every shape admission projects,
// then events built to make two readers of one event disagree: keys that
// differ only in case, repeated keys, an oversized field beside a small
// look-alike, integers beyond 64 bits and bytes that are not UTF-8.
func fuzzAdmitSeeds() [][]byte {
	var seeds [][]byte
	for _, e := range []mx.Ev{
		mx.Message("$m1", fuzzAlice, 1000, "hello"),
		mx.Edit("$e1", fuzzAlice, 2000, "$m1", "hello, edited"),
		mx.Edit("$e2", fuzzAlice, 2000, "$never", "held for a target that never comes"),
		mx.ThreadReply("$t1", fuzzAlice, 3000, "$m1", "in the thread"),
		mx.Reaction("$r1", fuzzAlice, 4000, "$m1", "+1"),
		mx.Redaction("$x1", fuzzAlice, 5000, "$m1").With("content", map[string]any{}),
		mx.Redaction("$x2", fuzzAlice, 5000, "$e1").With("redacts", nil),
		mx.Member("$j1", fuzzAlice, 6000, "join"),
		mx.Member("$j2", fuzzSelf, 6000, "leave"),
		mx.Sidecar("$s1", fuzzAlice, 7000, "The first lines..."),
		mx.StreamEdit("$p1", fuzzSelf, 8000, "$m1", "halfway", "streaming"),
		mx.Encrypted("$c1", fuzzAlice, 9000),
	} {
		seeds = append(seeds, e.JSON())
	}
	const head = `"type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1000`
	big := strings.Repeat("x", 70<<10)
	for _, s := range []string{
		`{"event_id":"$h1",` + head + `,"content":{"msgtype":"m.text","MSGTYPE":"m.notice","body":"hi"}}`,
		`{"event_id":"$h2",` + head + `,"content":{"msgtype":"m.text","body":"* x",` +
			`"M.RELATES_TO":{"rel_type":"m.replace","event_id":"$own"},"M.NEW_CONTENT":{"msgtype":"m.text","body":"hijack"}}}`,
		`{"event_id":"$a","EVENT_ID":"$b",` + head + `,"content":{"msgtype":"m.text","body":"hi"}}`,
		`{"event_id":"$h3",` + head + `,"content":{"msgtype":"m.text","body":"hi",` +
			`"m.relates_to":{"event_id":"$own"},"m.relates_to":{"rel_type":"m.replace"}}}`,
		`{"event_id":"$h4",` + head + `,"content":{"msgtype":"m.text","body":"` + big + `"},` +
			`"CONTENT":{"msgtype":"m.text","body":"small"}}`,
		`{"event_id":"$h5",` + head + `,"content":{"msgtype":"m.text","body":"small"},` +
			`"CONTENT":{"msgtype":"m.text","body":"` + big + `"}}`,
		`{"event_id":"$h6","type":"m.room.message","sender":"@alice:example.org",` +
			`"origin_server_ts":123456789012345678901234567890,"content":{"msgtype":"m.text","body":"hi"}}`,
		`{"event_id":"$h7",` + head + `,"content":{"msgtype":"m.text","body":"hi","n":123456789012345678901234567890,"f":1e400}}`,
		`{"event_id":"$h8",` + head + `,"content":{"msgtype":"m.text","body":"` + "\xff\xfe" + ` not UTF-8"}}`,
		`{"event_id":"$h9",` + head + `,"content":{"msgtype":"m.text","body":"\ud800 a lone surrogate"}}`,
		`{"event_id":"$h10",` + head + `,"content":{}} {"trailing":true}`,
		`not JSON at all`,
	} {
		seeds = append(seeds, []byte(s))
	}
	return seeds
}

// FuzzAdmitBatch admits [valid, fuzzed, valid] through a real store and
// checks that whatever the middle event is, the batch commits: both valid
// events are admitted, the fuzzed one is admitted, a duplicate, or
// rejected with an *EventError, the sync token is the batch's, and the room
// still reads. One store serves every input; each input brings event IDs
// and a token of its own.
func FuzzAdmitBatch(f *testing.F) {
	for _, seed := range fuzzAdmitSeeds() {
		f.Add(seed)
	}
	ctx := context.Background()
	s, _ := testsupport.MustOpen(f)
	v, err := s.Principal(ctx, "fuzzer", fuzzSelf)
	if err != nil {
		f.Fatal(err)
	}
	n := 0 // inputs run one at a time within a process
	f.Fuzz(func(t *testing.T, raw []byte) {
		n++
		before := mx.Message(fmt.Sprintf("$fuzz.%d.before", n), fuzzAlice, 1000, "before")
		after := mx.Message(fmt.Sprintf("$fuzz.%d.after", n), fuzzAlice, 1001, "after")
		token := fmt.Sprintf("fuzz-token-%d", n)
		batch := []journal.Inbound{
			before.In(fuzzRoom, journal.Live),
			{RoomID: fuzzRoom, Provenance: journal.Live, Event: raw},
			after.In(fuzzRoom, journal.Live),
		}
		res, err := v.AdmitBatch(ctx, batch, token)
		if err != nil {
			t.Fatalf("AdmitBatch: %v", err)
		}
		if len(res) != len(batch) {
			t.Fatalf("%d results for %d events", len(res), len(batch))
		}
		if got := res[0]; got.Outcome != journal.Admitted || got.EventID != before["event_id"] {
			t.Fatalf("first valid event: %+v, want admitted", got)
		}
		switch got := res[1]; got.Outcome {
		case journal.Admitted, journal.Duplicate:
			if got.Err != nil {
				t.Fatalf("fuzzed event %s with an error: %v", got.Outcome, got.Err)
			}
		case journal.Rejected:
			var ee *journal.EventError
			if !errors.As(got.Err, &ee) || !errors.Is(got.Err, journal.ErrInvalidEvent) {
				t.Fatalf("fuzzed event rejected with %v (%T), want an *EventError", got.Err, got.Err)
			}
		default:
			t.Fatalf("fuzzed event: %+v", got)
		}
		// Only the fuzzed event itself can have taken the second one's ID.
		want := journal.Admitted
		if res[1].Outcome == journal.Admitted && res[1].EventID == after["event_id"] {
			want = journal.Duplicate
		}
		if got := res[2]; got.Outcome != want || got.EventID != after["event_id"] {
			t.Fatalf("second valid event: %+v, want %s", got, want)
		}
		if got, err := v.SyncToken(ctx); err != nil || got != token {
			t.Fatalf("sync token = %q, %v; want %q", got, err, token)
		}
		if _, err := v.Read(ctx, journal.ReadRequest{RoomID: fuzzRoom, Limit: 20}); err != nil {
			t.Fatalf("read the room: %v", err)
		}
	})
}
