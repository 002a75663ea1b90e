package hydrator

import (
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// Hydrate asks for a conversation's history to be fetched from the server
// if no walk under the current membership covers it yet. Readers asking
// while a walk of the same conversation runs share it and its answer.
type Hydrate struct {
	RoomID string
	// Thread is the thread's root; nil hydrates the room.
	Thread *string
	// Reply receives the answer; it must have room for one.
	Reply chan<- *Hydrated
}

// Hydrated answers Hydrate once the shared walk has finished.
type Hydrated struct {
	Walk Walk
	Err  error
}

// Refetch asks for one message owing a refetch to be read again from the
// server. Readers asking for the same message while its refetch runs share
// it.
type Refetch struct {
	RoomID string
	// EventID is the logical (original) event.
	EventID string
	// Reply receives the answer; it must have room for one.
	Reply chan<- *Refetched
}

// Refetched answers Refetch.
type Refetched struct {
	Outcome journal.RefetchOutcome
	Walk    Walk
	Err     error
}

// walkFinished tells the actor a conversation's walk is over.
type walkFinished struct {
	key  conversation
	walk Walk
	err  error
}

// refetchFinished tells the actor a message's refetch is over.
type refetchFinished struct {
	key     message
	outcome journal.RefetchOutcome
	walk    Walk
	err     error
}

// Walk is what one walk or refetch did, for its log line and metrics.
type Walk struct {
	// Kind is thread, room or refetch.
	Kind   string
	RoomID string
	// Thread is the thread's root, "" for a room or a refetch.
	Thread string
	// Requests counts the homeserver requests made; Events the events they
	// returned; Installed the events installed, in Chunks transactions;
	// Messages the logical messages among them.
	Requests, Events, Installed, Chunks, Messages int
	// Covered is set when the walk already had a coverage marker and
	// fetched nothing.
	Covered bool
	// Complete is set when the walk reached the beginning of the
	// conversation rather than its window or ceiling.
	Complete bool
	Took     time.Duration
}
