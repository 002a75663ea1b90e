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
		{"UnstableThreadReply", ev("m.room.message", map[string]any{"msgtype": "m.text", "m.relates_to": rel("io.element.thread", "$root")}), journal.KindMessage, "", "$root", ""},
		{"UnstableThreadedImage", ev("m.room.message", map[string]any{"msgtype": "m.image", "m.relates_to": rel("io.element.thread", "$root")}), journal.KindMedia, "", "$root", ""},
		{"UnknownRelationStaysOutOfThreads", ev("m.room.message", map[string]any{"msgtype": "m.text", "m.relates_to": rel("org.example.thread", "$root")}), journal.KindMessage, "", "", ""},
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
		name     string
		ev       *journal.Event
		departed bool
		want     journal.Class
	}{
		{"LiveText", mk(journal.KindMessage, "@a:b", journal.Live, text), false, journal.Actionable},
		{"LiveTextAfterALeave", mk(journal.KindMessage, "@a:b", journal.Live, text), true, journal.ContextOnly},
		{"RecoveredTextAfterALeave", mk(journal.KindMessage, "@a:b", journal.Recovered, text), true, journal.ContextOnly},
		{"MediaAfterALeave", mk(journal.KindMedia, "@a:b", journal.Live, `{"msgtype":"m.image"}`), true, journal.ContextOnly},
		{"ReactionAfterALeave", mk(journal.KindReaction, "@a:b", journal.Live, `{}`), true, journal.ContextOnly},
		{"RedactionAfterALeave", mk(journal.KindRedaction, "@a:b", journal.Live, `{}`), true, journal.ContextOnly},
		{"RecoveredText", mk(journal.KindMessage, "@a:b", journal.Recovered, text), false, journal.Actionable},
		{"HistoryText", mk(journal.KindMessage, "@a:b", journal.History, text), false, journal.ContextOnly},
		{"Notice", mk(journal.KindMessage, "@a:b", journal.Live, `{"msgtype":"m.notice","body":"x"}`), false, journal.ContextOnly},
		{"OwnEcho", mk(journal.KindMessage, self, journal.Live, text), false, journal.ContextOnly},
		{"OwnRecoveredEcho", mk(journal.KindMessage, self, journal.Recovered, text), false, journal.ContextOnly},
		{"Media", mk(journal.KindMedia, "@a:b", journal.Live, `{"msgtype":"m.image"}`), false, journal.Actionable},
		{"HistoryMedia", mk(journal.KindMedia, "@a:b", journal.History, `{"msgtype":"m.image"}`), false, journal.ContextOnly},
		{"Reaction", mk(journal.KindReaction, "@a:b", journal.Live, `{}`), false, journal.Actionable},
		{"OwnReaction", mk(journal.KindReaction, self, journal.Live, `{}`), false, journal.ContextOnly},
		{"Redaction", mk(journal.KindRedaction, "@a:b", journal.Live, `{}`), false, journal.Actionable},
		{"HistoryRedaction", mk(journal.KindRedaction, "@a:b", journal.History, `{}`), false, journal.ContextOnly},
		{"Edit", mk(journal.KindEdit, "@a:b", journal.Live, text), false, journal.ContextOnly},
		{"Encrypted", mk(journal.KindEncrypted, "@a:b", journal.Live, `{}`), false, journal.ContextOnly},
		{"Membership", mk(journal.KindMembership, "@a:b", journal.Live, `{}`), false, journal.ContextOnly},
		{"State", mk(journal.KindState, "@a:b", journal.Live, `{}`), false, journal.ContextOnly},
		{"Other", mk(journal.KindOther, "@a:b", journal.Live, `{}`), false, journal.ContextOnly},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := journal.Classify(c.ev, self, c.departed); got != c.want {
				t.Fatalf("Classify = %v, want %v", got, c.want)
			}
		})
	}
}

func TestKindPredicates(t *testing.T) {
	for _, c := range []struct {
		kind                          journal.Kind
		turnBacked, original, visible bool
	}{
		{journal.KindMessage, true, true, true},
		{journal.KindMedia, true, true, true},
		{journal.KindEdit, false, false, true},
		{journal.KindReaction, false, false, false},
		{journal.KindRedaction, false, false, false},
		{journal.KindMembership, false, false, false},
		{journal.KindEncrypted, false, false, false},
		{journal.KindState, false, false, false},
		{journal.KindOther, false, false, false},
	} {
		if got := c.kind.TurnBacked(); got != c.turnBacked {
			t.Errorf("%v.TurnBacked() = %v, want %v", c.kind, got, c.turnBacked)
		}
		if got := c.kind.Original(); got != c.original {
			t.Errorf("%v.Original() = %v, want %v", c.kind, got, c.original)
		}
		if got := c.kind.Visible(); got != c.visible {
			t.Errorf("%v.Visible() = %v, want %v", c.kind, got, c.visible)
		}
	}
}

