package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"github.com/mindroomd/mindroomd/journal"
)

const (
	// DefaultToolTimeout bounds one run of a tool when Tool.Timeout is
	// zero.
	DefaultToolTimeout = time.Minute
	// MaxToolOutput is how much of a tool's stdout the model is shown;
	// more is cut off, and the model told so.
	MaxToolOutput = 16 << 10
	// MaxToolSteps bounds how many times one turn lets the model call
	// tools: past it the model is asked to answer without them, so a model
	// that calls tools in a loop still ends its turn.
	MaxToolSteps = 8
)

// Tool is a function the model may call, run as a command: the call's
// arguments (a JSON object) go to its stdin, and what it writes on stdout
// is the result the model is shown. A non-zero exit or a timeout is shown
// to the model as the call's failure; it does not fail the turn.
//
// A tool with Approval asks a person first: the model's call becomes an
// approval request with a card in the room, the turn waits, and the call
// runs only once approved, at most once whatever crashes (its run is
// claimed in the journal before it starts). A tool without it runs as soon
// as the model calls it, and again should the turn be asked again after a
// crash: only tools that are safe to repeat (a lookup, a read) should go
// without.
type Tool struct {
	// Name is the function's name as the model calls it.
	Name string
	// Description tells the model what the tool does.
	Description string
	// Parameters is the JSON schema of its arguments; nil is an object
	// without properties.
	Parameters map[string]any
	// Command is the program and its arguments; not run through a shell.
	Command []string
	// Env names further variables of the daemon's environment the
	// command gets (see Exec.Env).
	Env []string
	// Timeout bounds one run; zero means DefaultToolTimeout.
	Timeout time.Duration
	// Approval asks a person before each call runs.
	Approval bool
	// Approvers may decide; empty means the sender of the event whose turn
	// it is.
	Approvers []string
	// ExpiresIn is how long a call waits for a decision; zero means the
	// principal's default.
	ExpiresIn time.Duration
	// Secret names arguments the card never shows.
	Secret []string
}

// toolCall is one call the model made, and once it is settled, what the
// model is told of it.
type toolCall struct {
	// ID is the model's own ID of the call, which its result answers.
	ID        string  `json:"id"`
	Name      string  `json:"name"`
	Arguments string  `json:"arguments"`
	Result    *string `json:"result,omitempty"`
}

// toolStep is one answer of the model that called tools: what it said
// alongside, and its calls.
type toolStep struct {
	Content string     `json:"content,omitempty"`
	Calls   []toolCall `json:"calls"`
}

// transcript is a turn's tool calls so far, the model's steps in order. It
// is the context a call that needs approval is asked with, so the turn
// resumes after the decision from the step that asked, and never asks the
// model for a step it already took.
type transcript struct {
	Steps []toolStep `json:"steps"`
}

// resumed is the transcript a turn resumes from: the context of the newest
// call it asked about. Each request's context holds the one before it and
// more, so the newest is the longest. A turn that asked nothing, or whose
// requests carry no transcript (another back-end's), starts afresh.
func resumed(approvals []journal.Approval) (transcript, map[string]journal.Approval) {
	var (
		tr      transcript
		longest int
	)
	decided := make(map[string]journal.Approval, len(approvals))
	for _, a := range approvals {
		decided[a.CallID] = a
		var t transcript
		if len(a.Context) > longest && json.Unmarshal(a.Context, &t) == nil && len(t.Steps) > 0 {
			tr, longest = t, len(a.Context)
		}
	}
	return tr, decided
}

// messages is the transcript as the chat's messages: each step the
// assistant's calls, then each settled call's result.
func (t transcript) messages() []openai.ChatCompletionMessageParamUnion {
	var out []openai.ChatCompletionMessageParamUnion
	for _, s := range t.Steps {
		m := openai.ChatCompletionAssistantMessageParam{}
		if s.Content != "" {
			m.Content.OfString = openai.String(s.Content)
		}
		for _, c := range s.Calls {
			m.ToolCalls = append(m.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
				OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{ID: c.ID,
					Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Name, Arguments: c.Arguments}}})
		}
		out = append(out, openai.ChatCompletionMessageParamUnion{OfAssistant: &m})
		for _, c := range s.Calls {
			if c.Result != nil {
				out = append(out, openai.ToolMessage(*c.Result, c.ID))
			}
		}
	}
	return out
}

// toolParams declares tools to the model.
func toolParams(tools []Tool) []openai.ChatCompletionToolUnionParam {
	out := make([]openai.ChatCompletionToolUnionParam, 0, len(tools))
	for _, t := range tools {
		f := shared.FunctionDefinitionParam{Name: t.Name, Parameters: t.Parameters}
		if f.Parameters == nil {
			f.Parameters = shared.FunctionParameters{"type": "object", "properties": map[string]any{}}
		}
		if t.Description != "" {
			f.Description = openai.String(t.Description)
		}
		out = append(out, openai.ChatCompletionFunctionTool(f))
	}
	return out
}

// approvalCallID names the call at index i of step of the turn of eventID:
// the same call whenever the turn is resumed, and a name no other turn's
// call has (the model's own IDs need not be unique, a local server's
// least of all).
func approvalCallID(eventID string, step, i int) string {
	sum := sha256.Sum256([]byte(eventID))
	return fmt.Sprintf("tool-%s-%d-%d", hex.EncodeToString(sum[:12]), step, i)
}

