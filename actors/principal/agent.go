package principal

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
}

// Reply is the agent's answer to a turn.
type Reply struct {
	// Ignore settles the event without answering it.
	Ignore bool
	// Content is the answer's event content (m.room.message), without any
	// relation: the reply relation to the event, or its thread, is added.
	Content json.RawMessage
}
