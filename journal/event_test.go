package journal_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// parseNow is the clock ParseEvent judges timestamps against.
var parseNow = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

const parseRoom = "!room:example.org"

// wire renders an event from a map, so cases can drop or retype fields.
func wire(t *testing.T, fields map[string]any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(fields)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return b
}

// textEvent is a well-formed text message; tests mutate copies of it.
func textEvent() map[string]any {
	return map[string]any{
		"event_id": "$ev", "type": "m.room.message", "sender": "@alice:example.org", "origin_server_ts": 1000,
		"content": map[string]any{"msgtype": "m.text", "body": "hi"},
	}
}

func withField(key string, value any) map[string]any {
	e := textEvent()
	if value == nil {
		delete(e, key)
	} else {
		e[key] = value
	}
	return e
}

func withContent(c map[string]any) map[string]any { return withField("content", c) }

func parse(t *testing.T, fields map[string]any) (*journal.Event, error) {
	t.Helper()
	return journal.ParseEvent(journal.Inbound{RoomID: parseRoom, Provenance: journal.Live, Event: wire(t, fields)}, parseNow)
}

func TestParseEventRejects(t *testing.T) {
	yearAhead := parseNow.Add(367 * 24 * time.Hour).UnixMilli()
	for _, c := range []struct {
		name  string
		in    journal.Inbound
		field string
	}{
		{"MalformedRoomID", journal.Inbound{RoomID: "room", Provenance: journal.Live, Event: []byte(`{}`)}, "room_id"},
		{"UnknownProvenance", journal.Inbound{RoomID: parseRoom, Provenance: 9, Event: []byte(`{}`)}, "provenance"},
		{"InvalidUTF8", journal.Inbound{RoomID: parseRoom, Provenance: journal.Live, Event: []byte("{\"event_id\":\"$\xff\"}")}, "event"},
		{"InvalidJSON", journal.Inbound{RoomID: parseRoom, Provenance: journal.Live, Event: []byte(`{"event_id":`)}, "event"},
		{"TrailingData", journal.Inbound{RoomID: parseRoom, Provenance: journal.Live, Event: []byte(`{} {}`)}, "event"},
		{"NotAnObject", journal.Inbound{RoomID: parseRoom, Provenance: journal.Live, Event: []byte(`[]`)}, "event"},
	} {
		t.Run(c.name, func(t *testing.T) {
			assertRejected(t, c.in, c.field)
		})
	}
	for _, c := range []struct {
		name   string
		fields map[string]any
		field  string
	}{
		{"MissingEventID", withField("event_id", nil), "event_id"},
		{"EventIDOfTheWrongType", withField("event_id", 7), "event"},
		{"MalformedEventID", withField("event_id", "ev"), "event_id"},
		{"MissingType", withField("type", nil), "type"},
		{"EmptyType", withField("type", ""), "type"},
		{"TypeOfTheWrongType", withField("type", []int{1}), "event"},
		{"MissingSender", withField("sender", nil), "sender"},
		{"MalformedSender", withField("sender", "@alice"), "sender"},
		{"MissingTimestamp", withField("origin_server_ts", nil), "origin_server_ts"},
		{"NullTimestamp", withField("origin_server_ts", json.RawMessage("null")), "origin_server_ts"},
		{"QuotedTimestamp", withField("origin_server_ts", "1000"), "origin_server_ts"},
		{"FractionalTimestamp", withField("origin_server_ts", 1000.5), "origin_server_ts"},
		{"ExponentTimestamp", withField("origin_server_ts", json.RawMessage("1e3")), "origin_server_ts"},
		{"TimestampBeyondInt64", withField("origin_server_ts", json.RawMessage("99999999999999999999")), "origin_server_ts"},
		{"ZeroTimestamp", withField("origin_server_ts", 0), "origin_server_ts"},
		{"NegativeTimestamp", withField("origin_server_ts", -1), "origin_server_ts"},
		{"TimestampMoreThanAYearAhead", withField("origin_server_ts", yearAhead), "origin_server_ts"},
		{"RoomIDDisagrees", withField("room_id", "!other:example.org"), "room_id"},
		{"MissingContent", withField("content", nil), "content"},
		{"NullContent", withField("content", json.RawMessage("null")), "content"},
		{"ContentNotAnObject", withField("content", []string{"hi"}), "content"},
		{"ContentOver64KiB", withContent(map[string]any{"body": strings.Repeat("x", journal.MaxContentBytes)}), "content"},
		{"MsgtypeOfTheWrongType", withContent(map[string]any{"msgtype": 1}), "content"},
		{"RelationOfTheWrongType", withContent(map[string]any{"m.relates_to": []int{}}), "content"},
		{"RelationToAMalformedID", withContent(map[string]any{"m.relates_to": map[string]any{"rel_type": "m.thread", "event_id": "x"}}), "content.m.relates_to.event_id"},
		{"EditWithoutNewContent", withContent(map[string]any{"m.relates_to": map[string]any{"rel_type": "m.replace", "event_id": "$t"}}), "content.m.new_content"},
		{"EditWithNewContentNotAnObject", withContent(map[string]any{"m.new_content": "x", "m.relates_to": map[string]any{"rel_type": "m.replace", "event_id": "$t"}}), "content.m.new_content"},
		{"ReactionWithoutARelation", map[string]any{"event_id": "$r", "type": "m.reaction", "sender": "@a:b", "origin_server_ts": 1, "content": map[string]any{}}, "content.m.relates_to"},
		{"ReactionWithAThreadRelation", map[string]any{"event_id": "$r", "type": "m.reaction", "sender": "@a:b", "origin_server_ts": 1,
			"content": map[string]any{"m.relates_to": map[string]any{"rel_type": "m.thread", "event_id": "$t"}}}, "content.m.relates_to"},
		{"RedactionWithoutATarget", map[string]any{"event_id": "$x", "type": "m.room.redaction", "sender": "@a:b", "origin_server_ts": 1, "content": map[string]any{}}, "redacts"},
		{"RedactionOfAMalformedTarget", map[string]any{"event_id": "$x", "type": "m.room.redaction", "sender": "@a:b", "origin_server_ts": 1, "redacts": "t", "content": map[string]any{}}, "redacts"},
		// The content's target is authoritative; a valid top-level one cannot rescue it.
		{"RedactionWithAMalformedContentTarget", map[string]any{"event_id": "$x", "type": "m.room.redaction", "sender": "@a:b", "origin_server_ts": 1, "redacts": "$t", "content": map[string]any{"redacts": "t"}}, "redacts"},
		{"RedactsOfTheWrongType", map[string]any{"event_id": "$x", "type": "m.room.redaction", "sender": "@a:b", "origin_server_ts": 1, "redacts": 5, "content": map[string]any{}}, "event"},
		{"MembershipWithoutAStateKey", map[string]any{"event_id": "$m", "type": "m.room.member", "sender": "@a:b", "origin_server_ts": 1, "content": map[string]any{"membership": "join"}}, "state_key"},
		{"MembershipWithAMalformedStateKey", map[string]any{"event_id": "$m", "type": "m.room.member", "sender": "@a:b", "origin_server_ts": 1, "state_key": "a", "content": map[string]any{"membership": "join"}}, "state_key"},
		{"MembershipWithoutAMembership", map[string]any{"event_id": "$m", "type": "m.room.member", "sender": "@a:b", "origin_server_ts": 1, "state_key": "@a:b", "content": map[string]any{}}, "content.membership"},
		{"StateKeyOfTheWrongType", withField("state_key", 1), "event"},
	} {
		t.Run(c.name, func(t *testing.T) {
			assertRejected(t, journal.Inbound{RoomID: parseRoom, Provenance: journal.Live, Event: wire(t, c.fields)}, c.field)
		})
	}
}

