package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/rs/zerolog"
	"maunium.net/go/mautrix/crypto/attachment"

	"github.com/mindroomd/mindroomd/journal"
)

const (
	// DefaultOpenAITimeout bounds one turn, the whole answer streamed or
	// not, when OpenAIOptions.Timeout is zero: long enough for a local model
	// on a CPU to write a long answer, short enough that a server that
	// stalls does not hold the agent's work for good.
	DefaultOpenAITimeout = 5 * time.Minute
	// DefaultOpenAIContext is how many visible messages of the conversation
	// a request carries when OpenAIOptions.ContextMessages is zero.
	DefaultOpenAIContext = 20
	// ProgressInterval is the least time between two progress edits of a
	// streamed answer, and between the request and the first: a homeserver
	// must not be sent an edit per token, and an answer that is done within
	// a second needs none.
	ProgressInterval = time.Second
	// maxAnswerContent is what an answer's content may take, leaving the
	// rest of journal.MaxContentBytes to the relation and the delivery
	// marker the reply gains on its way out.
	maxAnswerContent = journal.MaxContentBytes - 2<<10
	// maxReasonBytes is how much of the server's own explanation of a
	// refusal an error keeps.
	maxReasonBytes = 256
	// DefaultMaxImageBytes caps one image a vision request carries when
	// OpenAIOptions.MaxImageBytes is zero: OpenAI's own limit per image.
	DefaultMaxImageBytes = 20 << 20
	// MaxToolCallsPerStep bounds the calls one answer of the model may
	// make; more are dropped.
	MaxToolCallsPerStep = 16
	// MaxVisionImages is how many images one request carries at most, the
	// newest of its window: each is sent whole, base64, with every request,
	// and a long conversation of pictures would make every turn pay for
	// all of them again. Older ones are left out, as without Vision.
	MaxVisionImages = 4
	// imageUnavailable stands in for an image that could not be fetched,
	// was too large or is of a type models do not read, so the model
	// knows there was one.
	imageUnavailable = "[image not available]"
)

// visionTypes are the image types chat completions APIs read (OpenAI's
// list; llama.cpp and Ollama read them too). Another type would have the
// request refused, and the turn fail on every retry.
var visionTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// The stream status words an answer's content carries (see
// journal.StreamStatusKey). Progress edits are marked by the principal.
const (
	// StreamPending marks the placeholder of a streamed answer: nothing
	// written yet.
	StreamPending = "pending"
	// StreamCompleted marks a streamed answer that is finished.
	StreamCompleted = "completed"
)

var (
	// ErrOpenAIIncomplete reports a streamed answer that ended before the
	// model said it was finished: a cut connection, or a server that gave
	// up.
	ErrOpenAIIncomplete = errors.New("the stream ended before the answer was finished")
	// ErrOpenAIEmpty reports an answer without text.
	ErrOpenAIEmpty = errors.New("empty answer")
	// ErrOpenAITimeout reports a turn that ran past its timeout.
	ErrOpenAITimeout = errors.New("timed out")
)

// StatusError is a refusal of the chat completions API: its HTTP status
// and, when it gave one, its reason. The client library's own error is not
// kept, because it holds the request, and the request the API key.
type StatusError struct {
	Status int
	// Reason is the start of the server's message, with the API key blanked
	// should the server have echoed it.
	Reason string
}

// Error is "status 429" and the reason.
func (e *StatusError) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("status %d", e.Status)
	}
	return fmt.Sprintf("status %d: %s", e.Status, e.Reason)
}

