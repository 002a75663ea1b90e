package agent_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/modelstub"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// mailTool is a tool that "sends mail": each run appends its arguments to
// a file, a line each, and answers "mail sent".
func mailTool(t *testing.T, approval bool) (agent.Tool, string) {
	t.Helper()
	runs := filepath.Join(t.TempDir(), "runs")
	return agent.Tool{Name: "send_mail", Description: "Sends a mail.", Approval: approval,
		Parameters: map[string]any{"type": "object", "properties": map[string]any{"to": map[string]any{"type": "string"}}},
		Command:    []string{"/bin/sh", "-c", `cat >>"$1"; echo >>"$1"; printf 'mail sent'`, "tool", runs}}, runs
}

// runLines reads a tool's runs, one line each.
func runLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

// callsThenText answers a request that carries no tool result with calls,
// and one that does with text.
func callsThenText(calls []modelstub.ToolCall, text string) func(modelstub.Request) modelstub.Reply {
	return func(r modelstub.Request) modelstub.Reply {
		if last := r.Messages[len(r.Messages)-1]; last.Role == "tool" {
			return modelstub.Reply{Text: text}
		}
		return modelstub.Reply{ToolCalls: calls}
	}
}

// ledger is the journal view behind a test turn.
func ledger(t *testing.T, turn agent.Turn) journal.Approvals {
	t.Helper()
	l, ok := turn.Conversation.(journal.Approvals)
	if !ok {
		t.Fatal("the turn's journal view keeps no approvals")
	}
	return l
}

// askAndDecide records what the agent asked, as the principal does, and
// decides it; it returns the turn as it is offered again.
func askAndDecide(t *testing.T, turn agent.Turn, ask *agent.ApprovalAsk, d journal.ApprovalDecision) agent.Turn {
	t.Helper()
	ctx := context.Background()
	l := ledger(t, turn)
	if _, _, err := l.RequestApproval(ctx, journal.ApprovalRequest{EventID: turn.Event.EventID, CallID: ask.CallID,
		Tool: ask.Tool, Arguments: ask.Arguments, Approvers: ask.Approvers, Secret: ask.Secret, Rendering: ask.Rendering,
		ExpiresMS: time.Now().Add(time.Hour).UnixMilli(), Context: ask.Context}, journal.DefaultApprovalKeys); err != nil {
		t.Fatalf("record the request: %v", err)
	}
	if _, _, err := l.DecideApproval(ctx, ask.CallID, d); err != nil {
		t.Fatalf("decide: %v", err)
	}
	calls, err := l.ApprovalsForEvent(ctx, turn.Event.EventID)
	if err != nil {
		t.Fatal(err)
	}
	turn.Approvals, turn.ToolRuns = calls, l
	return turn
}

// toolMessages are the tool results a request carries.
func toolMessages(r modelstub.Request) []string {
	var out []string
	for _, m := range r.Messages {
		if m.Role == "tool" {
			out = append(out, m.ToolCallID+"="+m.Content)
		}
	}
	return out
}

