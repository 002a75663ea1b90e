package journal_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

func TestStreamInProgress(t *testing.T) {
	for status, want := range map[string]bool{
		"pending": true, "streaming": true,
		"completed": false, "error": false, "cancelled": false, "": false, "Streaming": false,
	} {
		if got := journal.StreamInProgress(status); got != want {
			t.Errorf("StreamInProgress(%q) = %v, want %v", status, got, want)
		}
	}
}

func TestIsTransportProgress(t *testing.T) {
	const self = "@bot:example.org"
	edit := func(sender, newContent string) *journal.Event {
		return &journal.Event{Kind: journal.KindEdit, Sender: sender, NewContent: json.RawMessage(newContent)}
	}
	for _, c := range []struct {
		name string
		ev   *journal.Event
		want bool
	}{
		{"OwnStreamingEdit", edit(self, `{"body":"x","io.mindroom.stream_status":"streaming"}`), true},
		{"OwnPendingEdit", edit(self, `{"body":"x","io.mindroom.stream_status":"pending"}`), true},
		{"OwnCompletedEdit", edit(self, `{"body":"x","io.mindroom.stream_status":"completed"}`), false},
		{"OwnErrorEdit", edit(self, `{"body":"x","io.mindroom.stream_status":"error"}`), false},
		{"OwnEditWithoutStatus", edit(self, `{"body":"x"}`), false},
		{"OwnEditWithANonStringStatus", edit(self, `{"body":"x","io.mindroom.stream_status":1}`), false},
		{"SomeoneElsesStreamingEdit", edit("@alice:example.org", `{"body":"x","io.mindroom.stream_status":"streaming"}`), false},
		// Only the new content counts: the outer content of an edit is a fallback.
		{"StatusOnlyInTheFallback", &journal.Event{Kind: journal.KindEdit, Sender: self,
			Content: json.RawMessage(`{"io.mindroom.stream_status":"streaming"}`), NewContent: json.RawMessage(`{"body":"x"}`)}, false},
		{"AStreamingOriginalIsNotAnEdit", &journal.Event{Kind: journal.KindMessage, Sender: self,
			Content: json.RawMessage(`{"body":"x","io.mindroom.stream_status":"streaming"}`)}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := journal.IsTransportProgress(c.ev, self); got != c.want {
				t.Fatalf("IsTransportProgress = %v, want %v", got, c.want)
			}
		})
	}
}

func TestIsSidecarPreview(t *testing.T) {
	for _, c := range []struct {
		name, content string
		want          bool
	}{
		{"Preview", `{"body":"preview","io.mindroom.long_text":{"version":2,"encoding":"matrix_event_content_json"},"url":"mxc://x/y"}`, true},
		{"EncryptedPreview", `{"body":"preview","io.mindroom.long_text":{"version":2},"file":{"url":"mxc://x/y"}}`, true},
		{"EmptyMarker", `{"io.mindroom.long_text":{}}`, true},
		{"PlainText", `{"body":"text","msgtype":"m.text"}`, false},
		{"MarkerNotAnObject", `{"io.mindroom.long_text":true}`, false},
		{"NullMarker", `{"io.mindroom.long_text":null}`, false},
		{"NotJSON", `not json`, false},
		{"Empty", ``, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := journal.IsSidecarPreview(json.RawMessage(c.content)); got != c.want {
				t.Fatalf("IsSidecarPreview(%s) = %v, want %v", c.content, got, c.want)
			}
			if !json.Valid([]byte(c.content)) {
				return
			}
			// Parsing decides the same for a message's content and for an
			// edit's new content, so the writer need not decode either.
			edit := `{"msgtype":"m.text","body":"* x","m.new_content":` + c.content +
				`,"m.relates_to":{"rel_type":"m.replace","event_id":"$target"}}`
			for _, content := range []string{c.content, edit} {
				ev, err := journal.ParseEvent(journal.Inbound{RoomID: "!r:example.org", Provenance: journal.Live,
					Event: json.RawMessage(`{"event_id":"$e","type":"m.room.message","sender":"@a:example.org",` +
						`"origin_server_ts":1,"content":` + content + `}`)}, time.Now())
				if err != nil {
					t.Fatal(err)
				}
				if ev.Preview != c.want {
					t.Fatalf("parsed %s: Preview = %v, want %v", content, ev.Preview, c.want)
				}
			}
		})
	}
}