// OpenAIOptions configure an OpenAI agent.
type OpenAIOptions struct {
	// BaseURL is the API's base, the part before /chat/completions
	// (https://api.openai.com/v1, http://127.0.0.1:11434/v1 for Ollama).
	BaseURL string
	// Model is the model name sent with each request.
	Model string
	// APIKey, when set, is sent as a bearer token; local servers need none.
	// The environment's OPENAI_API_KEY is never read: the key of a daemon
	// that talks to several servers is the one configured for each. It is
	// never logged, and an error quoting it has it replaced.
	APIKey string
	// SystemPrompt, when set, opens every request.
	SystemPrompt string
	// ContextMessages is how many of the last visible messages of the
	// event's conversation (its thread, or its room when it is in none),
	// up to and including the event, a request carries; zero means
	// DefaultOpenAIContext.
	ContextMessages int
	// Stream asks for the answer token by token, shown as progress edits
	// of the turn's placeholder while it is written (see Placeholder).
	Stream bool
	// UserID is the agent's own Matrix account: its messages in the
	// history are the assistant's, everyone else's the user's.
	UserID string
	// Timeout bounds one turn; zero means DefaultOpenAITimeout.
	Timeout time.Duration
	// Vision sends images to the model: an m.image the turn's event, or a
	// message of its window (up to MaxVisionImages, the newest), carries is
	// sent as the user message's content parts, its caption as text and
	// the image as an image_url part holding a data: URL. An image
	// message is then answered too. Off, images are left out and an image
	// message is settled unanswered.
	Vision bool
	// FetchMedia downloads an mxc:// URL, at most max bytes, for Vision:
	// the model cannot fetch from the homeserver. The daemon wires it to
	// the homeserver's media download. A failed fetch, or one nil, shows
	// the model "[image not available]" instead, and the turn goes on.
	FetchMedia func(ctx context.Context, mxcURL string, max int64) (data []byte, mimeType string, err error)
	// MaxImageBytes caps one image; zero means DefaultMaxImageBytes. A
	// larger image is "[image not available]".
	MaxImageBytes int64
	// Tools are the functions the model may call (Tool); none, and the
	// model is offered none.
	Tools []Tool
	// Now is the clock progress edits are spaced by; nil means time.Now.
	Now func() time.Time
	// Log receives a line per answer.
	Log zerolog.Logger
}

// OpenAI answers each text message with a model behind an OpenAI-compatible
// chat completions API (OpenAI, llama.cpp's server, Ollama, vLLM, ...),
// given the conversation so far, and with Vision each image message too;
// other events are settled unanswered. Any failure (a refusal such as 429
// or 500, a connection or stream cut short, a timeout) is an error, so the
// event stays pending and is offered again after a backoff. The client
// never retries by itself: the principal's backoff is the one retry policy.
//
// Streamed, the answer is shown as it is written through Turn.Progress, at
// most once every ProgressInterval; the finished answer is the Reply, which
// the principal records and delivers once.
type OpenAI struct {
	completions openai.ChatCompletionService
	model       string
	system      string
	context     int
	stream      bool
	self        string
	timeout     time.Duration
	vision      bool
	fetch       func(ctx context.Context, mxcURL string, max int64) ([]byte, string, error)
	maxImage    int64
	tools       []Tool
	now         func() time.Time
	log         zerolog.Logger
	// scrub blanks the API key out of a server's error message. The key
	// itself lives only in closures, which no formatting verb prints.
	scrub func(string) string
}

var _ Agent = (*OpenAI)(nil)

