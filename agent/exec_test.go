package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// agentMode makes the test binary act as an exec agent: the tests run it
// as their command, so they need no interpreter on the machine. The mode
// travels in the environment, which also proves the command gets the
// variables its Env names.
const (
	agentMode = "MINDROOMD_EXEC_AGENT_MODE"
	// agentPIDs names the file the sleeping agent writes its own and its
	// child's process IDs to.
	agentPIDs = "MINDROOMD_EXEC_AGENT_PIDS"
	// agentReply holds the reply the raw agent prints.
	agentReply = "MINDROOMD_EXEC_AGENT_REPLY"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(agentMode); mode != "" {
		os.Exit(actAsAgent(mode))
	}
	os.Exit(m.Run())
}

// actAsAgent reads the request on stdin and answers, or misbehaves, as mode
// says, returning the exit code.
func actAsAgent(mode string) int {
	req, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	switch mode {
	case "echo": // the whole request, as the body, for the test to check
		b, _ := json.Marshal(map[string]string{"body": string(req)})
		os.Stdout.Write(b)
	case "ignore":
		fmt.Print(`{"ignore": true}` + "\n")
	case "fail":
		fmt.Fprint(os.Stderr, strings.Repeat("x", 10000)+"\nTraceback: the model is unreachable\n")
		return 3
	case "raw": // the reply the test put in the environment, verbatim
		fmt.Print(os.Getenv(agentReply))
	case "env": // its whole environment, as the body
		b, _ := json.Marshal(map[string]string{"body": strings.Join(os.Environ(), "\n")})
		os.Stdout.Write(b)
	case "big":
		fmt.Print(`{"body":"` + strings.Repeat("a", agent.MaxExecOutput) + `"}`)
	case "sleep": // a child in the same group, both sleeping far past the timeout
		child := exec.Command(os.Args[0])
		child.Env = append(os.Environ(), agentMode+"=sleep-child")
		child.Stdout = os.Stdout
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		path := os.Getenv(agentPIDs)
		if err := os.WriteFile(path+".tmp", fmt.Appendf(nil, "%d %d", os.Getpid(), child.Process.Pid), 0o600); err != nil {
			return 1
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			return 1
		}
		time.Sleep(time.Hour)
	case "sleep-child":
		time.Sleep(time.Hour)
	}
	return 0
}

const (
	execRoom = "!room:example.org"
	alice    = "@alice:example.org"
)