func TestAToolThatNeedsApprovalAsksAPersonAndRunsOnceApprovedWithoutAskingTheModelAgain(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "Whole", true: "Streamed"}[stream], func(t *testing.T) {
			ctx := context.Background()
			model := startModel(t, callsThenText([]modelstub.ToolCall{{ID: "call_a", Name: "send_mail",
				Arguments: `{"to": "bob@example.org"}`}}, "Mail sent to bob."))
			tool, runs := mailTool(t, true)
			tool.Approvers = []string{"@carol:example.org"}
			a := newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.Tools, o.Stream = []agent.Tool{tool}, stream })
			turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "mail bob"))

			reply, err := a.Answer(ctx, turn)
			if err != nil {
				t.Fatal(err)
			}
			ask := reply.Approval
			if ask == nil || ask.Tool != "send_mail" || string(ask.Arguments) != `{"to": "bob@example.org"}` ||
				len(ask.Approvers) != 1 || ask.Approvers[0] != "@carol:example.org" || ask.Context == nil {
				t.Fatalf("reply = %+v (approval %+v), want the model's call asked about, with its context", reply, ask)
			}
			if got := runLines(t, runs); got != nil {
				t.Fatalf("the tool ran before anyone approved: %q", got)
			}
			if reqs := model.Requests(); len(reqs) != 1 || len(reqs[0].Tools) != 1 || reqs[0].Tools[0] != "send_mail" {
				t.Fatalf("requests = %+v, want one offering send_mail", reqs)
			}

			turn = askAndDecide(t, turn, ask, journal.ApprovalDecision{State: journal.ApprovalApproved, By: "@carol:example.org"})
			reply, err = a.Answer(ctx, turn)
			if err != nil {
				t.Fatal(err)
			}
			if _, body, _ := replyBody(t, reply); body != "Mail sent to bob." {
				t.Fatalf("reply = %s, want the model's answer after the tool ran", reply.Content)
			}
			// The run gets the call as the ledger approved it: its
			// arguments in canonical form.
			if got := runLines(t, runs); len(got) != 1 || got[0] != `{"to":"bob@example.org"}` {
				t.Fatalf("tool runs = %q, want one with the approved arguments", got)
			}
			reqs := model.Requests()
			if len(reqs) != 2 {
				t.Fatalf("%d requests, want 2: the step that called the tool is never asked again", len(reqs))
			}
			if got := toolMessages(reqs[1]); len(got) != 1 || got[0] != "call_a=mail sent" {
				t.Fatalf("the second request's tool results = %q, want the run's output answering call_a", got)
			}
			if m := reqs[1].Messages[len(reqs[1].Messages)-2]; m.Role != "assistant" || len(m.ToolCalls) != 1 ||
				m.ToolCalls[0].ID != "call_a" || m.ToolCalls[0].Arguments != `{"to": "bob@example.org"}` {
				t.Fatalf("the assistant's step = %+v, want the call as the model made it", m)
			}

			// Offered again, as after a crash before the answer was
			// recorded: the run's recorded result is used, the tool does
			// not run again, and only the step after it is asked again.
			if _, err := a.Answer(ctx, turn); err != nil {
				t.Fatal(err)
			}
			if got := runLines(t, runs); len(got) != 1 {
				t.Fatalf("tool runs = %q after the turn was offered again, want still one", got)
			}
			if reqs := model.Requests(); len(reqs) != 3 || len(toolMessages(reqs[2])) != 1 {
				t.Fatalf("requests = %d, want the step after the call asked again and nothing before it", len(reqs))
			}
		})
	}
}

func TestADeniedOrExpiredCallNeverRunsAndTheModelIsToldWhy(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    journal.ApprovalDecision
		want string
	}{
		{"Denied", journal.ApprovalDecision{State: journal.ApprovalDenied, By: alice}, "The call was denied by " + alice + "; it did not run."},
		{"Expired", journal.ApprovalDecision{State: journal.ApprovalExpired}, "Nobody decided on the call in time; it did not run."},
		{"Withdrawn", journal.ApprovalDecision{State: journal.ApprovalWithdrawn, Reason: "the card was removed"},
			"The call was withdrawn (the card was removed); it did not run."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			model := startModel(t, callsThenText([]modelstub.ToolCall{{ID: "c", Name: "send_mail", Arguments: `{"to":"bob"}`}}, "OK."))
			tool, runs := mailTool(t, true)
			a := newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.Tools = []agent.Tool{tool} })
			turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "mail bob"))
			reply, err := a.Answer(ctx, turn)
			if err != nil || reply.Approval == nil {
				t.Fatalf("reply = %+v, %v", reply, err)
			}
			turn = askAndDecide(t, turn, reply.Approval, tc.d)
			if _, err := a.Answer(ctx, turn); err != nil {
				t.Fatal(err)
			}
			if got := runLines(t, runs); got != nil {
				t.Fatalf("the tool ran: %q", got)
			}
			reqs := model.Requests()
			if got := toolMessages(reqs[len(reqs)-1]); len(got) != 1 || got[0] != "c="+tc.want {
				t.Fatalf("tool results = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestARunThatAStopCutShortIsNeverRunAgain(t *testing.T) {
	ctx := context.Background()
	model := startModel(t, callsThenText([]modelstub.ToolCall{{ID: "c", Name: "send_mail", Arguments: `{"to":"bob"}`}}, "OK."))
	tool, runs := mailTool(t, true)
	a := newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.Tools = []agent.Tool{tool} })
	turn := execTurn(t, "$q", mx.Message("$q", alice, 1000, "mail bob"))
	reply, err := a.Answer(ctx, turn)
	if err != nil || reply.Approval == nil {
		t.Fatalf("reply = %+v, %v", reply, err)
	}
	turn = askAndDecide(t, turn, reply.Approval, journal.ApprovalDecision{State: journal.ApprovalApproved, By: alice})
	// The run was claimed, and the daemon stopped before its result was
	// recorded.
	if _, started, err := turn.ToolRuns.StartToolRun(ctx, reply.Approval.CallID); err != nil || !started {
		t.Fatalf("claim = %v, %v", started, err)
	}
	if _, err := a.Answer(ctx, turn); err != nil {
		t.Fatal(err)
	}
	if got := runLines(t, runs); got != nil {
		t.Fatalf("the tool ran again: %q", got)
	}
	reqs := model.Requests()
	if got := toolMessages(reqs[len(reqs)-1]); len(got) != 1 || !strings.Contains(got[0], "whether it finished is not known") {
		t.Fatalf("tool results = %q, want the model told the outcome is unknown", got)
	}
}