func assertRejected(t *testing.T, in journal.Inbound, field string) {
	t.Helper()
	ev, err := journal.ParseEvent(in, parseNow)
	if err == nil {
		t.Fatalf("ParseEvent accepted %s as %+v", in.Event, ev)
	}
	if !errors.Is(err, journal.ErrInvalidEvent) {
		t.Fatalf("error %v does not wrap ErrInvalidEvent", err)
	}
	var ee *journal.EventError
	if !errors.As(err, &ee) {
		t.Fatalf("error %v is not an *EventError", err)
	}
	if ee.Field != field {
		t.Fatalf("rejected field = %q (%v), want %q", ee.Field, err, field)
	}
	if !strings.HasPrefix(err.Error(), "invalid event: "+field+": ") {
		t.Fatalf("message %q does not name the field %q", err.Error(), field)
	}
}

func TestParseEventAcceptsTheEdges(t *testing.T) {
	for _, c := range []struct {
		name   string
		fields map[string]any
	}{
		{"TimestampOne", withField("origin_server_ts", 1)},
		{"TimestampWithinTheSkewAllowance", withField("origin_server_ts", parseNow.Add(300*24*time.Hour).UnixMilli())},
		{"MatchingRoomID", withField("room_id", parseRoom)},
		{"ContentOfExactly64KiB", withContent(map[string]any{"b": strings.Repeat("x", journal.MaxContentBytes-len(`{"b":""}`))})},
		{"RelationWithoutAType", withContent(map[string]any{"msgtype": "m.text", "body": "x", "m.relates_to": map[string]any{"m.in_reply_to": map[string]any{"event_id": "$p"}}})},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := parse(t, c.fields); err != nil {
				t.Fatalf("ParseEvent: %v", err)
			}
		})
	}
}