// execTurn admits events into a real journal and returns the turn of the
// pending event eventID, as the principal would offer it.
func execTurn(t *testing.T, eventID string, evs ...mx.Ev) agent.Turn {
	t.Helper()
	ctx := context.Background()
	s, _ := testsupport.MustOpen(t)
	v, err := s.Principal(ctx, "bot", "@bot:example.org")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.AdmitBatch(ctx, mx.Live(execRoom, evs...), ""); err != nil {
		t.Fatal(err)
	}
	page, err := v.Pending(ctx, 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range page.Events {
		if e.EventID == eventID {
			thread, _, err := v.AdmittedThreadID(ctx, execRoom, eventID)
			if err != nil {
				t.Fatal(err)
			}
			return agent.Turn{Event: e, Thread: thread, Conversation: v}
		}
	}
	t.Fatalf("%s is not pending", eventID)
	return agent.Turn{}
}

// execAgent is the test binary run as an agent in mode.
func execAgent(t *testing.T, mode string) agent.Exec {
	t.Setenv(agentMode, mode)
	// A race-enabled binary otherwise lingers a second at exit.
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	return agent.Exec{Command: []string{os.Args[0]}, Env: []string{agentMode, agentPIDs, agentReply, "GORACE"},
		Timeout: time.Minute, Log: zerolog.Nop()}
}

func TestExecSendsTheEventAndTheLastMessagesOfItsThread(t *testing.T) {
	turn := execTurn(t, "$q",
		mx.Message("$room1", alice, 1000, "in the room"),
		mx.Message("$root", alice, 2000, "root"),
		mx.ThreadReply("$t1", alice, 3000, "$root", "first"),
		mx.ThreadReply("$t2", alice, 4000, "$root", "second"),
		mx.Message("$room2", alice, 5000, "room again"),
		mx.ThreadReply("$q", alice, 6000, "$root", "question"),
	)
	a := execAgent(t, "echo")
	a.Context = 3
	reply, err := a.Answer(context.Background(), turn)
	if err != nil {
		t.Fatal(err)
	}
	var content struct{ MsgType, Body string }
	if err := json.Unmarshal(reply.Content, &content); err != nil || reply.Ignore || content.MsgType != "m.text" {
		t.Fatalf("reply = %s (ignore %v), want an m.text", reply.Content, reply.Ignore)
	}
	var req struct {
		Event        map[string]any `json:"event"`
		EventID      string         `json:"event_id"`
		RoomID       string         `json:"room_id"`
		ThreadID     *string        `json:"thread_id"`
		Sender       string         `json:"sender"`
		Body         string         `json:"body"`
		Conversation []struct {
			EventID   string         `json:"event_id"`
			Sender    string         `json:"sender"`
			CreatedTS int64          `json:"created_ts"`
			Body      string         `json:"body"`
			Content   map[string]any `json:"content"`
		} `json:"conversation"`
	}
	if err := json.Unmarshal([]byte(content.Body), &req); err != nil {
		t.Fatalf("the agent read %q: %v", content.Body, err)
	}
	if req.EventID != "$q" || req.RoomID != execRoom || req.Sender != alice || req.Body != "question" ||
		req.ThreadID == nil || *req.ThreadID != "$root" || req.Event["event_id"] != "$q" {
		t.Fatalf("request = %s", content.Body)
	}
	var got []string
	for _, m := range req.Conversation {
		got = append(got, fmt.Sprintf("%s %s %d %s %v", m.EventID, m.Sender, m.CreatedTS, m.Body, m.Content["body"]))
	}
	want := []string{
		"$t1 " + alice + " 3000 first first",
		"$t2 " + alice + " 4000 second second",
		"$q " + alice + " 6000 question question",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("conversation =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestExecSendsTheRoomForAnEventOutsideAThread(t *testing.T) {
	turn := execTurn(t, "$q",
		mx.Message("$root", alice, 1000, "root"),
		mx.ThreadReply("$t1", alice, 2000, "$root", "in the thread"),
		mx.Message("$q", alice, 3000, "question"),
	)
	reply, err := execAgent(t, "echo").Answer(context.Background(), turn)
	if err != nil {
		t.Fatal(err)
	}
	var content struct{ Body string }
	if err := json.Unmarshal(reply.Content, &content); err != nil {
		t.Fatal(err)
	}
	var req struct {
		ThreadID     json.RawMessage `json:"thread_id"`
		Conversation []struct {
			EventID string `json:"event_id"`
		} `json:"conversation"`
	}
	if err := json.Unmarshal([]byte(content.Body), &req); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range req.Conversation {
		ids = append(ids, m.EventID)
	}
	if string(req.ThreadID) != "null" || strings.Join(ids, " ") != "$root $q" {
		t.Fatalf("thread_id = %s, conversation = %v; want null and the room's messages", req.ThreadID, ids)
	}
}

func TestExecIgnoresWhenTheAgentSaysSo(t *testing.T) {
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	reply, err := execAgent(t, "ignore").Answer(context.Background(), turn)
	if err != nil || !reply.Ignore || reply.Content != nil {
		t.Fatalf("reply = %s (ignore %v), %v; want the turn ignored", reply.Content, reply.Ignore, err)
	}
}

func TestExecFailsOnANonZeroExitWithTheEndOfStderr(t *testing.T) {
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	_, err := execAgent(t, "fail").Answer(context.Background(), turn)
	if err == nil {
		t.Fatal("a failed agent answered")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "exec agent: exit status 3: stderr: ") || !strings.HasSuffix(msg, "Traceback: the model is unreachable") {
		t.Fatalf("err = …%q, want the exit status and the end of stderr", msg[max(len(msg)-200, 0):])
	}
	if len(msg) > 4<<10 {
		t.Fatalf("err is %d bytes long, want stderr cut to its end", len(msg))
	}
}

func TestExecKillsTheAgentAndItsChildrenOnTimeout(t *testing.T) {
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	pids := filepath.Join(t.TempDir(), "pids")
	t.Setenv(agentPIDs, pids)
	a := execAgent(t, "sleep")
	a.Timeout = 3 * time.Second
	start := time.Now()
	_, err := a.Answer(context.Background(), turn)
	took := time.Since(start)
	if !errors.Is(err, agent.ErrExecTimeout) || !strings.Contains(err.Error(), "exec agent: timed out after 3s") {
		t.Fatalf("err = %v, want a timeout", err)
	}
	// Had a child outlived the kill, it would have held stdout open until
	// the wait delay gave up on it.
	if took > a.Timeout+time.Second {
		t.Fatalf("Answer took %s past a %s timeout", took, a.Timeout)
	}
	b, err := os.ReadFile(pids)
	if err != nil {
		t.Fatalf("the agent never started its child within the timeout: %v", err)
	}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		waitGone(t, pid)
	}
}

// waitGone waits for pid to be dead: gone, or a zombie its new parent has
// yet to reap. Killed, it is at most a moment from either.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		// The state follows the parenthesised command name.
		if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d is still alive: %s", pid, stat)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExecRefusesOutputThatIsNotOneReply(t *testing.T) {
	for _, c := range []struct{ name, out, want string }{
		{"Empty", "", "empty stdout"},
		{"NotJSON", "hello", "not a JSON object"},
		{"NotAnObject", `["hi"]`, "not a JSON object"},
		{"Null", "null", "not a JSON object"},
		{"Both", `{"body":"hi","ignore":true}`, "more than one of body, ignore, react, attachment and approval (body, ignore)"},
		{"Neither", `{}`, "none of body, ignore, react, attachment and approval"},
		{"ReactAndBody", `{"react":"👍","body":"hi"}`, "more than one of body, ignore, react, attachment and approval (body, react)"},
		{"ReactNotText", `{"react":1}`, "react is not a string"},
		{"ReactEmpty", `{"react":""}`, "react must be 1 to 64 bytes"},
		{"ReactPadded", `{"react":" 👍 "}`, "react must be 1 to 64 bytes"},
		{"ReactControl", `{"react":"a\u0007"}`, "react must be 1 to 64 bytes"},
		{"AttachmentAndBody", `{"attachment":{"path":"/a"},"body":"caption"}`, "more than one of body, ignore, react, attachment and approval (attachment, body)"},
		{"AttachmentNotAnObject", `{"attachment":"/tmp/a.png"}`, "attachment is not a JSON object"},
		{"AttachmentWithoutPath", `{"attachment":{"name":"a.png"}}`, "attachment without a path"},
		{"AttachmentEmptyPath", `{"attachment":{"path":""}}`, "attachment without a path"},
		{"AttachmentNULPath", `{"attachment":{"path":"a\u0000b"}}`, "attachment path holds a NUL byte"},
		{"AttachmentUnknownKey", `{"attachment":{"path":"/a","size":3}}`, `unknown attachment key "size"`},
		{"AttachmentNullCaption", `{"attachment":{"path":"/a","caption":null}}`, "attachment caption is not a string"},
		{"AttachmentBadMimetype", `{"attachment":{"path":"/a","mimetype":"an image"}}`, `attachment mimetype "an image" is not a media type`},
		{"EmptyBody", `{"body":""}`, "empty body"},
		{"BodyNotText", `{"body":7}`, "body is not a string"},
		{"IgnoreFalse", `{"ignore":false}`, "ignore is false, not true"},
		{"ExtraKey", `{"body":"hi","format":"markdown"}`, `unknown key "format"`},
		{"KeysAreExact", `{"BODY":"hi"}`, `unknown key "BODY"`},
		{"TrailingGarbage", `{"body":"hi"} and more`, "invalid character"},
		{"TwoObjects", `{"body":"hi"}{"body":"again"}`, "invalid character"},
	} {
		t.Run(c.name, func(t *testing.T) {
			turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
			t.Setenv(agentReply, c.out)
			_, err := execAgent(t, "raw").Answer(context.Background(), turn)
			if !errors.Is(err, agent.ErrExecReply) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want an invalid reply: %s", err, c.want)
			}
		})
	}
}

