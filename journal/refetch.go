package journal

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrRefetchRefused reports a point refetch that found nothing it may put on
// screen: the revision the server's copy reduces to was redacted here, or is
// still only a sidecar preview. The refresh debt stays; a later strict read
// tries again.
var ErrRefetchRefused = errors.New("refetch refused")

// RefetchOutcome is what a point refetch did with the server's answer.
type RefetchOutcome uint8

// Refetch outcomes.
const (
	// RefetchInstalled: the server's current revision is on screen and the
	// debt is paid.
	RefetchInstalled RefetchOutcome = 1
	// RefetchSuperseded: while the server was asked, the membership ended or
	// the row's debt changed (a newer edit or redaction arrived); the newer
	// state wins and nothing was installed.
	RefetchSuperseded RefetchOutcome = 2
	// RefetchGone: the server holds the original redacted; its row went.
	RefetchGone RefetchOutcome = 3
)

// String implements fmt.Stringer.
func (o RefetchOutcome) String() string {
	switch o {
	case RefetchInstalled:
		return "installed"
	case RefetchSuperseded:
		return "superseded"
	case RefetchGone:
		return "gone"
	}
	return "refetch(" + strconv.Itoa(int(o)) + ")"
}

// RefreshDebt is a visible row owing a refetch, as read before the server is
// asked: the install goes ahead only while both still hold.
type RefreshDebt struct {
	RoomID string
	// EventID is the logical (original) event.
	EventID string
	// Epoch is the membership epoch current when the debt was read.
	Epoch int64
	// Token is the row's exact refresh token.
	Token int64
}

// Owed reports whether the debt is one to pay: the row owes a refetch, and
// the principal is in the room, since nothing is fetched for a membership
// that ended.
func (d RefreshDebt) Owed(departed bool) bool { return d.Token != 0 && !departed }

// Refetched is the server's copy of one logical message.
type Refetched struct {
	Debt     RefreshDebt
	Original *Event
	// Edits are the events the server relates to the original as
	// replacements, in any order; the rules choose among them.
	Edits []*Event
}

// RefetchStore is what installing a refetch reads and writes, for one
// principal, inside its transaction. A backend implements it in its own
// SQL; the decisions are ApplyRefetch's.
type RefetchStore interface {
	// Membership returns the room's epoch and whether the principal is out
	// of it.
	Membership(room string) (epoch int64, departed bool, err error)
	// Debt returns the visible row of the logical message eventID and its
	// refresh token (0 when it owes nothing).
	Debt(room, eventID string) (row VisibleRow, token int64, ok bool, err error)
	// Tombstoned reports whether eventID was redacted in room.
	Tombstoned(room, eventID string) (bool, error)
	// Tombstone records that eventID was redacted in room.
	Tombstone(room, eventID string) error
	// JournalEdit journals the edit a refetch puts on screen, as history,
	// unless the journal holds it already.
	JournalEdit(edit *Event) error
	// InstallRevision puts rev, showing body, on the row and clears its
	// debt.
	InstallRevision(row VisibleRow, rev Revision, body []byte) error
	// DropVisible deletes the row.
	DropVisible(row VisibleRow) error
}

// ChooseRevision reduces the server's copy of a message to the revision a
// person sees, by the projection's own rules: the newest, as (TS, event ID),
// of the original and its author's edits. A redacted edit, an edit of
// another message and the agent's own in-progress stream edits are no
// candidates. It returns the chosen event (the original or an edit), its
// revision, what it shows, and whether that is only a sidecar preview.
func ChooseRevision(original *Event, edits []*Event, self string) (chosen *Event, rev Revision, body []byte, preview bool) {
	chosen, rev = original, Revision{TS: original.TS, EventID: original.ID}
	body, preview = original.Content, original.Preview
	for _, e := range edits {
		if e.Kind != KindEdit || e.Redacted || e.Target != original.ID || e.Sender != original.Sender ||
			IsTransportProgress(e, self) {
			continue
		}
		if r := (Revision{TS: e.TS, EventID: e.ID}); r.After(rev) {
			chosen, rev, body, preview = e, r, e.NewContent, e.Preview
		}
	}
	return chosen, rev, body, preview
}

// ApplyRefetch installs the server's copy of a message owing a refetch, for
// the principal whose Matrix user ID is self. It installs only while the
// membership epoch and the exact refresh token read before the fetch still
// hold; otherwise something newer won and it installs nothing. It refuses
// (ErrRefetchRefused, the debt kept) a chosen revision that was redacted
// here or is still a sidecar preview.
func ApplyRefetch(s RefetchStore, r Refetched, self string) (RefetchOutcome, error) {
	room, id := r.Debt.RoomID, r.Debt.EventID
	if r.Original == nil || r.Original.ID != id || r.Original.RoomID != room {
		return 0, fmt.Errorf("%w: the refetched copy is not %s", ErrInvalidArgument, id)
	}
	epoch, departed, err := s.Membership(room)
	if err != nil {
		return 0, fmt.Errorf("membership: %w", err)
	}
	if departed || epoch != r.Debt.Epoch {
		return RefetchSuperseded, nil
	}
	row, token, ok, err := s.Debt(room, id)
	if err != nil {
		return 0, fmt.Errorf("debt: %w", err)
	}
	if !ok || token == 0 || token != r.Debt.Token {
		return RefetchSuperseded, nil
	}
	if r.Original.Redacted {
		if err := s.Tombstone(room, id); err != nil {
			return 0, fmt.Errorf("tombstone: %w", err)
		}
		if err := s.DropVisible(row); err != nil {
			return 0, fmt.Errorf("drop visible: %w", err)
		}
		return RefetchGone, nil
	}
	chosen, rev, body, preview := ChooseRevision(r.Original, r.Edits, self)
	dead, err := s.Tombstoned(room, rev.EventID)
	if err != nil {
		return 0, fmt.Errorf("tombstone: %w", err)
	}
	switch {
	case dead:
		return 0, fmt.Errorf("%w: revision %s of %s was redacted", ErrRefetchRefused, rev.EventID, id)
	case preview:
		return 0, fmt.Errorf("%w: revision %s of %s is a sidecar preview", ErrRefetchRefused, rev.EventID, id)
	}
	if chosen != r.Original {
		// The edit now on screen must be known as an edit of this message,
		// so that its redaction, arriving later, finds the row it shows on.
		if err := s.JournalEdit(chosen); err != nil {
			return 0, fmt.Errorf("journal edit: %w", err)
		}
	}
	if err := s.InstallRevision(row, rev, body); err != nil {
		return 0, fmt.Errorf("install revision: %w", err)
	}
	return RefetchInstalled, nil
}
