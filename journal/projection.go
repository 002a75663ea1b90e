package journal

import "fmt"

// VisibleRow is the visible-projection row of one logical message, as the
// projection rules read it.
type VisibleRow struct {
	// Key is the backend's key of the row.
	Key    int64
	Sender string
	// Revision is the revision on screen: the original's own (TS, ID), or
	// the edit that replaced it.
	Revision Revision
}

// HeldEdit is the newest edit of one sender waiting for its target.
type HeldEdit struct {
	Revision Revision
	// Body is the edit's new content; nil once the edit was redacted, when
	// it keeps only its place in the ordering.
	Body []byte
}

// ProjectionStore is what the projection rules read and write, for one
// principal, inside the transaction that admits the event being projected.
// A backend implements it in its own SQL; the decisions are Project's.
//
// Writes that leave a row owing a refetch take owesRefetch: the backend
// records its refresh debt, keyed by the event being projected.
type ProjectionStore interface {
	// ProbeOriginal reports at once whether eventID was redacted in room
	// and whether edits are held for it: both are rare, so a backend may
	// answer in one statement.
	ProbeOriginal(room, eventID string) (tombstoned, held bool, err error)
	// Tombstoned reports whether eventID was redacted in room.
	Tombstoned(room, eventID string) (bool, error)
	// Tombstone records that eventID was redacted in room by the event
	// being projected.
	Tombstone(room, eventID string) error
	// Journaled reports whether the principal admitted eventID in room.
	Journaled(room, eventID string) (bool, error)
	// EditTarget returns the target of eventID when it is an admitted edit
	// in room.
	EditTarget(room, eventID string) (target string, ok bool, err error)
	// Visible returns the visible row of the logical message eventID.
	Visible(room, eventID string) (VisibleRow, bool, error)
	// AddVisible adds the row of the original ev at revision rev, showing
	// body.
	AddVisible(ev *Event, rev Revision, body []byte, owesRefetch bool) error
	// ReviseVisible puts revision rev, showing body, on the row.
	ReviseVisible(row VisibleRow, rev Revision, body []byte, owesRefetch bool) error
	// DropVisible deletes the row.
	DropVisible(row VisibleRow) error
	// ClearVisible takes the body off the row and records a refresh debt,
	// if revisionID is still the revision on screen.
	ClearVisible(row VisibleRow, revisionID string) error
	// HeldEdit returns sender's edit held for target.
	HeldEdit(room, target, sender string) (HeldEdit, bool, error)
	// HoldEdit holds h as sender's edit of target, replacing any held one.
	HoldEdit(room, target, sender string, h HeldEdit) error
	// TakeHeldEdits deletes every edit held for target and returns them by
	// sender.
	TakeHeldEdits(room, target string) (map[string]HeldEdit, error)
	// DropHeldEdits deletes every edit held for target.
	DropHeldEdits(room, target string) error
	// ClearHeldEdit takes the body off the held edit editID.
	ClearHeldEdit(room, editID string) error
	// Settle settles eventID in room if it is still pending.
	Settle(room, eventID string) error
}

// screenBody decides what a revision puts on screen: its content, or no
// body and a refresh debt when there is none (redacted) or it is only a
// sidecar preview, which looks complete and is not.
func screenBody(content []byte, preview bool) (body []byte, owesRefetch bool) {
	if content == nil || preview {
		return nil, true
	}
	return content, false
}

// Project applies one newly admitted event to the visible projection of
// the principal whose Matrix user ID is self. departed says the principal
// is out of the event's room: what sync delivers from before a leave is
// never projected into the next membership. Live admission projects only
// events it newly admitted; history re-projects duplicates (Reproject).
func Project(s ProjectionStore, ev *Event, self string, departed bool) error {
	if !departed {
		var err error
		if ev.Redacted {
			err = projectRedactedCopy(s, ev)
		}
		switch {
		case err != nil:
		case ev.Kind == KindMessage, ev.Kind == KindMedia:
			err = projectOriginal(s, ev)
		case ev.Kind == KindEdit:
			err = projectEdit(s, ev, self)
		case ev.Kind == KindRedaction:
			err = projectRedaction(s, ev)
		case ev.Kind == KindReaction:
			err = settleIfRedacted(s, ev)
		}
		if err != nil {
			return fmt.Errorf("project %s %s: %w", ev.Kind, ev.ID, err)
		}
	}
	// An original that projects resolves the edits held for it; any other
	// arrival of their target means they will never apply, and a held edit
	// never outlives its target's arrival.
	if departed || !ev.Kind.Original() {
		if err := s.DropHeldEdits(ev.RoomID, ev.ID); err != nil {
			return fmt.Errorf("drop edits held for %s: %w", ev.ID, err)
		}
	}
	return nil
}

