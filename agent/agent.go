// Package agent is what answers a principal's work: the contract between
// a principal and whatever answers for it (Agent, Turn, Reply), and the
// built-in back-ends (Echo, Exec, OpenAI). It knows the journal's types
// alone: the daemon's configuration is turned into a back-end's options by
// the daemon.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// Agent answers the work a principal is offered. The journal hands it each
// actionable event once per attempt, in receipt order; an error leaves the
// event pending, to be offered again after a backoff.
type Agent interface {
	Answer(ctx context.Context, turn Turn) (Reply, error)
}

// AgentFunc adapts a function to Agent.
type AgentFunc func(ctx context.Context, turn Turn) (Reply, error)

// Answer implements Agent.
func (f AgentFunc) Answer(ctx context.Context, turn Turn) (Reply, error) { return f(ctx, turn) }

// Turn is one actionable event offered to the agent.
type Turn struct {
	// Event is the pending event, with its canonical JSON.
	Event journal.PendingEvent
	// Thread is the thread the event belongs to, nil for the room.
	Thread *string
	// Conversation reads the conversation as a person sees it.
	Conversation journal.ConversationReader
	// Progress, set when the principal sends a placeholder before asking,
	// shows the answer written so far in that placeholder, as an edit
	// marked in progress. It is best-effort (a failed edit is logged and
	// dropped) and leaves no trace in the journal: only the Reply is
	// delivered, through the outbox, and replaces whatever progress showed.
	// A call only hands over the newest text and returns at once: the
	// principal sends it when the homeserver's rate limit allows, one edit
	// at a time, and texts that arrive meanwhile are coalesced to the
	// newest. So an agent may call it as often as it likes (calls may
	// overlap), though an edit a second is all a reader can follow. Calls
	// made after Answer returned are dropped.
	Progress func(ctx context.Context, text string)
	// Approvals are the decisions of the calls the agent asked a person
	// about for this event (Reply.Approval), oldest first: the turn is
	// offered again once every one of them is decided. Nil when it asked
	// none. A call runs only when its State is journal.ApprovalApproved;
	// denied, expired and withdrawn are final.
	Approvals []journal.Approval
	// ToolRuns records the runs of approved calls a back-end runs itself
	// (OpenAI's tools), so each runs at most once.
	ToolRuns journal.ToolRuns
}

// ErrInvalidReply reports a Reply that is not exactly one answer.
var ErrInvalidReply = errors.New("invalid reply")

// Reply is the agent's answer to a turn: exactly one of Ignore, React,
// Content, Attachment and Approval.
type Reply struct {
	// Ignore settles the event without answering it.
	Ignore bool
	// React answers the event with a reaction of this key (an emoji)
	// instead of a message (journal.ValidReactionKey).
	React string
	// Content is the answer's event content (m.room.message), without any
	// relation: the reply relation to the event, or its thread, is added.
	Content json.RawMessage
	// Attachment answers with a file: the principal uploads it and sends
	// it as a message, with its caption if it has one.
	Attachment *File
	// Approval asks a person before an exact call runs: the principal
	// records the request, posts its card in the room and leaves the event
	// pending; once the call is decided the turn is offered again, with
	// the decision in Turn.Approvals.
	Approval *ApprovalAsk
}

// ApprovalAsk is a call an agent asks a person to approve
// (journal.ApprovalRequest, less what the principal fills in).
type ApprovalAsk struct {
	// CallID names the call, chosen by the agent; asking the same ID again
	// with the same call is the same request.
	CallID string
	// Tool and Arguments (a JSON object) are the exact call.
	Tool      string
	Arguments json.RawMessage
	// Approvers may decide (Matrix user IDs); empty means the event's
	// sender.
	Approvers []string
	// ExpiresIn is how long the call waits for a decision before it is
	// decided as expired; zero means the principal's default (an hour).
	ExpiresIn time.Duration
	// Secret names arguments the card never shows.
	Secret []string
	// Rendering, optional, is the agent's own words for the call, shown on
	// the card above it.
	Rendering string
	// Context, optional, is the agent's state as it asks (one JSON value),
	// handed back with the decision in Turn.Approvals.
	Context json.RawMessage
}

// File is a local file an agent answers with.
type File struct {
	// Path is the file's path, absolute or relative to the daemon's
	// working directory. The daemon reads it as itself: an agent may send
	// any file the daemon can read.
	Path string
	// Name is the file's name as the room shows it; "" is Path's base
	// name.
	Name string
	// MimeType is the file's media type; "" has it sniffed from the
	// content (http.DetectContentType).
	MimeType string
	// Caption, when set, is the message's text, shown with the file.
	Caption string
}

// Validate reports a reply that is not exactly one answer, or whose
// reaction key or file is not one the principal can send, as
// ErrInvalidReply.
func (r Reply) Validate() error {
	n := 0
	for _, set := range []bool{r.Ignore, r.React != "", r.Content != nil, r.Attachment != nil, r.Approval != nil} {
		if set {
			n++
		}
	}
	switch {
	case n == 0:
		return fmt.Errorf("%w: no answer (ignore, a reaction, content, an attachment or an approval)", ErrInvalidReply)
	case n > 1:
		return fmt.Errorf("%w: more than one of ignore, a reaction, content, an attachment and an approval", ErrInvalidReply)
	case r.React != "" && !journal.ValidReactionKey(r.React):
		return fmt.Errorf("%w: a reaction key must be 1 to %d bytes of text without control characters or surrounding spaces",
			ErrInvalidReply, journal.MaxReactionKeyBytes)
	case r.Attachment != nil && r.Attachment.Path == "":
		return fmt.Errorf("%w: an attachment without a path", ErrInvalidReply)
	case r.Approval != nil && (r.Approval.CallID == "" || r.Approval.Tool == "" || r.Approval.Arguments == nil):
		return fmt.Errorf("%w: an approval needs a call ID, a tool and its arguments", ErrInvalidReply)
	case r.Approval != nil && r.Approval.ExpiresIn < 0:
		return fmt.Errorf("%w: an approval's expiry is not ahead", ErrInvalidReply)
	}
	return nil
}