// settleCalls settles the calls of the transcript's last step that have no
// result yet, in order: a tool without approval runs; one with it runs
// once approved, or its decision is the result. A call nobody was asked
// about yet is returned as the approval to ask, with the transcript so far
// as its context, and the calls after it wait for the turn to resume.
func (o *OpenAI) settleCalls(ctx context.Context, turn Turn, tr *transcript, decided map[string]journal.Approval) (*ApprovalAsk, error) {
	if len(tr.Steps) == 0 {
		return nil, nil
	}
	step := len(tr.Steps) - 1
	calls := tr.Steps[step].Calls
	for i := range calls {
		c := &calls[i]
		if c.Result != nil {
			continue
		}
		tool, ok := o.tool(c.Name)
		args := strings.TrimSpace(c.Arguments)
		if args == "" {
			args = "{}"
		}
		var result string
		switch _, err := journal.CallHash(c.Name, json.RawMessage(args)); {
		case !ok:
			result = fmt.Sprintf("error: there is no tool named %q", c.Name)
		case err != nil:
			result = "error: the arguments are not one JSON object; the call did not run"
		case !tool.Approval:
			result = o.runTool(ctx, turn, tool, args)
		default:
			id := approvalCallID(turn.Event.EventID, step, i)
			a, asked := decided[id]
			if !asked {
				context, err := json.Marshal(tr)
				if err != nil {
					return nil, err
				}
				return &ApprovalAsk{CallID: id, Tool: c.Name, Arguments: json.RawMessage(args), Approvers: tool.Approvers,
					ExpiresIn: tool.ExpiresIn, Secret: tool.Secret, Rendering: clip(tr.Steps[step].Content, journal.MaxRenderingBytes),
					Context: context}, nil
			}
			if result, err = o.decidedCall(ctx, turn, tool, a); err != nil {
				return nil, err
			}
		}
		c.Result = &result
	}
	return nil, nil
}

// decidedCall is the result of a call a person decided: the tool's run
// when approved, the decision otherwise. The run is claimed before it
// starts, so a turn resumed after a crash never runs it again: a run found
// claimed but unfinished is told to the model as unknown.
func (o *OpenAI) decidedCall(ctx context.Context, turn Turn, tool Tool, a journal.Approval) (string, error) {
	switch a.State {
	case journal.ApprovalDenied:
		return fmt.Sprintf("The call was denied by %s; it did not run.", a.DecidedBy), nil
	case journal.ApprovalExpired:
		return "Nobody decided on the call in time; it did not run.", nil
	case journal.ApprovalWithdrawn:
		return fmt.Sprintf("The call was withdrawn (%s); it did not run.", a.Reason), nil
	case journal.ApprovalApproved:
	default:
		return "", fmt.Errorf("call %s is %s", a.CallID, a.State)
	}
	if turn.ToolRuns == nil {
		return "", errors.New("no record of tool runs: an approved call cannot run at most once")
	}
	run, started, err := turn.ToolRuns.StartToolRun(ctx, a.CallID)
	switch {
	case err != nil:
		return "", fmt.Errorf("start tool run: %w", err)
	case !started && run.Run == journal.ToolRunFinished:
		return run.RunResult, nil
	case !started:
		o.log.Warn().Str("event_id", turn.Event.EventID).Str("call_id", a.CallID).Str("tool", tool.Name).
			Msg("An approved call was started before a stop and never finished; it is not run again")
		return "The daemon stopped while this call ran; whether it finished is not known, and it was not run again.", nil
	}
	result := o.runTool(ctx, turn, tool, string(a.Arguments))
	if ctx.Err() != nil {
		// Stopped, not finished: the claim stays, and the turn resumed
		// later tells the model the outcome is unknown.
		return "", ctx.Err()
	}
	if _, err := turn.ToolRuns.FinishToolRun(ctx, a.CallID, result); err != nil {
		return "", fmt.Errorf("finish tool run: %w", err)
	}
	return result, nil
}

// runTool runs tool with args and returns what the model is told: its
// stdout, or why it failed.
func (o *OpenAI) runTool(ctx context.Context, turn Turn, tool Tool, args string) string {
	timeout := tool.Timeout
	if timeout <= 0 {
		timeout = DefaultToolTimeout
	}
	out, err := runCommand(ctx, tool.Command, tool.Env, timeout, []byte(args), MaxToolOutput)
	o.log.Info().Str("event_id", turn.Event.EventID).Str("tool", tool.Name).Dur("took", out.took).AnErr("error", err).
		Msg("Tool ran")
	if err != nil {
		return "error: the tool failed: " + err.Error()
	}
	result := strings.ToValidUTF8(out.stdout.buf.String(), "\uFFFD")
	if out.stdout.over {
		result += fmt.Sprintf("\n[output cut at %d bytes]", MaxToolOutput)
	}
	return result
}

// tool finds a configured tool by name.
func (o *OpenAI) tool(name string) (Tool, bool) {
	for _, t := range o.tools {
		if t.Name == name {
			return t, true
		}
	}
	return Tool{}, false
}