// projectRedactedCopy applies an event the server handed over already
// redacted. The redaction itself may never be seen (a relations walk does
// not return it), so the copy stands in for it, exactly as a redaction of
// the event would.
func projectRedactedCopy(s ProjectionStore, ev *Event) error {
	return redact(s, ev.RoomID, ev.ID)
}

// redact applies the redaction of target in room: a tombstone first,
// then whatever showed or held it goes, and it is owed nothing.
func redact(s ProjectionStore, room, target string) error {
	// The tombstone comes first, so nothing arriving later can resurrect the
	// target.
	if err := s.Tombstone(room, target); err != nil {
		return fmt.Errorf("tombstone: %w", err)
	}
	// Whatever was held against the target goes, whether the target is a
	// visible original or never arrived.
	if err := s.DropHeldEdits(room, target); err != nil {
		return fmt.Errorf("drop held edits: %w", err)
	}
	row, ok, err := s.Visible(room, target)
	if err != nil {
		return fmt.Errorf("visible target: %w", err)
	}
	if ok {
		// Redacting the logical original deletes the message.
		if err := s.DropVisible(row); err != nil {
			return fmt.Errorf("drop visible: %w", err)
		}
	} else {
		// A redacted edit: if it is the revision on screen, the body goes now
		// and the row owes a refetch; a superseded edit changes nothing.
		logical, isEdit, err := s.EditTarget(room, target)
		if err != nil {
			return fmt.Errorf("edit target: %w", err)
		}
		if isEdit {
			row, ok, err := s.Visible(room, logical)
			if err != nil {
				return fmt.Errorf("visible original: %w", err)
			}
			if ok {
				if err := s.ClearVisible(row, target); err != nil {
					return fmt.Errorf("clear visible: %w", err)
				}
			}
		}
		// A held edit keeps its identity and ordering but loses its body.
		if err := s.ClearHeldEdit(room, target); err != nil {
			return fmt.Errorf("clear held edit: %w", err)
		}
	}
	// A redacted source has nothing left to answer.
	if err := s.Settle(room, target); err != nil {
		return fmt.Errorf("settle redacted source: %w", err)
	}
	return nil
}

// settleIfRedacted settles an event whose redaction arrived before it: it
// was admitted pending, but there is nothing left to answer.
func settleIfRedacted(s ProjectionStore, ev *Event) error {
	dead, err := s.Tombstoned(ev.RoomID, ev.ID)
	if err != nil {
		return fmt.Errorf("tombstone: %w", err)
	}
	if !dead {
		return nil
	}
	if err := s.Settle(ev.RoomID, ev.ID); err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	return nil
}

func projectOriginal(s ProjectionStore, ev *Event) error {
	dead, anyHeld, err := s.ProbeOriginal(ev.RoomID, ev.ID)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if dead {
		// Redacted before it arrived: it never becomes visible, nothing held
		// against it ever will either, and it is owed no answer.
		if err := s.DropHeldEdits(ev.RoomID, ev.ID); err != nil {
			return fmt.Errorf("drop held edits: %w", err)
		}
		if err := s.Settle(ev.RoomID, ev.ID); err != nil {
			return fmt.Errorf("settle: %w", err)
		}
		return nil
	}
	revision := Revision{TS: ev.TS, EventID: ev.ID}
	content, preview := []byte(ev.Content), ev.Preview
	if anyHeld {
		// Every edit held for this target goes now; only the author's own
		// may apply, and only if it is newer.
		held, err := s.TakeHeldEdits(ev.RoomID, ev.ID)
		if err != nil {
			return fmt.Errorf("take held edits: %w", err)
		}
		if h, ok := held[ev.Sender]; ok && h.Revision.After(revision) {
			// A redacted held edit has no body: it owes a refetch.
			revision, content, preview = h.Revision, h.Body, IsSidecarPreview(h.Body)
		}
	}
	body, owes := screenBody(content, preview)
	if err := s.AddVisible(ev, revision, body, owes); err != nil {
		return fmt.Errorf("add visible: %w", err)
	}
	return nil
}