// Matrix keys are case-sensitive and every client reads the exact ones: a
// key that differs only in case is another key, and no rule may read it.
func TestParsingReadsKeysExactlyAsMatrixSpellsThem(t *testing.T) {
	const self = "@bot:example.org"
	raw := func(s string) journal.Inbound {
		return journal.Inbound{RoomID: parseRoom, Provenance: journal.Live, Event: json.RawMessage(s)}
	}
	for _, c := range []struct {
		name   string
		in     journal.Inbound
		id     string
		kind   journal.Kind
		class  journal.Class
		target string
		thread string
	}{
		{"AnUpperCaseMsgtypeDoesNotMakeANotice", raw(`{"event_id":"$a","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1,` +
			`"content":{"msgtype":"m.text","MSGTYPE":"m.notice","body":"hi"}}`), "$a", journal.KindMessage, journal.Actionable, "", ""},
		{"AnUpperCaseRelationDoesNotMakeAnEdit", raw(`{"event_id":"$a","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1,` +
			`"content":{"msgtype":"m.text","body":"new","M.RELATES_TO":{"rel_type":"m.replace","event_id":"$old"},"M.NEW_CONTENT":{"body":"x"}}}`),
			"$a", journal.KindMessage, journal.Actionable, "", ""},
		{"AnUpperCaseRelationDoesNotMoveAMessageIntoAThread", raw(`{"event_id":"$a","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1,` +
			`"content":{"msgtype":"m.text","body":"x","M.RELATES_TO":{"rel_type":"m.thread","event_id":"$root"}}}`),
			"$a", journal.KindMessage, journal.Actionable, "", ""},
		{"AnUpperCaseRelationTypeDoesNotCount", raw(`{"event_id":"$a","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1,` +
			`"content":{"msgtype":"m.text","body":"x","m.relates_to":{"REL_TYPE":"m.thread","event_id":"$root"}}}`),
			"$a", journal.KindMessage, journal.Actionable, "", ""},
		{"AnUpperCaseEventIDIsNotTheEventID", raw(`{"event_id":"$a","EVENT_ID":"$b","type":"m.room.message","sender":"@alice:example.org",` +
			`"origin_server_ts":1,"content":{"msgtype":"m.text","body":"x"}}`), "$a", journal.KindMessage, journal.Actionable, "", ""},
		{"AnUpperCaseTypeIsNotTheType", raw(`{"event_id":"$a","type":"m.room.message","TYPE":"m.reaction","sender":"@alice:example.org",` +
			`"origin_server_ts":1,"content":{"msgtype":"m.text","body":"x"}}`), "$a", journal.KindMessage, journal.Actionable, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ev, err := journal.ParseEvent(c.in, parseNow)
			if err != nil {
				t.Fatalf("ParseEvent: %v", err)
			}
			if ev.ID != c.id || ev.Kind != c.kind || ev.Target != c.target || ev.Thread != c.thread {
				t.Fatalf("read as id %q kind %v target %q thread %q, want %q %v %q %q", ev.ID, ev.Kind, ev.Target, ev.Thread,
					c.id, c.kind, c.target, c.thread)
			}
			if got := journal.Classify(ev, self, false); got != c.class {
				t.Fatalf("class = %v, want %v", got, c.class)
			}
			// The stored form is the same reading: it parses back to the same event.
			again, err := journal.ParseEvent(journal.Inbound{RoomID: parseRoom, Provenance: journal.Live, Event: ev.Canonical}, parseNow)
			if err != nil {
				t.Fatalf("canonical form does not parse: %v", err)
			}
			if again.ID != ev.ID || again.Kind != ev.Kind || again.Target != ev.Target || again.Thread != ev.Thread || again.Notice != ev.Notice {
				t.Fatalf("canonical form reads as %+v, the event as %+v", again, ev)
			}
		})
	}
	t.Run("TheSizeCheckReadsTheStoredContent", func(t *testing.T) {
		big := strings.Repeat("x", journal.MaxContentBytes)
		assertRejected(t, raw(`{"event_id":"$a","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1,`+
			`"content":{"body":"`+big+`"},"CONTENT":{"body":"small"}}`), "content")
	})
}

// A repeated key has two readings, the first copy and the last, and a rule
// that took one while the stored form kept the other would act on an event
// nobody stored. The event is refused as malformed instead.
func TestAnEventWithARepeatedKeyIsRefused(t *testing.T) {
	for _, c := range []struct{ name, event string }{
		{"RepeatedRelation", `{"event_id":"$a","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1,` +
			`"content":{"body":"x","m.relates_to":{"event_id":"$own"},"m.relates_to":{"rel_type":"m.replace"},"m.new_content":{"body":"y"}}}`},
		{"RepeatedEventID", `{"event_id":"$a","event_id":"$b","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1,"content":{}}`},
		{"RepeatedContent", `{"event_id":"$a","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1,"content":{},"content":{"body":"x"}}`},
		{"RepeatedKeyDeepInUnsigned", `{"event_id":"$a","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1,"content":{},` +
			`"unsigned":{"x":[{"k":1,"k":2}]}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			assertRejected(t, journal.Inbound{RoomID: parseRoom, Provenance: journal.Live, Event: json.RawMessage(c.event)}, "event")
		})
	}
}
