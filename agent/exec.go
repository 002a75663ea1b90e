package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

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
	// command has exited and its process group was killed, should a
	// descendant that left the group still hold them open.
	execWaitDelay = 2 * time.Second
	// execLocalePrefix starts the names of the locale's variables (LC_ALL,
	// LC_CTYPE, ...), which every command gets.
	execLocalePrefix = "LC_"
)

// execEnv names the variables of the daemon's environment every command
// gets: what a program needs to find its tools, its home, its locale and
// its time zone. Anything else, the daemon's own secrets among it
// (MINDROOM_DATABASE_URL), reaches a command only when Exec.Env names it.
var execEnv = []string{"PATH", "HOME", "USER", "LANG", "TZ", "TMPDIR"}

var (
	// ErrExecTimeout reports an exec agent killed for running past its
	// timeout.
	ErrExecTimeout = errors.New("timed out")
	// ErrExecReply reports an exec agent's stdout that is not a reply.
	ErrExecReply = errors.New("invalid reply")
)

// Exec answers each turn by running a command: the request goes to its
// stdin as one JSON object, the reply comes back on its stdout as one JSON
// object: {"body": "text"}, {"ignore": true}, {"react": "👍"},
// {"attachment": {"path": "out.png", "name": ..., "mimetype": ...,
// "caption": ...}}, a relative path being the command's working
// directory's (the daemon's), or {"approval": {"call_id": ..., "tool": ...,
// "arguments": {...}, "approvers": [...], "expires_in_s": ..., "secret":
// [...], "rendering": ...}}, which asks a person before the call runs: the
// command is run again once the call is decided, with the decision in the
// request's "approvals". Any failure (a non-zero exit, a timeout, output that is not a
// reply) is an error, so the event stays pending and is offered again after
// a backoff.
//
// The command is not run through a shell. Its environment is the
// daemon's cut down to PATH, HOME, USER, LANG, LC_*, TZ and TMPDIR, and the
// variables Env names: one agent's command never sees what the daemon or
// another agent was given. When the command exits, whatever it left running
// in its process group is killed.
type Exec struct {
	// Command is the program and its arguments.
	Command []string
	// Env names further variables of the daemon's environment the command
	// gets, such as its own API key.
	Env []string
	// Timeout bounds one run; zero means DefaultExecTimeout. When it passes
	// the command's whole process group is killed.
	Timeout time.Duration
	// Context is how many of the last visible messages of the event's
	// conversation the request carries; zero means DefaultExecContext.
	Context int
	// Log receives a line per run.
	Log zerolog.Logger
}

var _ Agent = Exec{}

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
	// Approvals are the decided calls the command asked a person about for
	// this event, oldest first; absent when it asked none.
	Approvals []ExecApproval `json:"approvals,omitempty"`
}

