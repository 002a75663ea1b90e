package journal

import (
	"fmt"
	"slices"
)

// MaxPageLimit bounds the rows one page may ask for.
const MaxPageLimit = 10000

// ValidateRead checks a read request and returns its thread's storage key
// ("" for the room).
func ValidateRead(req ReadRequest) (thread string, err error) {
	if req.Limit <= 0 || req.Limit > MaxPageLimit {
		return "", fmt.Errorf("%w: limit %d must be in 1..%d", ErrInvalidArgument, req.Limit, MaxPageLimit)
	}
	if !ValidRoomID(req.RoomID) {
		return "", fmt.Errorf("%w: %q is not a room ID", ErrInvalidArgument, req.RoomID)
	}
	if req.Before != nil && !ValidEventID(req.Before.EventID) {
		return "", fmt.Errorf("%w: cursor event %q is not an event ID", ErrInvalidArgument, req.Before.EventID)
	}
	return EncodeThread(req.Thread)
}

// PageBuilder decides one conversation page from the rows a store reads
// for it, newest first: which rows the page shows, which it lists as owing
// a refetch, and where the next page starts. A store reads up to Limit+1
// rows, so the builder can tell a full page from the last one.
//
// Rows owing a refetch count against the limit, so a page is bounded by
// the rows it reads; the budget bounds the content it holds. A thread's
// root closes the thread's last page: a store offers it after the replies,
// and only when every reply was taken.
type PageBuilder struct {
	limit    int
	budget   PageBudget
	newest   []Message // newest first
	owed     []string
	read     int
	lastRead Cursor // the oldest row read: where a next page starts
	full     bool
}

// NewPageBuilder starts a page of at most limit rows, spending budget.
func NewPageBuilder(limit int, budget PageBudget) *PageBuilder {
	return &PageBuilder{limit: limit, budget: budget, newest: make([]Message, 0, min(limit, 512))}
}

// Add offers the next older row; visible is false for a row without a
// body, which owes a refetch. It reports false once the page is full: that
// row and every older one belong to the next page.
func (b *PageBuilder) Add(m Message, visible bool) bool {
	if b.full || b.read == b.limit || (visible && !b.budget.Admit(m.Content, len(b.newest) == 0)) {
		b.full = true
		return false
	}
	b.read++
	b.lastRead = Cursor{CreatedTS: m.CreatedTS, EventID: m.EventID}
	if visible {
		b.newest = append(b.newest, m)
	} else {
		b.owed = append(b.owed, m.EventID)
	}
	return true
}

// Full reports whether a row was refused: the page has a next one.
func (b *PageBuilder) Full() bool { return b.full }

// Page returns the page, oldest message first. It ends the builder.
func (b *PageBuilder) Page() Page {
	p := Page{OwedRefetch: b.owed}
	if b.full {
		next := b.lastRead
		p.NextCursor = &next
	}
	slices.Reverse(b.newest)
	p.Messages = b.newest
	return p
}

// LatestVisibleID is the ID a conversation's newest message answers to:
// the revision on screen (logical when the original is), or the logical ID
// when that revision's body was redacted, which only a bodyless row whose
// revision is not the original can be. redacted reports whether the
// revision was, and is asked only then.
func LatestVisibleID(logical, revision string, bodyless bool, redacted func() (bool, error)) (string, error) {
	if !bodyless || revision == logical {
		return revision, nil
	}
	gone, err := redacted()
	if err != nil {
		return "", err
	}
	if gone {
		return logical, nil
	}
	return revision, nil
}