func TestParseEventKinds(t *testing.T) {
	rel := func(relType, target string) map[string]any {
		return map[string]any{"rel_type": relType, "event_id": target}
	}
	ev := func(typ string, content map[string]any, extra ...any) map[string]any {
		e := map[string]any{"event_id": "$ev", "type": typ, "sender": "@alice:example.org", "origin_server_ts": 1000, "content": content}
		for i := 0; i+1 < len(extra); i += 2 {
			e[extra[i].(string)] = extra[i+1]
		}
		return e
	}
	for _, c := range []struct {
		name   string
		fields map[string]any
		kind   journal.Kind
		target string
		thread string
		member string
	}{
		{"Text", ev("m.room.message", map[string]any{"msgtype": "m.text", "body": "x"}), journal.KindMessage, "", "", ""},
		{"Notice", ev("m.room.message", map[string]any{"msgtype": "m.notice", "body": "x"}), journal.KindMessage, "", "", ""},
		{"Emote", ev("m.room.message", map[string]any{"msgtype": "m.emote", "body": "x"}), journal.KindMessage, "", "", ""},
		{"NoMsgtype", ev("m.room.message", map[string]any{"body": "x"}), journal.KindMessage, "", "", ""},
		{"Image", ev("m.room.message", map[string]any{"msgtype": "m.image"}), journal.KindMedia, "", "", ""},
		{"File", ev("m.room.message", map[string]any{"msgtype": "m.file"}), journal.KindMedia, "", "", ""},
		{"Audio", ev("m.room.message", map[string]any{"msgtype": "m.audio"}), journal.KindMedia, "", "", ""},
		{"Video", ev("m.room.message", map[string]any{"msgtype": "m.video"}), journal.KindMedia, "", "", ""},
		{"Sticker", ev("m.sticker", map[string]any{"body": "x"}), journal.KindMedia, "", "", ""},
		{"ThreadReply", ev("m.room.message", map[string]any{"msgtype": "m.text", "m.relates_to": rel("m.thread", "$root")}), journal.KindMessage, "", "$root", ""},
		{"ThreadedImage", ev("m.room.message", map[string]any{"msgtype": "m.image", "m.relates_to": rel("m.thread", "$root")}), journal.KindMedia, "", "$root", ""},
		{"Edit", ev("m.room.message", map[string]any{"msgtype": "m.text", "m.new_content": map[string]any{"body": "y"}, "m.relates_to": rel("m.replace", "$orig")}), journal.KindEdit, "$orig", "", ""},
		{"Reaction", ev("m.reaction", map[string]any{"m.relates_to": map[string]any{"rel_type": "m.annotation", "event_id": "$t", "key": "+1"}}), journal.KindReaction, "$t", "", ""},
		{"RedactionTopLevel", ev("m.room.redaction", map[string]any{}, "redacts", "$old"), journal.KindRedaction, "$old", "", ""},
		{"RedactionInContent", ev("m.room.redaction", map[string]any{"redacts": "$v11"}), journal.KindRedaction, "$v11", "", ""},
		{"RedactionContentWins", ev("m.room.redaction", map[string]any{"redacts": "$inner"}, "redacts", "$outer"), journal.KindRedaction, "$inner", "", ""},
		{"Encrypted", ev("m.room.encrypted", map[string]any{"algorithm": "m.megolm.v1.aes-sha2"}), journal.KindEncrypted, "", "", ""},
		{"Membership", ev("m.room.member", map[string]any{"membership": "leave"}, "state_key", "@bob:example.org"), journal.KindMembership, "", "", "leave"},
		{"OtherState", ev("m.room.topic", map[string]any{"topic": "t"}, "state_key", ""), journal.KindState, "", "", ""},
		{"OtherTimeline", ev("com.example.custom", map[string]any{"x": 1}), journal.KindOther, "", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := parse(t, c.fields)
			if err != nil {
				t.Fatalf("ParseEvent: %v", err)
			}
			if e.Kind != c.kind || e.Target != c.target || e.Thread != c.thread || e.Membership != c.member {
				t.Fatalf("kind %v target %q thread %q membership %q; want %v %q %q %q",
					e.Kind, e.Target, e.Thread, e.Membership, c.kind, c.target, c.thread, c.member)
			}
		})
	}
}

