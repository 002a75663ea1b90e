package journal_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
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
			got, err := journal.RelateReply([]byte(c.content), "$q", c.thread, journal.ReplyMarkdown)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(canonical(t, got), canonical(t, []byte(c.want))) {
				t.Fatalf("related:\n %s\nwant\n %s", got, c.want)
			}
			again, _ := journal.RelateReply([]byte(c.content), "$q", c.thread, journal.ReplyMarkdown)
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
		if _, err := journal.RelateReply([]byte(content), "$q", nil, journal.ReplyMarkdown); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("RelateReply(%q) = %v, want ErrInvalidArgument", content, err)
		}
	}
}

func TestRelateReplyRendersMarkdownAsSanitisedHTML(t *testing.T) {
	for _, c := range []struct {
		name, msgtype, body string
		// formatted is the formatted_body expected; "" wants none.
		formatted string
	}{
		{"BoldAndCode", "m.text", "**bold** and `code`", "<p><strong>bold</strong> and <code>code</code></p>"},
		{"AScriptIsStripped", "m.text", "**hi** <script>alert(1)</script>", "<p><strong>hi</strong> </p>"},
		{"AnEventHandlerIsStripped", "m.text", "*x* <b onclick=\"steal()\">y</b>", "<p><em>x</em> <b>y</b></p>"},
		{"AJavascriptLinkLosesItsTarget", "m.text", "[click](javascript:alert(1))", "<p>click</p>"},
		{"ALinkKeepsItsTarget", "m.text", "[docs](https://example.org/a)", `<p><a href="https://example.org/a">docs</a></p>`},
		{"AFencedBlockKeepsItsLanguage", "m.text", "```go\nx := 1\n```", "<pre><code class=\"language-go\">x := 1\n</code></pre>"},
		{"ALineBreakIsALineBreak", "m.text", "**a**\nb", "<p><strong>a</strong><br>\nb</p>"},
		{"ANoticeIsFormattedToo", "m.notice", "# Title", "<h1>Title</h1>"},
		{"AListIsMarkup", "m.text", "- one\n- two", "<ul>\n<li>one</li>\n<li>two</li>\n</ul>"},
		{"PlainTextGetsNoHTML", "m.text", "just words, a URL https://example.org and 3 < 4", ""},
		{"PlainLinesAndParagraphsGetNoHTML", "m.text", "line one\nline two\n\nanother paragraph", ""},
		{"TextWithAnEscapeIsMarkup", "m.text", `a \*literal\* star`, "<p>a *literal* star</p>"},
		{"OnlyAScriptLeavesNothingToFormat", "m.text", "<script>alert(1)</script>", ""},
		{"MediaIsNotFormatted", "m.image", "**x**", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			content, _ := json.Marshal(map[string]string{"msgtype": c.msgtype, "body": c.body})
			got, err := journal.RelateReply(content, "$q", nil, journal.ReplyMarkdown)
			if err != nil {
				t.Fatal(err)
			}
			v := decoded(t, got)
			if v["body"] != c.body {
				t.Fatalf("body = %q, want the source %q", v["body"], c.body)
			}
			if c.formatted == "" {
				if _, ok := v["formatted_body"]; ok || v["format"] != nil {
					t.Fatalf("plain content gained a format: %s", got)
				}
				return
			}
			if v["format"] != journal.HTMLFormat || v["formatted_body"] != c.formatted {
				t.Fatalf("format %v, formatted_body %q; want %q", v["format"], v["formatted_body"], c.formatted)
			}
		})
	}
}

func TestRelateReplyLeavesTheBodyAloneWhenToldPlainOrAlreadyFormatted(t *testing.T) {
	for _, c := range []struct {
		name    string
		content string
		format  journal.ReplyFormat
	}{
		{"Plain", `{"msgtype":"m.text","body":"**bold**"}`, journal.ReplyPlain},
		{"AlreadyFormatted", `{"msgtype":"m.text","body":"**bold**","format":"org.matrix.custom.html","formatted_body":"<b>bold</b>"}`, journal.ReplyMarkdown},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := journal.RelateReply([]byte(c.content), "$q", nil, c.format)
			if err != nil {
				t.Fatal(err)
			}
			v, want := decoded(t, got), decoded(t, []byte(c.content))
			delete(v, "m.relates_to")
			if !reflect.DeepEqual(v, want) {
				t.Fatalf("content became %s, want %s", got, c.content)
			}
		})
	}
}

func TestRelateReplySendsPlainTextWhenTheHTMLWouldNotFit(t *testing.T) {
	// Each line is markup, and its HTML is longer than its source.
	body := strings.Repeat("**b**\n", journal.MaxContentBytes/8)
	content, _ := json.Marshal(map[string]string{"msgtype": "m.text", "body": body})
	got, err := journal.RelateReply(content, "$q", nil, journal.ReplyMarkdown)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) > journal.MaxContentBytes {
		t.Fatalf("related content is %d bytes, over the limit", len(got))
	}
	if _, ok := decoded(t, got)["formatted_body"]; ok {
		t.Fatal("formatted_body kept past the content limit")
	}
	req := journal.FinalReply("!r:example.org", "$q", nil, got, true)
	if err := req.Validate(); err != nil {
		t.Fatalf("the outbox refuses the answer: %v", err)
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