func TestExecAnswersWithAReaction(t *testing.T) {
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	t.Setenv(agentReply, `{"react": "👍"}`)
	reply, err := execAgent(t, "raw").Answer(context.Background(), turn)
	if err != nil || reply.React != "👍" || reply.Ignore || reply.Content != nil || reply.Attachment != nil {
		t.Fatalf("reply = %+v, %v; want the reaction 👍 alone", reply, err)
	}
}

// An attachment's relative path is the command's working directory's, the
// daemon's: the reply names the file by its whole path.
func TestExecAnswersWithAnAttachmentItsRelativePathMadeWhole(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, out string
		want      agent.File
	}{
		{"Absolute", `{"attachment": {"path": "/srv/out/chart.png"}}`, agent.File{Path: "/srv/out/chart.png"}},
		{"Relative", `{"attachment": {"path": "out/chart.png", "name": "Chart.png", "mimetype": "image/png", "caption": "the chart"}}`,
			agent.File{Path: filepath.Join(wd, "out/chart.png"), Name: "Chart.png", MimeType: "image/png", Caption: "the chart"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
			t.Setenv(agentReply, c.out)
			reply, err := execAgent(t, "raw").Answer(context.Background(), turn)
			if err != nil || reply.Attachment == nil || *reply.Attachment != c.want || reply.Content != nil || reply.React != "" {
				t.Fatalf("reply = %+v (attachment %+v), %v; want the attachment %+v alone", reply, reply.Attachment, err, c.want)
			}
		})
	}
}

