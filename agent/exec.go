package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/journal"
)

const (
	// DefaultExecContext is how many visible messages of the conversation
	// an exec agent is sent when Exec.Context is zero.
	DefaultExecContext = 20
	// DefaultExecTimeout bounds one turn when Exec.Timeout is zero.
	DefaultExecTimeout = 30 * time.Second
	// MaxExecOutput is the most an exec agent may write on stdout: a reply
	// is one message, and an unbounded read would let a runaway agent
	// exhaust the daemon's memory.
	MaxExecOutput = 64 << 10
	// execStderrTail is how much of the end of stderr an error keeps: enough
	// for a traceback's last lines, short enough for one log line.
	execStderrTail = 2 << 10
	// execWaitDelay bounds the wait for stdout and stderr to close once the
	// process has exited or been killed, should a descendant that left the
	// process group still hold them open.
	execWaitDelay = 2 * time.Second
)

var (
	// ErrExecTimeout reports an exec agent killed for running past its
	// timeout.
	ErrExecTimeout = errors.New("timed out")
	// ErrExecReply reports an exec agent's stdout that is not a reply.
	ErrExecReply = errors.New("invalid reply")
)

// Exec answers each turn by running a command: the request goes to its
// stdin as one JSON object, the reply comes back on its stdout as one JSON
// object. Any failure (a non-zero exit, a timeout, output that is not a
// reply) is an error, so the event stays pending and is offered again after
// a backoff.
//
// The command is not run through a shell and inherits the daemon's
// environment, so an agent finds its own API keys and PATH the way the
// daemon was started with them.
type Exec struct {
	// Command is the program and its arguments.
	Command []string
	// Timeout bounds one run; zero means DefaultExecTimeout. When it passes
	// the command's whole process group is killed.
	Timeout time.Duration
	// Context is how many of the last visible messages of the event's
	// conversation the request carries; zero means DefaultExecContext.
	Context int
	// Log receives a line per run.
	Log zerolog.Logger
}

var _ principal.Agent = Exec{}

// ExecRequest is what an exec agent reads on stdin.
type ExecRequest struct {
	// Event is the pending event's canonical JSON.
	Event json.RawMessage `json:"event"`
	// EventID, RoomID and Sender are the event's.
	EventID string `json:"event_id"`
	RoomID  string `json:"room_id"`
	// ThreadID is the thread root the event belongs to, nil for the room.
	ThreadID *string `json:"thread_id"`
	Sender   string  `json:"sender"`
	// Body is the event's content.body, "" when it has none that is text.
	Body string `json:"body"`
	// Conversation is the last visible messages of the event's thread, or
	// of its room when it is in none, oldest first.
	Conversation []ExecMessage `json:"conversation"`
}

// ExecMessage is one visible message of an ExecRequest's conversation.
type ExecMessage struct {
	EventID   string `json:"event_id"`
	Sender    string `json:"sender"`
	CreatedTS int64  `json:"created_ts"`
	// Body is the visible content's body, "" when it has none that is text.
	Body string `json:"body"`
	// Content is the visible content, edits applied.
	Content json.RawMessage `json:"content"`
}

// Answer implements principal.Agent.
func (e Exec) Answer(ctx context.Context, turn principal.Turn) (principal.Reply, error) {
	req, err := e.request(ctx, turn)
	if err != nil {
		return principal.Reply{}, fmt.Errorf("exec agent: %w", err)
	}
	reply, err := e.run(ctx, req, turn.Event.EventID)
	if err != nil {
		return principal.Reply{}, fmt.Errorf("exec agent: %w", err)
	}
	return reply, nil
}

// request builds the JSON the command reads on stdin.
func (e Exec) request(ctx context.Context, turn principal.Turn) ([]byte, error) {
	// Exact keys, as Body reads them: a struct decode would also take "SENDER".
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(turn.Event.Event, &ev); err != nil {
		return nil, fmt.Errorf("event: %w", err)
	}
	var sender string
	if raw, ok := ev["sender"]; ok {
		if err := json.Unmarshal(raw, &sender); err != nil {
			return nil, fmt.Errorf("event sender: %w", err)
		}
	}
	n := e.Context
	if n <= 0 {
		n = DefaultExecContext
	}
	page, err := turn.Conversation.Read(ctx, journal.ReadRequest{RoomID: turn.Event.RoomID, Thread: turn.Thread, Limit: n})
	if err != nil {
		return nil, fmt.Errorf("read conversation: %w", err)
	}
	conv := make([]ExecMessage, 0, len(page.Messages))
	for _, m := range page.Messages {
		conv = append(conv, ExecMessage{EventID: m.EventID, Sender: m.Sender, CreatedTS: m.CreatedTS,
			Body: textBody(m.Content), Content: m.Content})
	}
	return json.Marshal(ExecRequest{Event: turn.Event.Event, EventID: turn.Event.EventID, RoomID: turn.Event.RoomID,
		ThreadID: turn.Thread, Sender: sender, Body: textBody(ev["content"]), Conversation: conv})
}