// NewOpenAI returns the agent o describes, its zero options given their
// defaults. It makes no request: the server may well start after the
// daemon. o is taken as the configuration validated it (package config):
// a base URL, a model, and a context the journal reads in one page.
func NewOpenAI(o OpenAIOptions) *OpenAI {
	if o.ContextMessages <= 0 {
		o.ContextMessages = DefaultOpenAIContext
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultOpenAITimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxImageBytes <= 0 {
		o.MaxImageBytes = DefaultMaxImageBytes
	}
	// A client of its own: no overall timeout, which would cut a stream
	// short (each turn has its deadline instead), and the default
	// transport's dial and TLS timeouts and proxy settings.
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	opts := []option.RequestOption{option.WithBaseURL(o.BaseURL), option.WithHTTPClient(client), option.WithMaxRetries(0)}
	scrub := func(s string) string { return s }
	if o.APIKey != "" {
		opts = append(opts, option.WithAPIKey(o.APIKey))
		scrub = func(s string) string { return strings.ReplaceAll(s, o.APIKey, "[redacted]") }
	}
	return &OpenAI{completions: openai.NewChatCompletionService(opts...), model: o.Model, system: o.SystemPrompt,
		context: o.ContextMessages, stream: o.Stream, self: o.UserID, timeout: o.Timeout, now: o.Now, log: o.Log,
		scrub: scrub, vision: o.Vision, fetch: o.FetchMedia, maxImage: o.MaxImageBytes, tools: o.Tools}
}

// Placeholder is the content the principal sends before a streamed answer
// (principal.Deps.Placeholder), marked pending; nil when the answer is not
// streamed, which needs none.
func (o *OpenAI) Placeholder() json.RawMessage {
	if !o.stream {
		return nil
	}
	content, _ := json.Marshal(map[string]string{"msgtype": "m.text", "body": "Thinking…", journal.StreamStatusKey: StreamPending})
	return content
}

// Answer implements Agent.
func (o *OpenAI) Answer(ctx context.Context, turn Turn) (Reply, error) {
	if turn.Event.Kind != journal.KindMessage && (!o.vision || turn.Event.Kind != journal.KindMedia) {
		return Reply{Ignore: true}, nil
	}
	// The turn's deadline covers the images' downloads too.
	runCtx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	messages, asked, images, err := o.history(runCtx, turn)
	if err != nil {
		return Reply{}, fmt.Errorf("openai agent: %w", err)
	}
	if !asked {
		// A message without text (an empty body), or media that is not an
		// image: nothing to answer.
		return Reply{Ignore: true}, nil
	}
	start := o.now()
	tr, decided := resumed(turn.Approvals)
	var (
		text     string
		finish   string
		progress int
	)
	for {
		ask, err := o.settleCalls(runCtx, turn, &tr, decided)
		if err != nil {
			return Reply{}, o.failed(ctx, runCtx, err)
		}
		if ask != nil {
			o.log.Info().Str("event_id", turn.Event.EventID).Str("call_id", ask.CallID).Str("tool", ask.Tool).
				Msg("The model called a tool that needs approval; a person is asked")
			return Reply{Approval: ask}, nil
		}
		params := openai.ChatCompletionNewParams{Model: o.model, Messages: append(messages, tr.messages()...)}
		if len(o.tools) > 0 {
			params.Tools = toolParams(o.tools)
			if len(tr.Steps) >= MaxToolSteps {
				params.ToolChoice.OfAuto = openai.String("none")
			}
		}
		var (
			calls []toolCall
			edits int
		)
		if o.stream {
			text, finish, calls, edits, err = o.streamAnswer(runCtx, params, turn.Progress)
		} else {
			text, finish, calls, err = o.answer(runCtx, params)
		}
		progress += edits
		if err != nil {
			return Reply{}, o.failed(ctx, runCtx, err)
		}
		if len(calls) == 0 || len(o.tools) == 0 || len(tr.Steps) >= MaxToolSteps {
			break
		}
		for i := range calls {
			if calls[i].ID == "" {
				// A server that names no calls: the results still need an
				// ID to answer, one the step's calls do not share.
				calls[i].ID = fmt.Sprintf("call_%d_%d", len(tr.Steps), i)
			}
		}
		tr.Steps = append(tr.Steps, toolStep{Content: text, Calls: calls})
	}
	if strings.TrimSpace(text) == "" {
		return Reply{}, fmt.Errorf("openai agent: %w (finish reason %q)", ErrOpenAIEmpty, finish)
	}
	content, truncated, err := o.content(text)
	if err != nil {
		return Reply{}, fmt.Errorf("openai agent: %w", err)
	}
	o.log.Debug().Str("event_id", turn.Event.EventID).Dur("took", o.now().Sub(start)).Int("history", len(messages)).Int("images", images).
		Int("tool_steps", len(tr.Steps)).Int("answer_bytes", len(text)).Str("finish_reason", finish).Int("progress_edits", progress).Msg("Model answered")
	if truncated {
		o.log.Warn().Str("event_id", turn.Event.EventID).Int("answer_bytes", len(text)).
			Msg("The model's answer is larger than one message; it was cut short")
	}
	return Reply{Content: content}, nil
}

// failed is the error a turn fails with: its timeout, the daemon's stop,
// or err.
func (o *OpenAI) failed(ctx, runCtx context.Context, err error) error {
	switch {
	case runCtx.Err() != nil && ctx.Err() == nil:
		return fmt.Errorf("openai agent: %w after %s", ErrOpenAITimeout, o.timeout)
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return fmt.Errorf("openai agent: %w", err)
}

// answer asks for the whole answer at once: its text, and the tools it
// calls, if any.
func (o *OpenAI) answer(ctx context.Context, params openai.ChatCompletionNewParams) (text, finish string, calls []toolCall, err error) {
	res, err := o.completions.New(ctx, params)
	if err != nil {
		return "", "", nil, o.refusal(err)
	}
	if len(res.Choices) == 0 {
		return "", "", nil, fmt.Errorf("%w: no choices", ErrOpenAIEmpty)
	}
	msg := res.Choices[0].Message
	for _, c := range msg.ToolCalls {
		if (c.Type == "" || c.Type == "function") && len(calls) < MaxToolCallsPerStep {
			calls = append(calls, toolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
	}
	return msg.Content, res.Choices[0].FinishReason, calls, nil
}

// streamAnswer asks for the answer token by token and shows it through
// progress, at most once every ProgressInterval. The answer is complete
// once the model gave a finish reason, whatever befalls the connection
// after it (a [DONE] lost, a proxy's reset): asking again would pay for the
// same answer twice. A stream that ends before it (the server's connection
// closed cleanly mid-answer) is ErrOpenAIIncomplete.
func (o *OpenAI) streamAnswer(ctx context.Context, params openai.ChatCompletionNewParams,
	progress func(context.Context, string)) (text, finish string, calls []toolCall, edits int, err error) {
	stream := o.completions.NewStreaming(ctx, params)
	defer stream.Close()
	var (
		b      strings.Builder
		shown  string
		last   = o.now()
		chunks int
		// The calls come in pieces, each piece naming its call's index.
		pieces []toolCall
	)
	for stream.Next() {
		chunks++
		for _, c := range stream.Current().Choices {
			if c.Index != 0 {
				continue
			}
			b.WriteString(c.Delta.Content)
			for _, d := range c.Delta.ToolCalls {
				if d.Index < 0 || d.Index >= MaxToolCallsPerStep {
					continue
				}
				for int64(len(pieces)) <= d.Index {
					pieces = append(pieces, toolCall{})
				}
				p := &pieces[d.Index]
				if d.ID != "" {
					p.ID = d.ID
				}
				p.Name += d.Function.Name
				p.Arguments += d.Function.Arguments
			}
			if c.FinishReason != "" {
				finish = c.FinishReason
			}
		}
		if progress == nil || finish != "" {
			continue
		}
		if now := o.now(); now.Sub(last) >= ProgressInterval && b.Len() > 0 && b.String() != shown {
			shown, last = b.String(), now
			progress(ctx, shown)
			edits++
		}
	}
	err = stream.Err()
	var inStream *ssestream.StreamError
	if errors.As(err, &inStream) {
		// The server's own words, which may echo anything it was sent.
		err = errors.New(o.scrub(inStream.Message))
	}
	if err != nil && finish != "" {
		o.log.Warn().Err(err).Int("chunks", chunks).Str("finish_reason", finish).
			Msg("The stream broke after the model finished its answer; the answer is kept")
		return b.String(), finish, named(pieces), edits, nil
	}
	switch {
	case err != nil && chunks > 0:
		return "", "", nil, edits, fmt.Errorf("stream cut after %d chunks: %w", chunks, err)
	case err != nil:
		return "", "", nil, edits, o.refusal(err)
	}
	if finish == "" {
		return "", "", nil, edits, ErrOpenAIIncomplete
	}
	return b.String(), finish, named(pieces), edits, nil
}

// named is the calls of a stream that have a name: an index the stream
// skipped is no call.
func named(pieces []toolCall) []toolCall {
	var calls []toolCall
	for _, p := range pieces {
		if p.Name != "" {
			calls = append(calls, p)
		}
	}
	return calls
}

// refusal turns the client's error into one that is safe to log: a status
// and the server's reason for a refusal, the error as it is otherwise (a
// connection's, which names the URL but not the key).
func (o *OpenAI) refusal(err error) error {
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		return err
	}
	reason := strings.Join(strings.Fields(o.scrub(apiErr.Message)), " ")
	return &StatusError{Status: apiErr.StatusCode, Reason: clip(reason, maxReasonBytes)}
}

// content is the answer's message content. A streamed answer is marked
// completed: it ends what its placeholder and progress edits showed in
// progress. An answer too large for one message is cut short, with an
// ellipsis, rather than fail: failing would ask the model again, at a
// cost, for an answer just as long.
func (o *OpenAI) content(text string) (content json.RawMessage, truncated bool, err error) {
	c := map[string]string{"msgtype": "m.text", "body": text}
	if o.stream {
		c[journal.StreamStatusKey] = StreamCompleted
	}
	for {
		if content, err = json.Marshal(c); err != nil || len(content) <= maxAnswerContent {
			return content, truncated, err
		}
		// The encoded size shrinks at least in proportion: escaping only
		// makes a byte longer.
		body := c["body"]
		c["body"] = clip(body, len(body)*maxAnswerContent/len(content)-len("…")) + "…"
		truncated = true
	}
}

// clip cuts s to at most n bytes, at a character boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:max(n, 0)]
}

// history is the request's messages: the system prompt, then the last
// visible messages of the event's conversation up to and including the
// event, oldest first. The agent's own are the assistant's; messages
// without text (chatText) are left out, but for the images Vision sends.
// asked is false when the event itself has neither; images counts the
// images sent.
func (o *OpenAI) history(ctx context.Context, turn Turn) (_ []openai.ChatCompletionMessageParamUnion, asked bool, images int, _ error) {
	ts, err := eventTS(turn.Event.Event)
	if err != nil {
		return nil, false, 0, err
	}
	// Up to the event, not the newest: what was said after it, while the
	// event waited its turn, is not what it asks about. A cursor is
	// exclusive, so it stands just past the event's millisecond, before
	// any event ID ("$!" sorts first of all valid ones).
	page, err := turn.Conversation.Read(ctx, journal.ReadRequest{RoomID: turn.Event.RoomID, Thread: turn.Thread,
		Limit: o.context, Before: &journal.Cursor{CreatedTS: ts + 1, EventID: "$!"}})
	if err != nil {
		return nil, false, 0, fmt.Errorf("read conversation: %w", err)
	}
	// The newest images of the window, the event's first, are the ones
	// sent.
	shown := map[string]bool{}
	for i := len(page.Messages) - 1; i >= 0 && o.vision && len(shown) < MaxVisionImages; i-- {
		if m := page.Messages[i]; m.Sender != o.self && isImage(m.Content) {
			shown[m.EventID] = true
		}
	}
	out := make([]openai.ChatCompletionMessageParamUnion, 0, len(page.Messages)+2)
	if o.system != "" {
		out = append(out, openai.SystemMessage(o.system))
	}
	seen := false
	for _, m := range page.Messages {
		if shown[m.EventID] {
			out = append(out, openai.UserMessage(o.imageParts(ctx, turn.Event.EventID, m.EventID, m.Content)))
			images++
			if m.EventID == turn.Event.EventID {
				seen, asked = true, true
			}
			continue
		}
		body := chatText(m.Content)
		if m.EventID == turn.Event.EventID {
			seen, asked = true, body != ""
		}
		if body == "" {
			continue
		}
		if m.Sender == o.self {
			out = append(out, openai.AssistantMessage(body))
		} else {
			out = append(out, openai.UserMessage(body))
		}
	}
	if !seen {
		// Not on the page (its visible revision owes a refetch, as a
		// sidecar's does): the event as it came, its preview, is still the
		// question, better than none.
		var ev map[string]json.RawMessage
		_ = json.Unmarshal(turn.Event.Event, &ev)
		if body := chatText(ev["content"]); body != "" {
			out, asked = append(out, openai.UserMessage(body)), true
		} else if o.vision && isImage(ev["content"]) {
			out = append(out, openai.UserMessage(o.imageParts(ctx, turn.Event.EventID, turn.Event.EventID, ev["content"])))
			asked, images = true, images+1
		}
	}
	return out, asked, images, nil
}

// isImage reports whether a message's content is an m.image with a file.
func isImage(content json.RawMessage) bool {
	msgtype, _, _, ok := journal.MessageAttachment(content)
	return ok && msgtype == "m.image"
}

// imageParts is the user message of an image message, eventID, seen in
// the turn of turnEvent: its caption, when it has one, as text, and the
// image as a data: URL; "[image not available]" in its place when it
// cannot be had.
func (o *OpenAI) imageParts(ctx context.Context, turnEvent, eventID string, content json.RawMessage) []openai.ChatCompletionContentPartUnionParam {
	caption := mediaCaption(content)
	url, err := o.image(ctx, content)
	if err != nil {
		o.log.Warn().Err(err).Str("event_id", turnEvent).Str("image_event_id", eventID).
			Msg("An image could not be sent to the model; it is shown as not available")
		if caption != "" {
			caption += "\n"
		}
		return []openai.ChatCompletionContentPartUnionParam{openai.TextContentPart(caption + imageUnavailable)}
	}
	var parts []openai.ChatCompletionContentPartUnionParam
	if caption != "" {
		parts = append(parts, openai.TextContentPart(caption))
	}
	return append(parts, openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: url}))
}