func TestExecAcceptsAReplyFollowedByANewline(t *testing.T) {
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	t.Setenv(agentReply, "{\"body\": \"hello\"}\n")
	reply, err := execAgent(t, "raw").Answer(context.Background(), turn)
	if err != nil || string(reply.Content) != `{"body":"hello","msgtype":"m.text"}` {
		t.Fatalf("reply = %s, %v", reply.Content, err)
	}
}

func TestExecRefusesOversizedOutput(t *testing.T) {
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	_, err := execAgent(t, "big").Answer(context.Background(), turn)
	if !errors.Is(err, agent.ErrExecReply) || !strings.Contains(err.Error(), "stdout exceeds 65536 bytes") {
		t.Fatalf("err = %v, want oversized output refused", err)
	}
}

func TestExecFailsWhenTheCommandCannotStart(t *testing.T) {
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	a := agent.Exec{Command: []string{filepath.Join(t.TempDir(), "missing")}, Log: zerolog.Nop()}
	if _, err := a.Answer(context.Background(), turn); err == nil || !strings.HasPrefix(err.Error(), "exec agent: ") {
		t.Fatalf("err = %v, want the start refused", err)
	}
}

func TestAnExecCommandGetsNoneOfTheDaemonsEnvironmentButTheAllowedAndWhatItsEnvNames(t *testing.T) {
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	t.Setenv(config.EnvDatabaseURL, "postgres://mindroom:db-pw-never-shown@db.internal/journal")
	t.Setenv("MINDROOM_HOMESERVER", "http://127.0.0.1:8008")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "another-agents-secret")
	t.Setenv("THE_AGENTS_OWN_KEY", "sk-named-for-this-agent")
	t.Setenv("LC_TIME", "C.UTF-8")
	t.Setenv("TZ", "UTC")
	a := execAgent(t, "env")
	a.Env = append(a.Env, "THE_AGENTS_OWN_KEY")
	reply, err := a.Answer(context.Background(), turn)
	if err != nil {
		t.Fatal(err)
	}
	var content struct{ Body string }
	if err := json.Unmarshal(reply.Content, &content); err != nil {
		t.Fatal(err)
	}
	allowed := append([]string{"PATH", "HOME", "USER", "LANG", "TZ", "TMPDIR"}, a.Env...)
	got := make(map[string]string)
	for _, kv := range strings.Split(content.Body, "\n") {
		name, value, _ := strings.Cut(kv, "=")
		got[name] = value
		if strings.HasPrefix(name, "MINDROOM_") || (!slices.Contains(allowed, name) && !strings.HasPrefix(name, "LC_")) {
			t.Errorf("the command sees %s", kv)
		}
	}
	for name, want := range map[string]string{"THE_AGENTS_OWN_KEY": "sk-named-for-this-agent", "LC_TIME": "C.UTF-8",
		"TZ": "UTC", "PATH": os.Getenv("PATH"), agentMode: "env"} {
		if got[name] != want {
			t.Errorf("the command sees %s=%q, want %q", name, got[name], want)
		}
	}
}

