package journal

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"

	"github.com/microcosm-cc/bluemonday"
	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/renderer/html"
	"github.com/yuin/goldmark/text"
)

// The reply rule: how an answer is related to the event it answers, how its
// body is formatted, and which enqueue requests carry it. The principal's
// own turns and the agent API both answer through it, so an answer made in
// either place is the same bytes and the same delivery.

// ReplyFormat says how RelateReply treats an answer's body.
type ReplyFormat uint8

// Reply formats.
const (
	// ReplyMarkdown reads the body as markdown and, when it holds any
	// markup, adds its rendering as sanitised HTML (formatted_body). The
	// body stays the markdown source, for clients that show plain text.
	ReplyMarkdown ReplyFormat = iota
	// ReplyPlain sends the body as it is, without HTML.
	ReplyPlain
)

// HTMLFormat is the format of a formatted_body in HTML.
const HTMLFormat = "org.matrix.custom.html"

// RelateReply returns content as the answer to source: in source's thread
// when thread is not nil (a genuine reply within it, so is_falling_back is
// false), as a reply to source otherwise. Content that already names a
// relation keeps it. With ReplyMarkdown, a text body written in markdown
// gains its HTML rendering unless the content already carries a format of
// its own, or the rendering would push it past MaxContentBytes (the answer
// then goes out as plain text rather than not at all). The result depends
// on its arguments alone: a replayed answer is recognised by comparing it
// with the recorded one.
func RelateReply(content []byte, source string, thread *string, format ReplyFormat) ([]byte, error) {
	v, err := decodeJSON(content)
	c, ok := v.(map[string]any)
	if err != nil || !ok {
		return nil, fmt.Errorf("%w: agent reply content must be a JSON object", ErrInvalidArgument)
	}
	if _, ok := c["m.relates_to"]; !ok {
		reply := map[string]any{"event_id": source}
		if thread != nil {
			c["m.relates_to"] = map[string]any{"rel_type": RelThread, "event_id": *thread,
				"is_falling_back": false, "m.in_reply_to": reply}
		} else {
			c["m.relates_to"] = map[string]any{"m.in_reply_to": reply}
		}
	}
	return formatContent(c, format)
}

// FormatContent returns content, a JSON object, with its body formatted
// as RelateReply formats an answer's, and no relation added: a message the
// agent posts on its own.
func FormatContent(content []byte, format ReplyFormat) ([]byte, error) {
	v, err := decodeJSON(content)
	c, ok := v.(map[string]any)
	if err != nil || !ok {
		return nil, fmt.Errorf("%w: message content must be a JSON object", ErrInvalidArgument)
	}
	return formatContent(c, format)
}

// formatContent encodes c, adding its markdown rendering when format asks
// for it and the rendering fits.
func formatContent(c map[string]any, format ReplyFormat) ([]byte, error) {
	plain, err := encodeCanonical(c)
	if err != nil || format != ReplyMarkdown {
		return plain, err
	}
	formatted, ok := formatMarkdown(c)
	if !ok {
		return plain, nil
	}
	c["format"], c["formatted_body"] = HTMLFormat, formatted
	rendered, err := encodeCanonical(c)
	if err != nil || len(rendered) > MaxContentBytes {
		return plain, err
	}
	return rendered, nil
}

// FinalReply is the enqueue request of the answer to source, an event of
// roomID in thread, with content already related (RelateReply). It settles
// source; with record set it also writes the answer's turn record, which a
// retry of an answer already recorded leaves out.
func FinalReply(roomID, source string, thread *string, content []byte, record bool) EnqueueRequest {
	id := ReplyDeliveryID(source)
	req := EnqueueRequest{DeliveryID: id, Stage: StageFinal, RoomID: roomID, Thread: thread,
		TurnID: id, Content: content, Sources: []string{source}}
	if record {
		req.Turn = &TurnRecord{TurnID: id, RoomID: roomID, State: TurnResultRecorded,
			Sources: []string{source}, Record: content}
	}
	return req
}

// PlaceholderReply is the enqueue request of the placeholder shown while
// the answer to source is made. It has no sources, so source stays pending
// until its answer; enqueued again, it is the same row.
func PlaceholderReply(roomID, source string, thread *string, content []byte) EnqueueRequest {
	return EnqueueRequest{DeliveryID: ReplyDeliveryID(source), Stage: StageInitial, RoomID: roomID,
		Thread: thread, Content: content}
}

