package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/modelstub"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const bot = "@bot:example.org"

// startModel starts the stub model server for the test.
func startModel(t *testing.T, answer func(modelstub.Request) modelstub.Reply) *modelstub.Server {
	t.Helper()
	s, err := modelstub.Start(answer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// newOpenAI is an agent against the stub; change adjusts its options.
func newOpenAI(t *testing.T, s *modelstub.Server, change func(*agent.OpenAIOptions)) *agent.OpenAI {
	t.Helper()
	o := agent.OpenAIOptions{BaseURL: s.URL, Model: "stub-model", UserID: bot, Log: zerolog.Nop()}
	if change != nil {
		change(&o)
	}
	return agent.NewOpenAI(o)
}

// secret reads value back as the configuration's secret type, from a file
// as the daemon does.

func text(s string) func(modelstub.Request) modelstub.Reply {
	return func(modelstub.Request) modelstub.Reply { return modelstub.Reply{Text: s} }
}

// body reads a reply's msgtype, body and stream status.
func replyBody(t *testing.T, reply agent.Reply) (msgtype, body, status string) {
	t.Helper()
	var c map[string]string
	if err := json.Unmarshal(reply.Content, &c); err != nil {
		t.Fatalf("reply content %s: %v", reply.Content, err)
	}
	return c["msgtype"], c["body"], c[journal.StreamStatusKey]
}

func TestOpenAISendsTheConversationUpToTheEventAsTheModelsRoles(t *testing.T) {
	model := startModel(t, text("Four."))
	turn := execTurn(t, "$q",
		mx.Message("$old", alice, 1000, "too old for the window"),
		mx.Message("$hi", alice, 2000, "hello"),
		mx.Message("$me", bot, 3000, "hello, how can I help?"),
		mx.Message("$ph", bot, 3500, "Thinking…").With("content", map[string]any{
			"msgtype": "m.text", "body": "Thinking…", journal.StreamStatusKey: "pending"}),
		mx.Image("$img", alice, 4000),
		mx.Message("$typo", alice, 5000, "what is 2 + 3?"),
		mx.Edit("$fix", alice, 5500, "$typo", "what is 2 + 2?"),
		mx.Message("$q", alice, 6000, "and quickly, please"),
		mx.Message("$later", alice, 7000, "said after the question"),
	)
	a := newOpenAI(t, model, func(o *agent.OpenAIOptions) {
		o.SystemPrompt = "You are terse."
		o.ContextMessages = 6
		o.APIKey = "sk-test-key"
	})
	reply, err := a.Answer(context.Background(), turn)
	if err != nil {
		t.Fatal(err)
	}
	if msgtype, body, status := replyBody(t, reply); msgtype != "m.text" || body != "Four." || status != "" {
		t.Fatalf("reply = %s, want an m.text of the answer, unmarked when not streamed", reply.Content)
	}
	reqs := model.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.Model != "stub-model" || r.Stream || r.Authorization != "Bearer sk-test-key" {
		t.Fatalf("request model %q stream %v authorization %q", r.Model, r.Stream, r.Authorization)
	}
	var got []string
	for _, m := range r.Messages {
		got = append(got, m.Role+": "+m.Content)
	}
	// The window is the 6 messages up to the event ($hi..$q); the image has
	// no text, the placeholder is still pending, and $later came after.
	want := []string{
		"system: You are terse.",
		"user: hello",
		"assistant: hello, how can I help?",
		"user: what is 2 + 2?",
		"user: and quickly, please",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("messages =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestOpenAIWithoutAContextSettingSendsTheDefaultNumberOfMessages(t *testing.T) {
	model := startModel(t, text("ok"))
	var evs []mx.Ev
	for i := range agent.DefaultOpenAIContext + 5 {
		evs = append(evs, mx.Message(fmt.Sprintf("$m%d", i), alice, int64(1000*(i+1)), fmt.Sprintf("message %d", i)))
	}
	last := fmt.Sprintf("$m%d", len(evs)-1)
	if _, err := newOpenAI(t, model, nil).Answer(context.Background(), execTurn(t, last, evs...)); err != nil {
		t.Fatal(err)
	}
	msgs := model.Requests()[0].Messages
	if len(msgs) != agent.DefaultOpenAIContext || msgs[0].Content != "message 5" {
		t.Fatalf("%d messages from %q, want the last %d", len(msgs), msgs[0].Content, agent.DefaultOpenAIContext)
	}
}

func TestOpenAIAsksAnEventNotOnThePageAsItCame(t *testing.T) {
	model := startModel(t, text("ok"))
	// A sidecar's page row owes a refetch and is left off the page.
	turn := execTurn(t, "$q", mx.Message("$hi", alice, 1000, "hello"), mx.Sidecar("$q", alice, 2000, "the preview"))
	if reply, err := newOpenAI(t, model, nil).Answer(context.Background(), turn); err != nil || reply.Ignore {
		t.Fatalf("reply = %+v, %v; want an answer", reply, err)
	}
	var got []string
	for _, m := range model.Requests()[0].Messages {
		got = append(got, m.Role+": "+m.Content)
	}
	if want := []string{"user: hello", "user: the preview"}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("messages = %q, want %q", got, want)
	}
}

func TestOpenAISendsNoAuthorizationWithoutAKey(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-from-the-environment")
	model := startModel(t, text("ok"))
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	if _, err := newOpenAI(t, model, nil).Answer(context.Background(), turn); err != nil {
		t.Fatal(err)
	}
	if got := model.Requests()[0].Authorization; got != "" {
		t.Fatalf("Authorization = %q, want none: the environment's key is not the configured one", got)
	}
}

func TestOpenAIAsksNothingForAnEventWithoutText(t *testing.T) {
	model := startModel(t, text("unused"))
	for _, c := range []struct {
		name string
		ev   mx.Ev
	}{
		{"Reaction", mx.Reaction("$q", alice, 2000, "$m", "👍")},
		{"Image", mx.Image("$q", alice, 2000)},
		{"EmptyBody", mx.Message("$q", alice, 2000, "  ")},
	} {
		t.Run(c.name, func(t *testing.T) {
			turn := execTurn(t, "$q", mx.Message("$m", alice, 1000, "hi"), c.ev)
			reply, err := newOpenAI(t, model, nil).Answer(context.Background(), turn)
			if err != nil || !reply.Ignore {
				t.Fatalf("reply = %+v, %v; want the turn ignored", reply, err)
			}
		})
	}
	if n := len(model.Requests()); n != 0 {
		t.Fatalf("the model was asked %d times", n)
	}
}

// stepClock is a clock that moves step forward each time it is read.
type stepClock struct {
	mu   sync.Mutex
	t    time.Time
	step time.Duration
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(c.step)
	return c.t
}

func (c *stepClock) read() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func TestOpenAIStreamsProgressAtMostOnceASecondAndAnswersWithTheWholeText(t *testing.T) {
	const answer = "one two three four five six seven eight nine ten eleven twelve"
	model := startModel(t, text(answer))
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "count"))
	// Every read of the clock is 400 ms after the last: the chunks come
	// faster than the interval allows edits.
	clock := &stepClock{t: time.Unix(1000, 0), step: 400 * time.Millisecond}
	a := newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.Stream, o.Now = true, clock.Now })
	type edit struct {
		at   time.Time
		text string
	}
	var edits []edit
	turn.Progress = func(_ context.Context, text string) { edits = append(edits, edit{clock.read(), text}) }
	start := clock.read()
	reply, err := a.Answer(context.Background(), turn)
	if err != nil {
		t.Fatal(err)
	}
	if !model.Requests()[0].Stream {
		t.Fatal("the request did not ask for a stream")
	}
	if _, body, status := replyBody(t, reply); body != answer || status != agent.StreamCompleted {
		t.Fatalf("reply = %s, want the whole answer marked %s", reply.Content, agent.StreamCompleted)
	}
	if len(edits) < 2 {
		t.Fatalf("%d progress edits for 12 chunks over %s, want several", len(edits), clock.read().Sub(start))
	}
	last := start
	for i, e := range edits {
		if gap := e.at.Sub(last); gap < agent.ProgressInterval {
			t.Fatalf("edit %d came %s after the one before (or the request), want at least %s", i, gap, agent.ProgressInterval)
		}
		if !strings.HasPrefix(answer, e.text) || e.text == "" {
			t.Fatalf("edit %d shows %q, want a growing part of the answer", i, e.text)
		}
		if i > 0 && len(e.text) <= len(edits[i-1].text) {
			t.Fatalf("edit %d shows %q after %q: nothing new", i, e.text, edits[i-1].text)
		}
		last = e.at
	}
}