func projectEdit(s ProjectionStore, ev *Event, self string) error {
	if IsTransportProgress(ev, self) {
		return nil
	}
	if dead, err := s.Tombstoned(ev.RoomID, ev.Target); err != nil || dead {
		if err != nil {
			return fmt.Errorf("target tombstone: %w", err)
		}
		return nil
	}
	// An edit whose redaction came first still takes its place among the
	// author's revisions, bodiless, exactly as if it had arrived first and
	// been redacted then: arrival order must not decide whether an older
	// revision comes back on screen. Recovering its body is the server's
	// answer to a refetch, never local history.
	redacted, err := s.Tombstoned(ev.RoomID, ev.ID)
	if err != nil {
		return fmt.Errorf("tombstone: %w", err)
	}
	content, preview := []byte(ev.NewContent), ev.Preview
	if redacted {
		content, preview = nil, false
	}
	revision := Revision{TS: ev.TS, EventID: ev.ID}
	row, ok, err := s.Visible(ev.RoomID, ev.Target)
	if err != nil {
		return fmt.Errorf("visible target: %w", err)
	}
	if ok {
		// Only the author's own edit applies, and only a newer one.
		if row.Sender != ev.Sender || !revision.After(row.Revision) {
			return nil
		}
		body, owes := screenBody(content, preview)
		if err := s.ReviseVisible(row, revision, body, owes); err != nil {
			return fmt.Errorf("revise visible: %w", err)
		}
		return nil
	}
	// A target the journal already holds but does not show (undecryptable,
	// fenced, admitted while out of the room, itself an edit) will never
	// project live: a held edit of it would keep its plaintext for good, so
	// it is dropped. Only a target not yet seen is waited for. History is
	// the exception: a walk after a rejoin re-projects the fenced target
	// later in the same walk, and its edits must be waiting for it.
	if ev.Provenance != History {
		known, err := s.Journaled(ev.RoomID, ev.Target)
		if err != nil {
			return fmt.Errorf("journaled target: %w", err)
		}
		if known {
			return nil
		}
	}
	// Hold the newest edit per (target, sender), so a stranger's edit can
	// never evict the author's.
	held, ok, err := s.HeldEdit(ev.RoomID, ev.Target, ev.Sender)
	if err != nil {
		return fmt.Errorf("held edit: %w", err)
	}
	if ok && !revision.After(held.Revision) {
		return nil
	}
	if err := s.HoldEdit(ev.RoomID, ev.Target, ev.Sender, HeldEdit{Revision: revision, Body: content}); err != nil {
		return fmt.Errorf("hold edit: %w", err)
	}
	return nil
}

func projectRedaction(s ProjectionStore, ev *Event) error {
	if err := redact(s, ev.RoomID, ev.Target); err != nil {
		return err
	}
	// A redaction can be redacted too, before it arrives.
	return settleIfRedacted(s, ev)
}

// Reproject applies an event the journal already holds, fetched again as
// history, to the visible projection. After a departure fenced the room
// and a rejoin began a new membership, the rows the old one derived are
// gone while the journal rows stay as proof; history rebuilds what a person
// sees. Every rule is idempotent except adding an original, so an original
// already on screen is left as it is.
func Reproject(s ProjectionStore, ev *Event, self string) error {
	if ev.Kind.Original() && !ev.Redacted {
		if _, ok, err := s.Visible(ev.RoomID, ev.ID); err != nil || ok {
			if err != nil {
				return fmt.Errorf("reproject %s: %w", ev.ID, err)
			}
			return nil
		}
	}
	return Project(s, ev, self, false)
}