// textBody reads content.body leniently: a reaction, a redacted message or
// a malformed body is still a turn the agent may want to see, so a body
// that is not text is sent as "" beside the whole event rather than
// failing the turn forever.
func textBody(content json.RawMessage) string {
	var c map[string]json.RawMessage
	if json.Unmarshal(content, &c) != nil {
		return ""
	}
	var body string
	if json.Unmarshal(c["body"], &body) != nil {
		return ""
	}
	return body
}

// run starts the command, feeds it the request and parses its reply.
func (e Exec) run(ctx context.Context, req []byte, eventID string) (principal.Reply, error) {
	if len(e.Command) == 0 || e.Command[0] == "" {
		return principal.Reply{}, errors.New("no command")
	}
	timeout := e.Timeout
	if timeout <= 0 {
		timeout = DefaultExecTimeout
	}
	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	cmd := exec.CommandContext(runCtx, e.Command[0], e.Command[1:]...)
	// Its own process group, so a timeout also kills what the command
	// started (a shell's children, an interpreter's workers) rather than
	// leave them holding stdout and running on.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = execWaitDelay
	stdout := &cappedBuffer{max: MaxExecOutput}
	stderr := &tailBuffer{max: execStderrTail}
	cmd.Stdin = bytes.NewReader(req)
	cmd.Stdout = stdout
	cmd.Stderr = stderr

	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	switch {
	case runCtx.Err() != nil && ctx.Err() == nil:
		return principal.Reply{}, withStderr(fmt.Errorf("%w after %s", ErrExecTimeout, timeout), stderr)
	case ctx.Err() != nil:
		return principal.Reply{}, ctx.Err()
	case err != nil:
		return principal.Reply{}, withStderr(err, stderr)
	case stdout.over:
		return principal.Reply{}, withStderr(fmt.Errorf("%w: stdout exceeds %d bytes", ErrExecReply, MaxExecOutput), stderr)
	}
	reply, err := parseReply(stdout.buf.Bytes())
	if err != nil {
		return principal.Reply{}, withStderr(err, stderr)
	}
	e.Log.Debug().Str("event_id", eventID).Dur("took", took).Bool("ignore", reply.Ignore).
		Str("stderr", stderr.String()).Msg("Exec agent answered")
	return reply, nil
}

// jsonSpace is the whitespace JSON allows around a value.
const jsonSpace = " \t\r\n"

// parseReply accepts exactly one JSON object on stdout, holding either a
// non-empty text "body" or "ignore": true, and nothing else.
func parseReply(out []byte) (principal.Reply, error) {
	// JSON's own whitespace only: bytes.TrimSpace would also drop a
	// vertical tab or a no-break space, taking output that is not JSON.
	trimmed := bytes.Trim(out, jsonSpace)
	if len(trimmed) == 0 {
		return principal.Reply{}, fmt.Errorf("%w: empty stdout", ErrExecReply)
	}
	if trimmed[0] != '{' {
		return principal.Reply{}, fmt.Errorf("%w: stdout is not a JSON object", ErrExecReply)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &obj); err != nil {
		return principal.Reply{}, fmt.Errorf("%w: %w", ErrExecReply, err)
	}
	for k := range obj {
		if k != "body" && k != "ignore" {
			return principal.Reply{}, fmt.Errorf("%w: unknown key %q", ErrExecReply, k)
		}
	}
	rawBody, hasBody := obj["body"]
	rawIgnore, hasIgnore := obj["ignore"]
	switch {
	case hasBody && hasIgnore:
		return principal.Reply{}, fmt.Errorf("%w: both body and ignore", ErrExecReply)
	case hasIgnore:
		if string(rawIgnore) != "true" {
			return principal.Reply{}, fmt.Errorf("%w: ignore is %s, not true", ErrExecReply, rawIgnore)
		}
		return principal.Reply{Ignore: true}, nil
	case hasBody:
		var body string
		if err := json.Unmarshal(rawBody, &body); err != nil {
			return principal.Reply{}, fmt.Errorf("%w: body is not a string", ErrExecReply)
		}
		if body == "" {
			return principal.Reply{}, fmt.Errorf("%w: empty body", ErrExecReply)
		}
		content, err := json.Marshal(map[string]string{"msgtype": "m.text", "body": body})
		return principal.Reply{Content: content}, err
	}
	return principal.Reply{}, fmt.Errorf("%w: neither body nor ignore", ErrExecReply)
}

// withStderr appends the end of the command's stderr, where an agent says
// why it failed.
func withStderr(err error, stderr *tailBuffer) error {
	if tail := stderr.String(); tail != "" {
		return fmt.Errorf("%w: stderr: %s", err, tail)
	}
	return err
}

// cappedBuffer keeps the first max bytes written to it and notes whether
// more came. It never fails a write: an error would only make the command
// die of a broken pipe, hiding the real cause.
type cappedBuffer struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if room := b.max - b.buf.Len(); n > room {
		b.over = true
		p = p[:max(room, 0)]
	}
	b.buf.Write(p)
	return n, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.max:]...)
	}
	return n, nil
}

// String returns the tail, trimmed, on one line.
func (b *tailBuffer) String() string {
	return string(bytes.ReplaceAll(bytes.TrimSpace(b.buf), []byte("\n"), []byte(" | ")))
}