func TestOpenAIStreamsWithoutProgressWhenThereIsNoPlaceholder(t *testing.T) {
	model := startModel(t, text("a streamed answer"))
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	reply, err := newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.Stream = true }).Answer(context.Background(), turn)
	if err != nil {
		t.Fatal(err)
	}
	if _, body, _ := replyBody(t, reply); body != "a streamed answer" {
		t.Fatalf("reply = %s", reply.Content)
	}
}

func TestOpenAIFailsTheTurnOnARefusalOrACutStreamAndAsksOnce(t *testing.T) {
	const key = "sk-secret-never-shown"
	for _, c := range []struct {
		name   string
		stream bool
		reply  modelstub.Reply
		check  func(error) bool
		want   string
	}{
		{"RateLimited", true, modelstub.Reply{Status: http.StatusTooManyRequests, Text: "slow down, " + key},
			func(err error) bool {
				var se *agent.StatusError
				return errors.As(err, &se) && se.Status == http.StatusTooManyRequests
			}, "openai agent: status 429: slow down, [redacted]"},
		{"ServerError", true, modelstub.Reply{Status: http.StatusInternalServerError, Text: "model crashed"},
			func(err error) bool {
				var se *agent.StatusError
				return errors.As(err, &se) && se.Status == http.StatusInternalServerError
			}, "openai agent: status 500: model crashed"},
		{"ServerErrorUnstreamed", false, modelstub.Reply{Status: http.StatusServiceUnavailable, Text: "loading model"},
			func(err error) bool {
				var se *agent.StatusError
				return errors.As(err, &se) && se.Status == http.StatusServiceUnavailable
			}, "openai agent: status 503: loading model"},
		{"StreamEndedEarly", true, modelstub.Reply{Text: "half an answer and more", CutAfter: 2},
			func(err error) bool { return errors.Is(err, agent.ErrOpenAIIncomplete) },
			"openai agent: the stream ended before the answer was finished"},
		{"ConnectionCut", true, modelstub.Reply{Text: "half an answer and more", CutAfter: 2, Abort: true},
			func(err error) bool { return err != nil }, "openai agent: stream cut after 2 chunks: "},
		{"EmptyAnswer", true, modelstub.Reply{Text: ""},
			func(err error) bool { return errors.Is(err, agent.ErrOpenAIEmpty) }, "openai agent: empty answer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			model := startModel(t, func(modelstub.Request) modelstub.Reply { return c.reply })
			turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
			var shown []string
			turn.Progress = func(_ context.Context, text string) { shown = append(shown, text) }
			a := newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.Stream, o.APIKey = c.stream, key })
			reply, err := a.Answer(context.Background(), turn)
			if err == nil || !c.check(err) || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("reply %s, err = %v; want an error starting %q", reply.Content, err, c.want)
			}
			if strings.Contains(fmt.Sprintf("%v %+v %#v", err, err, err), key) {
				t.Fatalf("the error shows the API key: %v", err)
			}
			if n := len(model.Requests()); n != 1 {
				t.Fatalf("the model was asked %d times, want once: retrying is the principal's", n)
			}
		})
	}
}

