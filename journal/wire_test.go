package journal_test

import (
	"encoding/json"
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