func TestAnExecReplyIsTakenWhenTheCommandExitsLeavingAChildHoldingStdout(t *testing.T) {
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	dir := t.TempDir()
	script, pidFile := filepath.Join(dir, "agent.sh"), filepath.Join(dir, "child.pid")
	if err := os.WriteFile(script, []byte(`cat >/dev/null
printf '{"body":"answered"}\n'
sleep 30 &
echo $! >"$1"
exit 0
`), 0o600); err != nil {
		t.Fatal(err)
	}
	a := agent.Exec{Command: []string{"/bin/sh", script, pidFile}, Timeout: time.Minute, Log: zerolog.Nop()}
	start := time.Now()
	reply, err := a.Answer(context.Background(), turn)
	took := time.Since(start)
	if err != nil || string(reply.Content) != `{"body":"answered","msgtype":"m.text"}` {
		t.Fatalf("reply = %s, %v; want the reply the command printed before it exited", reply.Content, err)
	}
	// Waiting on the child would have taken its 30 seconds.
	if took > 10*time.Second {
		t.Fatalf("Answer took %s", took)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
}

func TestExecAsksForAnApprovalAndIsSentTheDecisionsWhenRunAgain(t *testing.T) {
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "mail bob"))
	t.Setenv(agentReply, `{"approval": {"call_id": "c1", "tool": "send_mail", "arguments": {"to": "bob@example.org"},
		"approvers": ["@carol:example.org"], "expires_in_s": 90, "secret": ["token"], "rendering": "Mail Bob?"}}`)
	reply, err := execAgent(t, "raw").Answer(context.Background(), turn)
	if err != nil {
		t.Fatal(err)
	}
	ask := reply.Approval
	if ask == nil || ask.CallID != "c1" || ask.Tool != "send_mail" || string(ask.Arguments) != `{"to": "bob@example.org"}` ||
		!slices.Equal(ask.Approvers, []string{"@carol:example.org"}) || ask.ExpiresIn != 90*time.Second ||
		!slices.Equal(ask.Secret, []string{"token"}) || ask.Rendering != "Mail Bob?" {
		t.Fatalf("reply = %+v, want the approval as the agent asked it", reply)
	}
	if err := reply.Validate(); err != nil {
		t.Fatal(err)
	}

	// Without approvals the request has no "approvals" key at all.
	plain, err := execAgent(t, "echo").Answer(context.Background(), turn)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(plain.Content), `approvals`) {
		t.Fatalf("a request without approvals = %s", plain.Content)
	}
	approved := journal.Approval{ApprovalRequest: journal.ApprovalRequest{EventID: "$q", CallID: "c1", Tool: "send_mail",
		Arguments: json.RawMessage(`{"to":"bob@example.org"}`)}, State: journal.ApprovalApproved, DecidedBy: alice}
	expired := journal.Approval{ApprovalRequest: journal.ApprovalRequest{EventID: "$q", CallID: "c2", Tool: "rm",
		Arguments: json.RawMessage(`{}`)}, State: journal.ApprovalExpired, Reason: "nobody decided in time"}
	turn.Approvals = []journal.Approval{approved, expired}
	again, err := execAgent(t, "echo").Answer(context.Background(), turn)
	if err != nil {
		t.Fatal(err)
	}
	var content struct{ Body string }
	if err := json.Unmarshal(again.Content, &content); err != nil {
		t.Fatal(err)
	}
	var req struct {
		Approvals []map[string]any `json:"approvals"`
	}
	if err := json.Unmarshal([]byte(content.Body), &req); err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(req.Approvals)
	want := `[{"arguments":{"to":"bob@example.org"},"call_id":"c1","decided_by":"@alice:example.org","state":"approved","tool":"send_mail"},` +
		`{"arguments":{},"call_id":"c2","decided_by":"","reason":"nobody decided in time","state":"expired","tool":"rm"}]`
	if string(got) != want {
		t.Fatalf("approvals = %s\nwant        %s", got, want)
	}
}

func TestExecRefusesAnApprovalThatIsNotOne(t *testing.T) {
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "hi"))
	for _, out := range []string{
		`{"approval": {"tool": "t", "arguments": {}}}`,
		`{"approval": {"call_id": "c1", "arguments": {}}}`,
		`{"approval": {"call_id": "c1", "tool": "t"}}`,
		`{"approval": {"call_id": "c1", "tool": "t", "arguments": "{}"}}`,
		`{"approval": {"call_id": "c1", "tool": "t", "arguments": {}, "expires_in_s": 0}}`,
		`{"approval": {"call_id": "c1", "tool": "t", "arguments": {}, "approvers": "@a:b"}}`,
		`{"approval": {"call_id": "c1", "tool": "t", "arguments": {}, "state": "approved"}}`,
		`{"approval": {"call_id": "c1", "tool": "t", "arguments": {}}, "body": "and words"}`,
	} {
		t.Setenv(agentReply, out)
		if _, err := execAgent(t, "raw").Answer(context.Background(), turn); !errors.Is(err, agent.ErrExecReply) {
			t.Errorf("%s: err = %v, want ErrExecReply", out, err)
		}
	}
}