func TestAStreamCutAfterTheModelFinishedKeepsTheAnswerAndAsksOnce(t *testing.T) {
	var asked atomic.Int32
	// The model's last chunk carries its finish reason; then the connection
	// is torn down before [DONE], as a proxy that resets it does.
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, chunk := range []string{
			`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"The whole "},"finish_reason":null}]}`,
			`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"answer."},"finish_reason":null}]}`,
			`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		} {
			fmt.Fprintf(w, "data: %s\n\n", chunk)
		}
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(model.Close)
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	a := agent.NewOpenAI(agent.OpenAIOptions{BaseURL: model.URL + "/v1", Model: "m", Stream: true, UserID: bot, Log: zerolog.Nop()})
	reply, err := a.Answer(context.Background(), turn)
	if err != nil {
		t.Fatalf("err = %v, want the finished answer", err)
	}
	if _, body, status := replyBody(t, reply); body != "The whole answer." || status != agent.StreamCompleted {
		t.Fatalf("reply = %s, want the whole answer marked %s", reply.Content, agent.StreamCompleted)
	}
	if n := asked.Load(); n != 1 {
		t.Fatalf("the model was asked %d times, want once", n)
	}
}

func TestOpenAIGivesUpAtItsTimeout(t *testing.T) {
	released := make(chan struct{})
	model := startModel(t, func(modelstub.Request) modelstub.Reply {
		return modelstub.Reply{Text: "slow words", OnChunk: func(ctx context.Context, _ int) {
			<-ctx.Done() // the first word, then nothing until the client leaves
			close(released)
		}}
	})
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	a := newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.Stream, o.Timeout = true, 300*time.Millisecond })
	_, err := a.Answer(context.Background(), turn)
	if !errors.Is(err, agent.ErrOpenAITimeout) || err.Error() != "openai agent: timed out after 300ms" {
		t.Fatalf("err = %v, want a timeout", err)
	}
	select {
	case <-released: // the request was abandoned, not left open
	case <-time.After(10 * time.Second):
		t.Fatal("the stream is still open after the timeout")
	}
}

func TestOpenAICutsAnAnswerTooLargeForOneMessage(t *testing.T) {
	// Escaped characters weigh more encoded than they do as text.
	long := strings.Repeat(strings.Repeat("<é>", 1000)+" ", 30)
	model := startModel(t, text(long))
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "write a lot"))
	reply, err := newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.Stream = true }).Answer(context.Background(), turn)
	if err != nil {
		t.Fatal(err)
	}
	_, body, status := replyBody(t, reply)
	if len(reply.Content) > journal.MaxContentBytes-1024 || !strings.HasSuffix(body, "…") ||
		!strings.HasPrefix(long, strings.TrimSuffix(body, "…")) || !utf8.ValidString(body) || status != agent.StreamCompleted {
		t.Fatalf("content of %d bytes, body …%q; want one message's worth of the answer, marked cut", len(reply.Content), body[max(len(body)-20, 0):])
	}
	// The reply, related to its event, is one the outbox accepts.
	related, err := journal.RelateReply(reply.Content, "$q", nil, journal.ReplyMarkdown)
	if err != nil {
		t.Fatal(err)
	}
	req := journal.EnqueueRequest{DeliveryID: "d", Stage: journal.StageFinal, RoomID: execRoom, Content: related}
	if err := req.Validate(); err != nil {
		t.Fatalf("the outbox refuses the cut answer: %v", err)
	}
}

func TestTheOpenAIAgentNeverPrintsItsKey(t *testing.T) {
	const key = "sk-secret-in-the-struct"
	model := startModel(t, text("ok"))
	a := newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.APIKey = key })
	for _, s := range []string{fmt.Sprintf("%v", a), fmt.Sprintf("%+v", a), fmt.Sprintf("%#v", a), fmt.Sprintf("%+v", *a)} {
		if strings.Contains(s, key) {
			t.Fatalf("the agent prints its key: %s", s)
		}
	}
}

func TestAStreamedAgentHasAPendingPlaceholderAndAnUnstreamedOneNone(t *testing.T) {
	model := startModel(t, text("ok"))
	var c map[string]string
	if err := json.Unmarshal(newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.Stream = true }).Placeholder(), &c); err != nil ||
		c[journal.StreamStatusKey] != agent.StreamPending || c["msgtype"] != "m.text" || c["body"] == "" {
		t.Fatalf("placeholder = %v, %v; want a message marked %s", c, err, agent.StreamPending)
	}
	if p := newOpenAI(t, model, nil).Placeholder(); p != nil {
		t.Fatalf("an unstreamed agent's placeholder = %s, want none", p)
	}
}