// image downloads the image content carries, decrypting it when it is an
// encrypted room's, and returns it as a data: URL. Its type is what its
// bytes show, not what the sender claimed: a type the model cannot read
// would have the whole request refused.
func (o *OpenAI) image(ctx context.Context, content json.RawMessage) (string, error) {
	_, mxc, _, _ := journal.MessageAttachment(content)
	if o.fetch == nil {
		return "", errors.New("no media download configured")
	}
	data, _, err := o.fetch(ctx, mxc, o.maxImage)
	if err != nil {
		return "", fmt.Errorf("download %s: %w", mxc, err)
	}
	if int64(len(data)) > o.maxImage {
		return "", fmt.Errorf("download %s: larger than %d bytes", mxc, o.maxImage)
	}
	var c struct {
		File *attachment.EncryptedFile `json:"file"`
	}
	if err := json.Unmarshal(content, &c); err == nil && c.File != nil {
		if err := c.File.DecryptInPlace(data); err != nil {
			return "", fmt.Errorf("decrypt %s: %w", mxc, err)
		}
	}
	mimeType, _, _ := strings.Cut(http.DetectContentType(data), ";")
	if !slices.Contains(visionTypes, mimeType) {
		return "", fmt.Errorf("%s is %s, not an image type models read", mxc, mimeType)
	}
	return "data:" + mimeType + ";base64," + base64.StdEncoding.EncodeToString(data), nil
}