func TestAToolWithoutApprovalRunsAtOnceAndBadCallsAreToldToTheModel(t *testing.T) {
	ctx := context.Background()
	model := startModel(t, callsThenText([]modelstub.ToolCall{
		{ID: "ok", Name: "send_mail", Arguments: `{"to":"bob"}`},
		{ID: "unknown", Name: "format_disk", Arguments: `{}`},
		{ID: "bad", Name: "send_mail", Arguments: `["not", "an", "object"]`},
	}, "Done."))
	tool, runs := mailTool(t, false)
	a := newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.Tools = []agent.Tool{tool} })
	reply, err := a.Answer(ctx, execTurn(t, "$q", mx.Message("$q", alice, 1000, "mail bob")))
	if err != nil {
		t.Fatal(err)
	}
	if _, body, _ := replyBody(t, reply); body != "Done." {
		t.Fatalf("reply = %s", reply.Content)
	}
	if got := runLines(t, runs); len(got) != 1 || got[0] != `{"to":"bob"}` {
		t.Fatalf("tool runs = %q, want the one good call", got)
	}
	reqs := model.Requests()
	got := toolMessages(reqs[len(reqs)-1])
	want := []string{"ok=mail sent", `unknown=error: there is no tool named "format_disk"`,
		"bad=error: the arguments are not one JSON object; the call did not run"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("tool results = %q, want %q", got, want)
	}
}

func TestAModelThatCallsToolsForeverIsMadeToAnswer(t *testing.T) {
	model := startModel(t, func(r modelstub.Request) modelstub.Reply {
		if r.ToolChoice == "none" {
			return modelstub.Reply{Text: "Enough."}
		}
		return modelstub.Reply{ToolCalls: []modelstub.ToolCall{{ID: "again", Name: "send_mail", Arguments: `{}`}}}
	})
	tool, runs := mailTool(t, false)
	a := newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.Tools = []agent.Tool{tool} })
	reply, err := a.Answer(context.Background(), execTurn(t, "$q", mx.Message("$q", alice, 1000, "loop")))
	if err != nil {
		t.Fatal(err)
	}
	if _, body, _ := replyBody(t, reply); body != "Enough." {
		t.Fatalf("reply = %s", reply.Content)
	}
	if got := len(runLines(t, runs)); got != agent.MaxToolSteps {
		t.Fatalf("%d runs, want %d: one per step allowed", got, agent.MaxToolSteps)
	}
	if got := len(model.Requests()); got != agent.MaxToolSteps+1 {
		t.Fatalf("%d requests, want %d", got, agent.MaxToolSteps+1)
	}
}

func TestAnApprovalsContextIsTheTranscriptAndRoundTrips(t *testing.T) {
	model := startModel(t, callsThenText([]modelstub.ToolCall{{ID: "c", Name: "send_mail", Arguments: `{"to":"bob"}`}}, "OK."))
	tool, _ := mailTool(t, true)
	a := newOpenAI(t, model, func(o *agent.OpenAIOptions) { o.Tools = []agent.Tool{tool} })
	reply, err := a.Answer(context.Background(), execTurn(t, "$q", mx.Message("$q", alice, 1000, "mail bob")))
	if err != nil || reply.Approval == nil {
		t.Fatalf("reply = %+v, %v", reply, err)
	}
	var tr struct {
		Steps []struct {
			Calls []struct {
				ID, Name, Arguments string
				Result              *string
			}
		}
	}
	if err := json.Unmarshal(reply.Approval.Context, &tr); err != nil || len(tr.Steps) != 1 || len(tr.Steps[0].Calls) != 1 ||
		tr.Steps[0].Calls[0].ID != "c" || tr.Steps[0].Calls[0].Result != nil {
		t.Fatalf("context = %s (%v), want the one step with its call unsettled", reply.Approval.Context, err)
	}
}