func TestParseEventFields(t *testing.T) {
	e, err := parse(t, map[string]any{
		"event_id": "$ev", "type": "m.room.message", "sender": "@alice:example.org", "origin_server_ts": 1234,
		"unsigned": map[string]any{"age": 1},
		"content": map[string]any{
			"msgtype": "m.text", "body": "* <new>",
			"m.new_content": map[string]any{"msgtype": "m.text", "body": "<new>", "n": json.RawMessage("12345678901234567890")},
			"m.relates_to":  map[string]any{"rel_type": "m.replace", "event_id": "$orig"},
		},
	})
	if err != nil {
		t.Fatalf("ParseEvent: %v", err)
	}
	if e.ID != "$ev" || e.RoomID != parseRoom || e.Sender != "@alice:example.org" || e.Type != "m.room.message" ||
		e.TS != 1234 || e.Provenance != journal.Live || e.StateKey != nil {
		t.Fatalf("event = %+v", e)
	}
	if got, want := string(e.NewContent), `{"body":"<new>","msgtype":"m.text","n":12345678901234567890}`; got != want {
		t.Fatalf("new content = %s, want %s", got, want)
	}
	if got, want := string(e.Content), `{"body":"* <new>","m.new_content":{"body":"<new>","msgtype":"m.text","n":12345678901234567890},"m.relates_to":{"event_id":"$orig","rel_type":"m.replace"},"msgtype":"m.text"}`; got != want {
		t.Fatalf("content = %s, want %s", got, want)
	}
	// The canonical event carries the room it was delivered in, as sync
	// timelines leave it out.
	want := `{"content":{"body":"* <new>","m.new_content":{"body":"<new>","msgtype":"m.text","n":12345678901234567890},` +
		`"m.relates_to":{"event_id":"$orig","rel_type":"m.replace"},"msgtype":"m.text"},"event_id":"$ev",` +
		`"origin_server_ts":1234,"room_id":"!room:example.org","sender":"@alice:example.org","type":"m.room.message","unsigned":{"age":1}}`
	if got := string(e.Canonical); got != want {
		t.Fatalf("canonical = %s, want %s", got, want)
	}
}

func TestParseEventKeepsTheStateKey(t *testing.T) {
	e, err := parse(t, map[string]any{
		"event_id": "$m", "type": "m.room.member", "sender": "@alice:example.org", "origin_server_ts": 1,
		"state_key": "@bob:example.org", "content": map[string]any{"membership": "invite"},
	})
	if err != nil {
		t.Fatalf("ParseEvent: %v", err)
	}
	if e.StateKey == nil || *e.StateKey != "@bob:example.org" {
		t.Fatalf("state key = %v, want @bob:example.org", e.StateKey)
	}
}