// mediaCaption is a media message's caption: its body when the file's
// name is in filename and the body says something else (Matrix 1.10);
// otherwise the body is the file's name, which says nothing.
func mediaCaption(content json.RawMessage) string {
	var c struct {
		Body     string `json:"body"`
		Filename string `json:"filename"`
	}
	if json.Unmarshal(content, &c) != nil || c.Filename == "" || c.Body == c.Filename || strings.TrimSpace(c.Body) == "" {
		return ""
	}
	return c.Body
}

// eventTS reads an event's origin_server_ts.
func eventTS(event json.RawMessage) (int64, error) {
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(event, &ev); err != nil {
		return 0, fmt.Errorf("event: %w", err)
	}
	var ts int64
	if err := json.Unmarshal(ev["origin_server_ts"], &ts); err != nil {
		return 0, fmt.Errorf("event origin_server_ts: %w", err)
	}
	return ts, nil
}

// chatText is the text a message's content says in words, "" when it
// says none: a body of only spaces, media (whose body is a file name), or a
// placeholder or progress still marked in progress.
func chatText(content json.RawMessage) string {
	var c map[string]json.RawMessage
	if json.Unmarshal(content, &c) != nil {
		return ""
	}
	var msgtype, status string
	_ = json.Unmarshal(c["msgtype"], &msgtype)
	if _, ok := c[journal.StreamStatusKey]; ok && json.Unmarshal(c[journal.StreamStatusKey], &status) == nil && journal.StreamInProgress(status) {
		return ""
	}
	switch msgtype {
	case "m.text", "m.notice", "m.emote":
	default:
		return ""
	}
	if body := textBody(content); strings.TrimSpace(body) != "" {
		return body
	}
	return ""
}
