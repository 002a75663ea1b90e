package journal_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// decoded reads JSON for comparison by value.
func decoded(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return v
}

func TestRelateReplyRelatesTheAnswerToItsSourceAndThread(t *testing.T) {
	root := "$root"
	for _, c := range []struct {
		name    string
		content string
		thread  *string
		want    string
	}{
		{"ARoomMessageIsAReply", `{"msgtype":"m.text","body":"hi"}`, nil,
			`{"msgtype":"m.text","body":"hi","m.relates_to":{"m.in_reply_to":{"event_id":"$q"}}}`},
		{"AThreadMessageIsAGenuineReplyInTheThread", `{"msgtype":"m.text","body":"hi"}`, &root,
			`{"msgtype":"m.text","body":"hi","m.relates_to":{"rel_type":"m.thread","event_id":"$root","is_falling_back":false,"m.in_reply_to":{"event_id":"$q"}}}`},
		{"ARelationOfTheAgentsOwnIsKept", `{"msgtype":"m.text","body":"hi","m.relates_to":{"rel_type":"m.annotation","event_id":"$x","key":"k"}}`, &root,
			`{"msgtype":"m.text","body":"hi","m.relates_to":{"rel_type":"m.annotation","event_id":"$x","key":"k"}}`},
		{"NumbersKeepTheirText", `{"msgtype":"m.text","body":"hi","n":12345678901234567890}`, nil,
			`{"msgtype":"m.text","body":"hi","n":12345678901234567890,"m.relates_to":{"m.in_reply_to":{"event_id":"$q"}}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := journal.RelateReply([]byte(c.content), "$q", c.thread)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(canonical(t, got), canonical(t, []byte(c.want))) {
				t.Fatalf("related:\n %s\nwant\n %s", got, c.want)
			}
			again, _ := journal.RelateReply([]byte(c.content), "$q", c.thread)
			if string(again) != string(got) {
				t.Fatalf("relating twice gave %s then %s", got, again)
			}
		})
	}
}

func canonical(t *testing.T, raw []byte) any {
	t.Helper()
	canon, err := journal.CanonicalJSON(raw)
	if err != nil {
		t.Fatalf("canonical %s: %v", raw, err)
	}
	return string(canon)
}

func TestRelateReplyRefusesContentThatIsNotOneObject(t *testing.T) {
	for _, content := range []string{``, `null`, `[]`, `"text"`, `{"body":"a"} {}`, `{"body":"a","body":"b"}`} {
		if _, err := journal.RelateReply([]byte(content), "$q", nil); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("RelateReply(%q) = %v, want ErrInvalidArgument", content, err)
		}
	}
}

func TestFinalAndPlaceholderRepliesAreTheRequestsOfOneDelivery(t *testing.T) {
	root := "$root"
	content := []byte(`{"msgtype":"m.text","body":"a"}`)
	id := journal.ReplyDeliveryID("$q")
	for _, c := range []struct {
		name string
		got  journal.EnqueueRequest
		want journal.EnqueueRequest
	}{
		{"FinalWithItsRecord", journal.FinalReply("!r:example.org", "$q", &root, content, true),
			journal.EnqueueRequest{DeliveryID: id, Stage: journal.StageFinal, RoomID: "!r:example.org", Thread: &root,
				TurnID: id, Content: content, Sources: []string{"$q"},
				Turn: &journal.TurnRecord{TurnID: id, RoomID: "!r:example.org", State: journal.TurnResultRecorded,
					Sources: []string{"$q"}, Record: content}}},
		{"FinalAlreadyRecorded", journal.FinalReply("!r:example.org", "$q", nil, content, false),
			journal.EnqueueRequest{DeliveryID: id, Stage: journal.StageFinal, RoomID: "!r:example.org",
				TurnID: id, Content: content, Sources: []string{"$q"}}},
		{"PlaceholderWithoutSources", journal.PlaceholderReply("!r:example.org", "$q", &root, content),
			journal.EnqueueRequest{DeliveryID: id, Stage: journal.StageInitial, RoomID: "!r:example.org", Thread: &root,
				Content: content}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !reflect.DeepEqual(c.got, c.want) {
				t.Fatalf("request = %+v\nwant      %+v", c.got, c.want)
			}
			if err := c.got.Validate(); err != nil {
				t.Fatalf("the outbox refuses the request: %v", err)
			}
		})
	}
}

func TestDropsTurnOnlyWhenTheMembershipEnded(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{journal.ErrMembershipEnded, true},
		{fmt.Errorf("enqueue: %w", journal.ErrMembershipEnded), true},
		{journal.ErrDeliveryRetired, true},
		{journal.ErrUnknownSource, false},
		{errors.New("disk full"), false},
	} {
		if got := journal.DropsTurn(c.err); got != c.want {
			t.Errorf("DropsTurn(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
