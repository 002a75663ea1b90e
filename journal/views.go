package journal

import (
	"context"
	"encoding/json"
	"strconv"
)

// Outcome is what admission did with one event.
type Outcome uint8

// Outcomes.
const (
	// Admitted: the event is new and was journaled (and projected).
	Admitted Outcome = 1
	// Duplicate: the principal had already admitted this event ID; nothing
	// changed, even if this copy's payload disagrees.
	Duplicate Outcome = 2
	// Rejected: the event is malformed; it was recorded for inspection and
	// skipped. Err says why.
	Rejected Outcome = 3
)

// String implements fmt.Stringer.
func (o Outcome) String() string {
	switch o {
	case Admitted:
		return "admitted"
	case Duplicate:
		return "duplicate"
	case Rejected:
		return "rejected"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// AdmitResult reports admission of one event of a batch, in batch order.
type AdmitResult struct {
	// EventID is the event's ID, or "" when it could not be read.
	EventID string
	Outcome Outcome
	// Class is set for admitted events.
	Class Class
	// Awaiting is set for an encrypted event admitted to wait for its key.
	Awaiting bool
	// Err explains a rejection (an *EventError).
	Err error
}

// PendingEvent is an actionable event still owed its turn.
type PendingEvent struct {
	// Seq is the durable receipt position; pages resume after it.
	Seq     int64
	EventID string
	RoomID  string
	Kind    Kind
	// Epoch is the room membership epoch the event was admitted under.
	Epoch int64
	// Event is the canonical JSON of the whole event.
	Event json.RawMessage
}

// UnreadableEvent is a pending row whose stored payload cannot be decoded.
// It is reported so an operator can see it, and skipped so it never ends the
// backlog.
type UnreadableEvent struct {
	Seq     int64
	EventID string
	Err     error
}

// PendingPage is one bounded page of a principal's pending work in receipt
// order.
type PendingPage struct {
	Events     []PendingEvent
	Unreadable []UnreadableEvent
	// Next is the position to resume after; it advances past every row the
	// page read, readable or not.
	Next int64
	// More is true when the page filled its limit, so more rows may follow.
	// A short page means the end of the backlog.
	More bool
}

// Cursor is a stable position in a conversation: the page continues with
// messages strictly older than (CreatedTS, EventID), event IDs compared in
// byte order.
type Cursor struct {
	CreatedTS int64
	EventID   string
}

// Message is one logical message as a person sees it: its latest visible
// revision.
type Message struct {
	// EventID is the logical (original) event ID.
	EventID string
	RoomID  string
	// Thread is the thread root, nil for a room-level message.
	Thread    *string
	Sender    string
	CreatedTS int64
	// RevisionID and RevisionTS identify the revision on screen.
	RevisionID string
	RevisionTS int64
	// Content is the visible content (canonical JSON).
	Content json.RawMessage
}

// ReadRequest asks for one page of a conversation.
type ReadRequest struct {
	RoomID string
	// Thread selects a thread by its root; nil reads the room.
	Thread *string
	// Limit is the most messages the page may hold; it must be positive.
	Limit int
	// Before continues an earlier page; nil starts at the newest message.
	Before *Cursor
	// Strict asks the read to wait for owed refetches and fail closed rather
	// than omit messages.
	Strict bool
}

// Page is one bounded page of a conversation, oldest message first.
type Page struct {
	Messages []Message
	// NextCursor continues with older messages; nil when none may exist.
	NextCursor *Cursor
	// OwedRefetch lists logical event IDs omitted because their visible
	// revision must be fetched again from the server.
	OwedRefetch []string
	// PrunedBefore, set on a page that reached the oldest message kept,
	// says retention removed the conversation's messages sent up to this
	// time (unix milliseconds): there is more before, no longer held.
	PrunedBefore int64
}

// Admission admits sync batches for one principal.
type Admission interface {
	// AdmitBatch journals, deduplicates and projects every event and stores
	// nextBatch as the principal's sync token, all in one transaction. It
	// returns one result per event in batch order. An error means nothing of
	// the batch was committed.
	AdmitBatch(ctx context.Context, events []Inbound, nextBatch string) ([]AdmitResult, error)
	// SyncToken returns the stored sync token ("" before the first batch).
	SyncToken(ctx context.Context) (string, error)
}

// Replay offers a principal's pending work and settles it.
type Replay interface {
	// Pending returns up to limit pending rows after position after, in
	// durable receipt order.
	Pending(ctx context.Context, limit int, after int64) (PendingPage, error)
	// Settle marks the principal's pending events settled and drops their
	// payloads in the same statement. It returns how many changed.
	Settle(ctx context.Context, eventIDs ...string) (int, error)
}

// ConversationReader reads bounded pages of the visible projection.
type ConversationReader interface {
	Read(ctx context.Context, req ReadRequest) (Page, error)
}

// AdmittedEvent is what the journal knows of an event a principal admitted.
type AdmittedEvent struct {
	RoomID string
	// Thread is the event's thread, nil for the room.
	Thread *string
	// Pending is true while the event is owed its turn.
	Pending bool
}

// RelationLookup answers the small relation questions a turn asks.
type RelationLookup interface {
	// AdmittedEvent finds an admitted event by its ID alone (event IDs are
	// global), without reading its payload.
	AdmittedEvent(ctx context.Context, eventID string) (AdmittedEvent, bool, error)
	// AdmittedThreadID reports whether the principal admitted eventID in room
	// and, if so, its thread (nil for the room).
	AdmittedThreadID(ctx context.Context, roomID, eventID string) (thread *string, seen bool, err error)
	// LatestVisibleEventID returns the event ID of the revision on screen of
	// the newest visible message of a conversation (the logical ID when that
	// revision's body was redacted). A thread's root does not count.
	LatestVisibleEventID(ctx context.Context, roomID string, thread *string) (eventID string, ok bool, err error)
}

// HistoryResult counts what installing one chunk of history did.
type HistoryResult struct {
	// Admitted events were new to the journal; Known ones it held already
	// (re-projected all the same); Rejected ones were malformed, recorded
	// and skipped.
	Admitted, Known, Rejected int
}

// Hydration installs what hydration fetches from the server, and the point
// refetch. Every install is checked against the membership epoch the fetch
// began under.
type Hydration interface {
	// InstallHistory journals and projects one chunk of a room's history,
	// fetched under epoch, in one transaction: never work, and re-projected
	// when already journaled. It fails with ErrMembershipEnded once that
	// membership is over.
	InstallHistory(ctx context.Context, roomID string, epoch int64, events []Inbound) (HistoryResult, error)
	// MarkCovered publishes that a conversation (thread nil for the room)
	// was hydrated under epoch.
	MarkCovered(ctx context.Context, roomID string, thread *string, epoch int64) error
	// Covered reports whether a conversation was hydrated under the room's
	// current membership.
	Covered(ctx context.Context, roomID string, thread *string) (bool, error)
	// RefreshDebt reads the debt of a logical message owing a refetch; ok
	// is false when it owes none.
	RefreshDebt(ctx context.Context, roomID, eventID string) (debt RefreshDebt, ok bool, err error)
	// ApplyRefetch installs the server's copy of a message owing a refetch
	// (see the package function of that name).
	ApplyRefetch(ctx context.Context, r Refetched) (RefetchOutcome, error)
}

// PrincipalStore is the whole principal-bound view. Runtime collaborators
// should take the narrowest interface they call instead.
type PrincipalStore interface {
	Admission
	Replay
	ConversationReader
	RelationLookup
	Outbox
	TurnRecords
	Membership
	Hydration
	Keys
	Approvals
	Retention
	// Principal names the principal this view is bound to.
	Principal() Principal
}

// Backlog is what one principal still owes, as the metrics report it.
type Backlog struct {
	Agent, UserID string
	Pending       int64 // actionable events not yet settled
	Queued        int64 // replies enqueued, never attempted
	Attempted     int64 // replies sent or being sent, not yet acknowledged
	AwaitingKeys  int64 // encrypted events waiting for their keys
}

// PrincipalStatus summarises one principal's rows.
type PrincipalStatus struct {
	Agent, UserID string
	Events        int64 // journal rows
	Pending       int64 // actionable events not yet settled
	Visible       int64 // visible messages
	// The outbox's rows by state (DeliveryState): never attempted,
	// attempted and not yet acknowledged, acknowledged, permanently
	// refused, and retired unsent.
	Queued, Attempted, Acknowledged, Failed, Retired int64
	// OwedDepartures counts the local leaves whose sync-reported echo is
	// still owed.
	OwedDepartures int64
	// AwaitingKeys counts the encrypted events waiting for their keys;
	// Undecryptable those settled when their keys never came.
	AwaitingKeys, Undecryptable int64
	// HasSyncToken reports whether a sync has completed and stored its
	// token.
	HasSyncToken bool
	// SyncTokenMS is when the sync token was stored, in unix milliseconds:
	// the time of the last completed sync. 0 when not known: no token, or
	// one stored by a mindroomd that did not keep the time.
	SyncTokenMS int64
}

// Store is a journal database shared by several principals.
type Store interface {
	// Principal returns the view bound to one principal, registering it on
	// first use.
	Principal(ctx context.Context, agent, userID string) (PrincipalStore, error)
	// Generation identifies this database: minted once, then kept.
	Generation(ctx context.Context) (string, error)
	// Close stops the store, committing everything already accepted.
	Close() error
}
