// Package agent is what answers a principal's work: the contract between
// a principal and whatever answers for it (Agent, Turn, Reply), and the
// built-in back-ends (Echo, Exec, OpenAI). It knows the journal's types
// alone: the daemon's configuration is turned into a back-end's options by
// the daemon.
package agent

import (
	"context"
	"encoding/json"

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
	// Each call is one request to the homeserver and the agent waits for
	// it, so an agent calls it at most about once a second. Calls must not
	// overlap, and none may come after Answer returned.
	Progress func(ctx context.Context, text string)
}

// Reply is the agent's answer to a turn.
type Reply struct {
	// Ignore settles the event without answering it.
	Ignore bool
	// Content is the answer's event content (m.room.message), without any
	// relation: the reply relation to the event, or its thread, is added.
	Content json.RawMessage
}
