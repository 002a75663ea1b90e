package journal_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

var approvalNow = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func approvalRequest() journal.ApprovalRequest {
	return journal.ApprovalRequest{EventID: "$q", CallID: "call-1", Tool: "send_mail",
		Arguments: json.RawMessage(`{"to":"bob@example.org","password":"hunter2"}`), Secret: []string{"password"},
		Approvers: []string{"@alice:example.org"}, ExpiresMS: approvalNow.Add(time.Hour).UnixMilli()}
}

func TestTheSameCallSpelledTwoWaysHasOneIdentity(t *testing.T) {
	a, err := journal.CallHash("t", json.RawMessage(`{"b":1,"a":[1,2]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := journal.CallHash("t", json.RawMessage(`{ "a": [1, 2], "b": 1 }`))
	c, _ := journal.CallHash("u", json.RawMessage(`{"b":1,"a":[1,2]}`))
	d, _ := journal.CallHash("t", json.RawMessage(`{"b":2,"a":[1,2]}`))
	if a != b || a == c || a == d {
		t.Fatalf("hashes %s %s %s %s: the same call must hash alike, another tool or argument differently", a, b, c, d)
	}
}

func TestABadApprovalRequestIsRefusedByField(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*journal.ApprovalRequest)
		want string
	}{
		{"ArgumentsNotJSON", func(r *journal.ApprovalRequest) { r.Arguments = json.RawMessage(`{not json`) }, "arguments"},
		{"ArgumentsNotAnObject", func(r *journal.ApprovalRequest) { r.Arguments = json.RawMessage(`[1]`) }, "arguments"},
		{"ApproverNotAUserID", func(r *journal.ApprovalRequest) { r.Approvers = []string{"alice"} }, "approver"},
		{"ExpiryInThePast", func(r *journal.ApprovalRequest) { r.ExpiresMS = approvalNow.Add(-time.Second).UnixMilli() }, "expires"},
		{"NoCallID", func(r *journal.ApprovalRequest) { r.CallID = "" }, "call_id"},
		{"CallIDWithAControl", func(r *journal.ApprovalRequest) { r.CallID = "a\nb" }, "call_id"},
		{"NoTool", func(r *journal.ApprovalRequest) { r.Tool = "" }, "tool"},
		{"ToolWithASpace", func(r *journal.ApprovalRequest) { r.Tool = "rm -rf" }, "tool"},
		{"EventNotAnEventID", func(r *journal.ApprovalRequest) { r.EventID = "q" }, "event_id"},
		{"TooManyApprovers", func(r *journal.ApprovalRequest) {
			r.Approvers = strings.Split(strings.Repeat("@a:b ", 21), " ")[:21]
		}, "approvers"},
		{"RenderingTooLarge", func(r *journal.ApprovalRequest) { r.Rendering = strings.Repeat("x", 5000) }, "rendering"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := approvalRequest()
			c.edit(&r)
			err := journal.ValidateApproval(r, approvalNow)
			if !errors.Is(err, journal.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ValidateApproval = %v, want an invalid-argument error naming %s", err, c.want)
			}
		})
	}
	if err := journal.ValidateApproval(approvalRequest(), approvalNow); err != nil {
		t.Fatalf("a good request was refused: %v", err)
	}
	for _, c := range []struct {
		ahead time.Duration
		ok    bool
	}{{-time.Second, false}, {0, false}, {time.Minute, true}, {journal.MaxApprovalWindow, true}, {journal.MaxApprovalWindow + time.Second, false}} {
		if err := journal.ValidExpiry(approvalNow.Add(c.ahead).UnixMilli(), approvalNow); (err == nil) != c.ok {
			t.Errorf("ValidExpiry(now%+v) = %v, want ok %v", c.ahead, err, c.ok)
		}
	}
}

func TestTheCardShowsTheCallButNeverASecretArgument(t *testing.T) {
	thread := "$root"
	a := journal.Approval{ApprovalRequest: approvalRequest(), RoomID: "!r:example.org", Thread: &thread, CallHash: "h"}
	raw, err := journal.CardContent(a, journal.DefaultApprovalKeys)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Msgtype string `json:"msgtype"`
		Body    string `json:"body"`
		Relates struct {
			RelType   string `json:"rel_type"`
			EventID   string `json:"event_id"`
			InReplyTo struct {
				EventID string `json:"event_id"`
			} `json:"m.in_reply_to"`
		} `json:"m.relates_to"`
		Marker map[string]string `json:"io.mindroomd.approval"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"send_mail", `to: "bob@example.org"`, "password: (secret)", "@alice:example.org",
		"2026-12-02 13:00 UTC", "✅", "❌", `"approve"`} {
		if !strings.Contains(c.Body, want) {
			t.Errorf("the card lacks %q:\n%s", want, c.Body)
		}
	}
	if strings.Contains(string(raw), "hunter2") {
		t.Fatalf("the card shows a secret argument: %s", raw)
	}
	if c.Msgtype != "m.notice" || c.Relates.RelType != "m.thread" || c.Relates.EventID != "$root" ||
		c.Relates.InReplyTo.EventID != "$q" || c.Marker["call_id"] != "call-1" {
		t.Fatalf("the card is %s, want a notice in the thread replying to the event, marked with its call", raw)
	}
	a.State, a.DecidedBy = journal.ApprovalApproved, "@alice:example.org"
	edit, err := journal.DecisionContent(a)
	if err != nil || !strings.Contains(string(edit), "Approved by @alice:example.org") || strings.Contains(string(edit), "hunter2") {
		t.Fatalf("the decision's edit = %s, %v", edit, err)
	}
	a.Rendering = strings.Repeat("x", 4096)
	a.Arguments = json.RawMessage(`{"a":"` + strings.Repeat("y", 70000) + `"}`)
	if _, err := journal.CardContent(a, journal.DefaultApprovalKeys); err != nil {
		t.Fatalf("a long argument is cut on the card, never refused: %v", err)
	}
}

func TestWhatAnEventSaysOfACard(t *testing.T) {
	keys := journal.DefaultApprovalKeys
	reaction := func(key string) journal.Event {
		return journal.Event{Kind: journal.KindReaction, Sender: "@alice:example.org", Target: "$card",
			Content: json.RawMessage(`{"m.relates_to":{"rel_type":"m.annotation","event_id":"$card","key":"` + key + `"}}`)}
	}
	reply := func(body string) journal.Event {
		b, _ := json.Marshal(body)
		return journal.Event{Kind: journal.KindMessage, Sender: "@alice:example.org",
			Content: json.RawMessage(`{"body":` + string(b) + `,"m.relates_to":{"m.in_reply_to":{"event_id":"$card"}}}`)}
	}
	for _, c := range []struct {
		name    string
		e       journal.Event
		vote    bool
		approve bool
	}{
		{"ApproveReaction", reaction("✅"), true, true},
		{"DenyReaction", reaction("❌"), true, false},
		{"OtherReaction", reaction("👍"), false, false},
		{"ApproveReply", reply("approve"), true, true},
		{"DenyReplyWithAFallbackAndAStop", reply("> <@bot:example.org> Approval needed\n\nDeny."), true, false},
		{"ReplyOfOtherWords", reply("maybe later"), false, false},
		{"PlainMessage", journal.Event{Kind: journal.KindMessage, Content: json.RawMessage(`{"body":"approve"}`)}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, ok := journal.ReadVote(c.e, keys)
			if ok != c.vote || (ok && (v.Approve != c.approve || v.Card != "$card" || v.Sender != "@alice:example.org")) {
				t.Fatalf("ReadVote = %+v, %v; want vote %v approve %v on $card", v, ok, c.vote, c.approve)
			}
		})
	}
}

func TestOnlyAnApproversFirstVoteOnTheCardDecides(t *testing.T) {
	open := journal.Approval{ApprovalRequest: approvalRequest()}
	decided := open
	decided.State = journal.ApprovalDenied
	now := approvalNow.UnixMilli()
	vote := journal.Vote{Card: "$card", Sender: "@alice:example.org", Approve: true}
	stranger := vote
	stranger.Sender = "@mallory:example.org"
	elsewhere := vote
	elsewhere.Card = "$other"
	for _, c := range []struct {
		name   string
		a      journal.Approval
		card   string
		v      journal.Vote
		member bool
		now    int64
		want   journal.VoteOutcome
	}{
		{"TheApproversVoteDecides", open, "$card", vote, true, now, journal.VoteDecides},
		{"AStrangersVoteIsIgnored", open, "$card", stranger, true, now, journal.VoteIgnored},
		{"AVoteOnAnotherEventIsIgnored", open, "$card", elsewhere, true, now, journal.VoteIgnored},
		{"AVoteBeforeTheCardWasAcknowledgedIsIgnored", open, "", vote, true, now, journal.VoteIgnored},
		{"AnApproverNoLongerInTheRoomIsIgnored", open, "$card", vote, false, now, journal.VoteIgnored},
		{"AVoteAfterTheExpiryIsIgnored", open, "$card", vote, true, open.ExpiresMS, journal.VoteIgnored},
		{"ALaterVoteIsConsumed", decided, "$card", vote, true, now, journal.VoteConsumed},
		{"ALaterStrangersVoteIsConsumedToo", decided, "$card", stranger, true, now, journal.VoteConsumed},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := journal.JudgeVote(c.a, c.card, c.v, c.member, c.now); got != c.want {
				t.Fatalf("JudgeVote = %d, want %d", got, c.want)
			}
		})
	}
}