func TestClassify(t *testing.T) {
	const self = "@bot:example.org"
	mk := func(kind journal.Kind, sender string, prov journal.Provenance, content string) *journal.Event {
		ev, err := journal.ParseEvent(journal.Inbound{RoomID: "!r:example.org", Provenance: prov,
			Event: json.RawMessage(`{"event_id":"$e","type":"x.test","sender":"` + sender +
				`","origin_server_ts":1,"content":` + content + `}`)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		ev.Kind = kind // the kind's own parsing is TestParseEvent's
		return ev
	}
	text := `{"msgtype":"m.text","body":"x"}`
	for _, c := range []struct {
		name string
		ev   *journal.Event
		want journal.Class
	}{
		{"LiveText", mk(journal.KindMessage, "@a:b", journal.Live, text), journal.Actionable},
		{"RecoveredText", mk(journal.KindMessage, "@a:b", journal.Recovered, text), journal.Actionable},
		{"HistoryText", mk(journal.KindMessage, "@a:b", journal.History, text), journal.ContextOnly},
		{"Notice", mk(journal.KindMessage, "@a:b", journal.Live, `{"msgtype":"m.notice","body":"x"}`), journal.ContextOnly},
		{"OwnEcho", mk(journal.KindMessage, self, journal.Live, text), journal.ContextOnly},
		{"OwnRecoveredEcho", mk(journal.KindMessage, self, journal.Recovered, text), journal.ContextOnly},
		{"Media", mk(journal.KindMedia, "@a:b", journal.Live, `{"msgtype":"m.image"}`), journal.Actionable},
		{"HistoryMedia", mk(journal.KindMedia, "@a:b", journal.History, `{"msgtype":"m.image"}`), journal.ContextOnly},
		{"Reaction", mk(journal.KindReaction, "@a:b", journal.Live, `{}`), journal.Actionable},
		{"OwnReaction", mk(journal.KindReaction, self, journal.Live, `{}`), journal.ContextOnly},
		{"Redaction", mk(journal.KindRedaction, "@a:b", journal.Live, `{}`), journal.Actionable},
		{"HistoryRedaction", mk(journal.KindRedaction, "@a:b", journal.History, `{}`), journal.ContextOnly},
		{"Edit", mk(journal.KindEdit, "@a:b", journal.Live, text), journal.ContextOnly},
		{"Encrypted", mk(journal.KindEncrypted, "@a:b", journal.Live, `{}`), journal.ContextOnly},
		{"Membership", mk(journal.KindMembership, "@a:b", journal.Live, `{}`), journal.ContextOnly},
		{"State", mk(journal.KindState, "@a:b", journal.Live, `{}`), journal.ContextOnly},
		{"Other", mk(journal.KindOther, "@a:b", journal.Live, `{}`), journal.ContextOnly},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := journal.Classify(c.ev, self); got != c.want {
				t.Fatalf("Classify = %v, want %v", got, c.want)
			}
		})
	}
}

func TestKindPredicates(t *testing.T) {
	for _, c := range []struct {
		kind                journal.Kind
		turnBacked, visible bool
	}{
		{journal.KindMessage, true, true},
		{journal.KindMedia, true, true},
		{journal.KindEdit, false, true},
		{journal.KindReaction, false, false},
		{journal.KindRedaction, false, false},
		{journal.KindMembership, false, false},
		{journal.KindEncrypted, false, false},
		{journal.KindState, false, false},
		{journal.KindOther, false, false},
	} {
		if got := c.kind.TurnBacked(); got != c.turnBacked {
			t.Errorf("%v.TurnBacked() = %v, want %v", c.kind, got, c.turnBacked)
		}
		if got := c.kind.Visible(); got != c.visible {
			t.Errorf("%v.Visible() = %v, want %v", c.kind, got, c.visible)
		}
	}
}