// ExecApproval is one decided call of an ExecRequest.
type ExecApproval struct {
	CallID    string          `json:"call_id"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	// State is approved, denied, expired or withdrawn; only approved lets
	// the call run.
	State string `json:"state"`
	// DecidedBy is the approver who decided, "" for an expiry or a
	// withdrawal.
	DecidedBy string `json:"decided_by"`
	// Reason says why a call expired or was withdrawn.
	Reason string `json:"reason,omitempty"`
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

// Answer implements Agent.
func (e Exec) Answer(ctx context.Context, turn Turn) (Reply, error) {
	req, err := e.request(ctx, turn)
	if err != nil {
		return Reply{}, fmt.Errorf("exec agent: %w", err)
	}
	reply, err := e.run(ctx, req, turn.Event.EventID)
	if err != nil {
		return Reply{}, fmt.Errorf("exec agent: %w", err)
	}
	return reply, nil
}

// request builds the JSON the command reads on stdin.
func (e Exec) request(ctx context.Context, turn Turn) ([]byte, error) {
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
	var approvals []ExecApproval
	for _, a := range turn.Approvals {
		approvals = append(approvals, ExecApproval{CallID: a.CallID, Tool: a.Tool, Arguments: a.Arguments,
			State: a.State.String(), DecidedBy: a.DecidedBy, Reason: a.Reason})
	}
	return json.Marshal(ExecRequest{Event: turn.Event.Event, EventID: turn.Event.EventID, RoomID: turn.Event.RoomID,
		ThreadID: turn.Thread, Sender: sender, Body: textBody(ev["content"]), Conversation: conv, Approvals: approvals})
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
func (e Exec) run(ctx context.Context, req []byte, eventID string) (Reply, error) {
	timeout := e.Timeout
	if timeout <= 0 {
		timeout = DefaultExecTimeout
	}
	out, err := runCommand(ctx, e.Command, e.Env, timeout, req, MaxExecOutput)
	switch {
	case err != nil:
		return Reply{}, err
	case out.stdout.over:
		return Reply{}, withStderr(fmt.Errorf("%w: stdout exceeds %d bytes", ErrExecReply, MaxExecOutput), out.stderr)
	}
	reply, err := parseReply(out.stdout.buf.Bytes())
	if err != nil {
		return Reply{}, withStderr(err, out.stderr)
	}
	if f := reply.Attachment; f != nil && !filepath.IsAbs(f.Path) {
		// Relative to the command's working directory, which is the
		// daemon's: resolved here, where that is what the command meant,
		// so the reply names its file whoever reads it.
		if f.Path, err = filepath.Abs(f.Path); err != nil {
			return Reply{}, fmt.Errorf("%w: attachment path: %w", ErrExecReply, err)
		}
	}
	if out.held {
		e.Log.Warn().Str("event_id", eventID).Dur("waited", execWaitDelay).
			Msg("A process the exec agent started outside its process group still holds its output; the reply is taken as it was")
	}
	e.Log.Debug().Str("event_id", eventID).Dur("took", out.took).Bool("ignore", reply.Ignore).
		Str("react", reply.React).Bool("attachment", reply.Attachment != nil).
		Str("stderr", out.stderr.String()).Msg("Exec agent answered")
	return reply, nil
}

// commandOutput is what one run of a command left: its stdout (at most
// the cap it was run with), the end of its stderr, whether a process it
// left outside its group still held them when it was done, and how long
// it took.
type commandOutput struct {
	stdout *cappedBuffer
	stderr *tailBuffer
	held   bool
	took   time.Duration
}

// runCommand runs command, not through a shell, with input on its stdin,
// in a process group of its own and an environment cut down to what
// commandEnv lets through, for at most timeout. A non-zero exit is an
// error carrying the end of stderr; a timeout is ErrExecTimeout; ctx's end
// is ctx's error.
func runCommand(ctx context.Context, command, env []string, timeout time.Duration, input []byte, maxOut int) (commandOutput, error) {
	if len(command) == 0 || command[0] == "" {
		return commandOutput{}, errors.New("no command")
	}
	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	cmd := exec.CommandContext(runCtx, command[0], command[1:]...)
	cmd.Env = commandEnv(env)
	// Its own process group, so a timeout, or the command's exit, also
	// kills what the command started (a shell's children, an interpreter's
	// workers) rather than leave them holding stdout and running on.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out := commandOutput{stdout: &cappedBuffer{max: maxOut}, stderr: &tailBuffer{max: execStderrTail}}
	pipes, err := newExecIO(cmd)
	if err != nil {
		return out, err
	}

	start := time.Now()
	if err := cmd.Start(); err != nil {
		pipes.abandon()
		return out, err
	}
	pipes.serve(input, out.stdout, out.stderr)
	err = cmd.Wait()
	// The command is done, and its answer with it: a child it left in the
	// background would hold stdout open and run on, unwatched. The group's
	// ID stays taken while any member of it lives, so the kill reaches the
	// command's leftovers and nothing else.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	out.held = !pipes.drain(execWaitDelay)
	out.took = time.Since(start)
	switch {
	case runCtx.Err() != nil && ctx.Err() == nil:
		return out, withStderr(fmt.Errorf("%w after %s", ErrExecTimeout, timeout), out.stderr)
	case ctx.Err() != nil:
		return out, ctx.Err()
	case err != nil:
		return out, withStderr(err, out.stderr)
	}
	return out, nil
}

// commandEnv is a command's environment: the daemon's variables that
// execEnv, the locale's prefix or extra name. It is never nil, which would
// hand the command the daemon's whole environment.
func commandEnv(extra []string) []string {
	env := []string{}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if slices.Contains(execEnv, name) || strings.HasPrefix(name, execLocalePrefix) || slices.Contains(extra, name) {
			env = append(env, kv)
		}
	}
	return env
}

// execIO is a command's stdin, stdout and stderr as pipes of the daemon's
// own. Left to os/exec, Wait would also wait for every process holding
// the command's stdout, a child it left in the background among them; with
// the pipes here, Wait returns when the command exits, its group is killed,
// and then what it wrote is read to the end.
type execIO struct {
	// child are the ends the command gets, closed in the daemon once it
	// started; parent are the daemon's: stdin's writer, stdout's and
	// stderr's readers.
	child, parent [3]*os.File
	done          chan struct{}
}

// newExecIO makes the three pipes and hands cmd its ends.
func newExecIO(cmd *exec.Cmd) (*execIO, error) {
	p := &execIO{done: make(chan struct{})}
	for i := range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			p.abandon()
			return nil, fmt.Errorf("pipe: %w", err)
		}
		if i == 0 {
			p.child[i], p.parent[i] = r, w
		} else {
			p.child[i], p.parent[i] = w, r
		}
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = p.child[0], p.child[1], p.child[2]
	return p, nil
}

// abandon closes every pipe of a command that never started.
func (p *execIO) abandon() {
	for _, f := range append(p.child[:], p.parent[:]...) {
		if f != nil {
			_ = f.Close()
		}
	}
}

// serve closes the daemon's copies of the command's ends, then writes req
// to its stdin and reads its stdout and stderr into out and errOut.
func (p *execIO) serve(req []byte, out, errOut io.Writer) {
	for _, f := range p.child {
		_ = f.Close()
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		// A command may answer without reading its request: the write then
		// fails, and that is the command's business.
		_, _ = p.parent[0].Write(req)
		_ = p.parent[0].Close()
	})
	wg.Go(func() { _, _ = io.Copy(out, p.parent[1]) })
	wg.Go(func() { _, _ = io.Copy(errOut, p.parent[2]) })
	go func() {
		wg.Wait()
		close(p.done)
	}()
}

// drain waits up to delay for stdout and stderr to end, then closes the
// daemon's ends. It reports whether they ended by themselves; either way
// the buffers are complete when it returns.
func (p *execIO) drain(delay time.Duration) (ended bool) {
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-p.done:
		ended = true
	case <-t.C:
	}
	for _, f := range p.parent {
		_ = f.Close()
	}
	<-p.done
	return ended
}

// jsonSpace is the whitespace JSON allows around a value.
const jsonSpace = " \t\r\n"

// Exec reply keys: exactly one of them makes a reply.
const (
	execBody       = "body"
	execIgnore     = "ignore"
	execReact      = "react"
	execAttachment = "attachment"
	execApproval   = "approval"
)

// execAttachmentKeys are the keys an attachment object may hold.
var execAttachmentKeys = []string{"path", "name", "mimetype", "caption"}

// parseReply accepts exactly one JSON object on stdout, holding exactly one
// of a non-empty text "body", "ignore": true, a "react" key, an
// "attachment" object or an "approval" object, and nothing else.
func parseReply(out []byte) (Reply, error) {
	// JSON's own whitespace only: bytes.TrimSpace would also drop a
	// vertical tab or a no-break space, taking output that is not JSON.
	trimmed := bytes.Trim(out, jsonSpace)
	if len(trimmed) == 0 {
		return Reply{}, fmt.Errorf("%w: empty stdout", ErrExecReply)
	}
	if trimmed[0] != '{' {
		return Reply{}, fmt.Errorf("%w: stdout is not a JSON object", ErrExecReply)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &obj); err != nil {
		return Reply{}, fmt.Errorf("%w: %w", ErrExecReply, err)
	}
	var present []string
	for k := range obj {
		switch k {
		case execBody, execIgnore, execReact, execAttachment, execApproval:
			present = append(present, k)
		default:
			return Reply{}, fmt.Errorf("%w: unknown key %q", ErrExecReply, k)
		}
	}
	switch len(present) {
	case 0:
		return Reply{}, fmt.Errorf("%w: none of body, ignore, react, attachment and approval", ErrExecReply)
	case 1:
	default:
		slices.Sort(present)
		return Reply{}, fmt.Errorf("%w: more than one of body, ignore, react, attachment and approval (%s)", ErrExecReply,
			strings.Join(present, ", "))
	}
	raw := obj[present[0]]
	switch present[0] {
	case execIgnore:
		if string(raw) != "true" {
			return Reply{}, fmt.Errorf("%w: ignore is %s, not true", ErrExecReply, raw)
		}
		return Reply{Ignore: true}, nil
	case execReact:
		var key string
		if err := json.Unmarshal(raw, &key); err != nil {
			return Reply{}, fmt.Errorf("%w: react is not a string", ErrExecReply)
		}
		if !journal.ValidReactionKey(key) {
			return Reply{}, fmt.Errorf("%w: react must be 1 to %d bytes of text, without control characters or "+
				"surrounding spaces", ErrExecReply, journal.MaxReactionKeyBytes)
		}
		return Reply{React: key}, nil
	case execAttachment:
		f, err := parseAttachment(raw)
		if err != nil {
			return Reply{}, err
		}
		return Reply{Attachment: f}, nil
	case execApproval:
		ask, err := parseApproval(raw)
		if err != nil {
			return Reply{}, err
		}
		return Reply{Approval: ask}, nil
	}
	var body string
	if err := json.Unmarshal(raw, &body); err != nil {
		return Reply{}, fmt.Errorf("%w: body is not a string", ErrExecReply)
	}
	if body == "" {
		return Reply{}, fmt.Errorf("%w: empty body", ErrExecReply)
	}
	content, err := json.Marshal(map[string]string{"msgtype": "m.text", "body": body})
	return Reply{Content: content}, err
}

// parseAttachment reads an attachment object: a non-empty "path", and
// optionally "name", "mimetype" (a media type) and "caption", each a
// string.
func parseAttachment(raw json.RawMessage) (*File, error) {
	if b := bytes.Trim(raw, jsonSpace); len(b) == 0 || b[0] != '{' {
		return nil, fmt.Errorf("%w: attachment is not a JSON object", ErrExecReply)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("%w: attachment: %w", ErrExecReply, err)
	}
	fields := make(map[string]string, len(obj))
	for k, v := range obj {
		if !slices.Contains(execAttachmentKeys, k) {
			return nil, fmt.Errorf("%w: unknown attachment key %q", ErrExecReply, k)
		}
		// A null would decode as "" and pass for an absent key.
		var s string
		if err := json.Unmarshal(v, &s); err != nil || v[0] != '"' {
			return nil, fmt.Errorf("%w: attachment %s is not a string", ErrExecReply, k)
		}
		fields[k] = s
	}
	f := &File{Path: fields["path"], Name: fields["name"], MimeType: fields["mimetype"], Caption: fields["caption"]}
	switch {
	case f.Path == "":
		return nil, fmt.Errorf("%w: attachment without a path", ErrExecReply)
	case strings.ContainsRune(f.Path, 0):
		return nil, fmt.Errorf("%w: attachment path holds a NUL byte", ErrExecReply)
	}
	if f.MimeType != "" {
		if _, _, err := mime.ParseMediaType(f.MimeType); err != nil {
			return nil, fmt.Errorf("%w: attachment mimetype %q is not a media type", ErrExecReply, f.MimeType)
		}
	}
	return f, nil
}

// parseApproval reads an approval object: a non-empty string "call_id"
// and "tool", an "arguments" object, and optionally "approvers" and
// "secret" (lists of strings), "expires_in_s" (a number of seconds, from 1
// to journal.MaxApprovalWindow) and "rendering" (a string). The
// ledger checks the rest when the principal records it.
func parseApproval(raw json.RawMessage) (*ApprovalAsk, error) {
	if b := bytes.Trim(raw, jsonSpace); len(b) == 0 || b[0] != '{' {
		return nil, fmt.Errorf("%w: approval is not a JSON object", ErrExecReply)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("%w: approval: %w", ErrExecReply, err)
	}
	ask := &ApprovalAsk{}
	for k, v := range obj {
		v = bytes.Trim(v, jsonSpace)
		var err error
		switch k {
		case "call_id":
			err = execString(v, &ask.CallID)
		case "tool":
			err = execString(v, &ask.Tool)
		case "rendering":
			err = execString(v, &ask.Rendering)
		case "approvers":
			err = execStrings(v, &ask.Approvers)
		case "secret":
			err = execStrings(v, &ask.Secret)
		case "arguments":
			if len(v) == 0 || v[0] != '{' {
				err = errors.New("not a JSON object")
			}
			ask.Arguments = append(json.RawMessage(nil), v...)
		case "expires_in_s":
			var s float64
			if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) || json.Unmarshal(v, &s) != nil {
				err = errors.New("not a number")
			} else if s < 1 || s > journal.MaxApprovalWindow.Seconds() {
				err = fmt.Errorf("not from 1 to %d seconds", int64(journal.MaxApprovalWindow.Seconds()))
			}
			ask.ExpiresIn = time.Duration(s * float64(time.Second))
		default:
			return nil, fmt.Errorf("%w: unknown approval key %q", ErrExecReply, k)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: approval %s: %v", ErrExecReply, k, err)
		}
	}
	switch {
	case ask.CallID == "":
		return nil, fmt.Errorf("%w: approval without a call_id", ErrExecReply)
	case ask.Tool == "":
		return nil, fmt.Errorf("%w: approval without a tool", ErrExecReply)
	case ask.Arguments == nil:
		return nil, fmt.Errorf("%w: approval without arguments", ErrExecReply)
	}
	return ask, nil
}

// execString decodes a JSON string into s; a null is refused, not taken
// for "".
func execString(v json.RawMessage, s *string) error {
	v = bytes.Trim(v, jsonSpace)
	if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, s) != nil {
		return errors.New("not a string")
	}
	return nil
}

// execStrings decodes a JSON list of strings into s.
func execStrings(v json.RawMessage, s *[]string) error {
	var items []json.RawMessage
	if len(v) == 0 || v[0] != '[' || json.Unmarshal(v, &items) != nil {
		return errors.New("not a list of strings")
	}
	out := make([]string, len(items))
	for i, item := range items {
		if execString(item, &out[i]) != nil {
			return errors.New("not a list of strings")
		}
	}
	*s = out
	return nil
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