// DropsTurn reports whether err, returned by an enqueue of a reply, means
// nothing may answer the event any more: the membership it came under has
// ended, or its delivery was retired with it. The event is then settled
// unanswered.
func DropsTurn(err error) bool {
	return errors.Is(err, ErrMembershipEnded) || errors.Is(err, ErrDeliveryRetired)
}

// markdown renders an answer's markdown as chat clients do: a line break is
// a line break. Raw HTML passes through to the sanitiser, which keeps only
// what Matrix clients render.
var markdown = goldmark.New(
	goldmark.WithExtensions(extension.Table, extension.Strikethrough),
	goldmark.WithRendererOptions(html.WithHardWraps(), html.WithUnsafe()),
)

// sanitiser keeps the HTML tags and attributes the Matrix specification
// lists for formatted_body of m.room.message.
var sanitiser = func() *bluemonday.Policy {
	p := bluemonday.NewPolicy()
	p.AllowElements("font", "del", "s", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "p", "a", "ul", "ol",
		"sup", "sub", "li", "b", "i", "u", "strong", "em", "code", "hr", "br", "div", "table", "thead", "tbody",
		"tr", "th", "td", "caption", "pre", "span", "img", "details", "summary")
	p.AllowURLSchemes("http", "https", "ftp", "mailto", "magnet", "mxc")
	p.RequireParseableURLs(true)
	p.AllowAttrs("href").OnElements("a")
	p.AllowAttrs("target").Matching(regexp.MustCompile(`^_blank$`)).OnElements("a")
	p.AllowAttrs("start").Matching(bluemonday.Integer).OnElements("ol")
	p.AllowAttrs("class").Matching(regexp.MustCompile(`^language-[A-Za-z0-9_+#-]+$`)).OnElements("code")
	color := regexp.MustCompile(`^#[0-9A-Fa-f]{6}$`)
	p.AllowAttrs("color", "data-mx-bg-color", "data-mx-color").Matching(color).OnElements("font")
	p.AllowAttrs("data-mx-bg-color", "data-mx-color").Matching(color).OnElements("span")
	p.AllowAttrs("data-mx-spoiler").OnElements("span")
	p.AllowAttrs("src").Matching(regexp.MustCompile(`^mxc://`)).OnElements("img")
	p.AllowAttrs("width", "height").Matching(bluemonday.Integer).OnElements("img")
	p.AllowAttrs("alt", "title").OnElements("img")
	return p
}()

// textMsgtypes are the message types whose body is text to format.
var textMsgtypes = map[string]bool{"m.text": true, "m.notice": true, "m.emote": true}

// formatMarkdown renders c's body as sanitised HTML. ok is false when c is
// not text, already has a format, or its body holds no markup (plain text
// goes out unchanged, with no formatted_body).
func formatMarkdown(c map[string]any) (formatted string, ok bool) {
	msgtype, _ := c["msgtype"].(string)
	body, isText := c["body"].(string)
	_, hasFormat := c["format"]
	_, hasFormatted := c["formatted_body"]
	if !textMsgtypes[msgtype] || !isText || hasFormat || hasFormatted {
		return "", false
	}
	src := []byte(body)
	doc := markdown.Parser().Parse(text.NewReader(src))
	if !hasMarkup(doc, src) {
		return "", false
	}
	var buf bytes.Buffer
	if err := markdown.Renderer().Render(&buf, src, doc); err != nil {
		return "", false
	}
	formatted = string(bytes.TrimSpace(sanitiser.SanitizeBytes(buf.Bytes())))
	return formatted, formatted != ""
}

// markupEscape matches what markdown turns into other text than it reads:
// a backslash escape or a character reference.
var markupEscape = regexp.MustCompile(`\\[!-/:-@\[-` + "`" + `{-~]|&(#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});`)

// hasMarkup reports whether a parsed body holds any markdown: anything but
// paragraphs of text, or text whose rendering reads differently.
func hasMarkup(doc ast.Node, src []byte) bool {
	markup := false
	_ = ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		switch n.(type) {
		case *ast.Document, *ast.Paragraph, *ast.Text:
			return ast.WalkContinue, nil
		}
		markup = true
		return ast.WalkStop, nil
	})
	return markup || markupEscape.Match(src)
}