func TestParsingMarksANoticeAndOnlyANotice(t *testing.T) {
	for msgtype, want := range map[string]bool{"m.notice": true, "m.text": false, "m.emote": false, "M.NOTICE": false} {
		ev, err := journal.ParseEvent(journal.Inbound{RoomID: "!r:example.org", Provenance: journal.Live,
			Event: json.RawMessage(`{"event_id":"$e","type":"m.room.message","sender":"@a:example.org",` +
				`"origin_server_ts":1,"content":{"msgtype":"` + msgtype + `","body":"x"}}`)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if ev.Notice != want {
			t.Fatalf("msgtype %s: Notice = %v, want %v", msgtype, ev.Notice, want)
		}
	}
}

func TestWireContentKeepsLargeIntegersExactly(t *testing.T) {
	for _, c := range []struct {
		name     string
		delivery journal.Delivery
	}{
		{"Plain", journal.Delivery{DeliveryID: "d1", Stage: journal.StageFinal}},
		{"EditOfThePlaceholder", journal.Delivery{DeliveryID: "d1", Stage: journal.StageFinal, ReplacesEventID: "$placeholder"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := c.delivery
			d.Content = json.RawMessage(`{"body":"n","msgtype":"m.text","n":12345678901234567891,"f":-0.000000000000000000012345678901234567,` +
				`"m":9007199254740993,"b":123456789012345678901234567890,"e":1e3,"h":1e400}`)
			wire, err := journal.WireContent(d)
			if err != nil {
				t.Fatal(err)
			}
			for _, literal := range []string{`12345678901234567891`, `-0.000000000000000000012345678901234567`,
				`:9007199254740993`, `:123456789012345678901234567890`, `:1e3`, `:1e400`} {
				if !strings.Contains(string(wire), literal) {
					t.Errorf("wire content %s lost the number %s", wire, literal)
				}
			}
		})
	}
}

func TestWireContentRefusesANonObject(t *testing.T) {
	for _, content := range []string{`[1]`, `"x"`, `null`, `{"a":1} {}`, `{"a":1,"a":2}`, ``} {
		if _, err := journal.WireContent(journal.Delivery{DeliveryID: "d", Stage: journal.StageFinal, Content: json.RawMessage(content)}); err == nil {
			t.Errorf("WireContent(%s) succeeded; want an error", content)
		}
	}
}

// What the outbox accepts, it can send: content WireContent cannot put on
// the wire is refused when it is enqueued, never found out at send time,
// when the reply is already owed and a failure there is permanent.
func TestAnEnqueueRefusesContentItCouldNeverSend(t *testing.T) {
	valid := journal.EnqueueRequest{DeliveryID: "d", Stage: journal.StageFinal, RoomID: "!r:example.org",
		Content: json.RawMessage(`{"body":"x","n":1e400}`)}
	if err := valid.Validate(); err != nil {
		t.Fatalf("Validate(%s): %v", valid.Content, err)
	}
	for _, content := range []string{`null`, `[]`, `"x"`, `{"body":"x","body":"y"}`, `{"a":{"b":1,"b":2}}`, `{"a":1}{}`, `{`, ``} {
		req := valid
		req.Content = json.RawMessage(content)
		if err := req.Validate(); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("Validate(%q) = %v, want %v", content, err, journal.ErrInvalidArgument)
		}
	}
}

func TestAnEditOfThePlaceholderCarriesNoRelationInItsNewContent(t *testing.T) {
	d := journal.Delivery{DeliveryID: "d1", Stage: journal.StageFinal, ReplacesEventID: "$placeholder",
		Content: json.RawMessage(`{"body":"answer","msgtype":"m.text","m.relates_to":{"m.in_reply_to":{"event_id":"$q"}}}`)}
	wire, err := journal.WireContent(d)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		NewContent map[string]json.RawMessage `json:"m.new_content"`
		RelatesTo  struct {
			RelType string `json:"rel_type"`
			EventID string `json:"event_id"`
		} `json:"m.relates_to"`
	}
	if err := json.Unmarshal(wire, &c); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.NewContent["m.relates_to"]; ok {
		t.Errorf("new content %s keeps a relation", wire)
	}
	if c.RelatesTo.RelType != "m.replace" || c.RelatesTo.EventID != "$placeholder" {
		t.Errorf("relation = %+v, want an m.replace of the placeholder", c.RelatesTo)
	}
}
