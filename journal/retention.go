package journal

import (
	"context"
	"fmt"
	"time"
)

// The rules of retention: how long each kind of settled data is kept, and
// the one rule that keeps exactly-once: an identity (an event ID, a
// delivery's transaction and event IDs) outlives every body it stands for,
// and outlives what the homeserver may still send again. Everything here is
// pure; the stores prune in bounded batches at the cutoffs computed here.

// MinIdentityWindow is the least time identities are kept: the
// homeserver's transaction window, and the age a redelivered sync may
// still bring an event from, behind the stored sync token.
const MinIdentityWindow = 24 * time.Hour

// RetentionPolicy says how long settled data is kept. A zero window keeps
// that kind for ever; the zero policy prunes nothing.
type RetentionPolicy struct {
	// Bodies is how long a settled message's body stays in the
	// conversation (its visible row), counted from when it was received.
	Bodies time.Duration
	// Payloads is how long a delivery's content stays once it is
	// acknowledged, refused or retired.
	Payloads time.Duration
	// Turns is how long the record of an answered turn stays.
	Turns time.Duration
	// Rejected is how long a malformed event's record stays.
	Rejected time.Duration
	// Identities is how long an event's identity, a finished delivery's
	// identity and a decided approval stay once nothing else needs them: at
	// least MinIdentityWindow, and at least every other window.
	Identities time.Duration
}

// Enabled reports whether the policy prunes anything.
func (p RetentionPolicy) Enabled() bool { return p != RetentionPolicy{} }

// Validate refuses a policy that would lose an identity before what it
// stands for: identities kept less than MinIdentityWindow, or less than a
// body, payload, turn or rejected record they identify.
func (p RetentionPolicy) Validate() error {
	for _, w := range []struct {
		name string
		d    time.Duration
	}{{"bodies", p.Bodies}, {"payloads", p.Payloads}, {"turns", p.Turns}, {"rejected", p.Rejected}, {"identities", p.Identities}} {
		if w.d < 0 {
			return fmt.Errorf("%w: retention %s: %s is negative", ErrInvalidArgument, w.name, w.d)
		}
		if p.Identities != 0 && w.d > p.Identities {
			return fmt.Errorf("%w: retention %s: %s is longer than identities (%s): an identity must outlive what it identifies",
				ErrInvalidArgument, w.name, w.d, p.Identities)
		}
	}
	if p.Identities != 0 && p.Identities < MinIdentityWindow {
		return fmt.Errorf("%w: retention identities: %s is shorter than %s, the window a redelivery may come in",
			ErrInvalidArgument, p.Identities, MinIdentityWindow)
	}
	return nil
}

// RetentionCutoffs are the times, in unix milliseconds, before which each
// kind is pruned; zero prunes none of it.
type RetentionCutoffs struct {
	Bodies, Payloads, Turns, Rejected, Identities int64
}

// Cutoffs are p's cutoffs at now for a principal whose sync token was
// stored at syncTokenMS. Identities are kept for MinIdentityWindow behind
// the sync token too, so a daemon that was stopped longer than the window
// still recognises what the first sync after it brings again; before the
// first stored token none is pruned.
func (p RetentionPolicy) Cutoffs(now time.Time, syncTokenMS int64) RetentionCutoffs {
	at := func(d time.Duration) int64 {
		if d <= 0 {
			return 0
		}
		return now.Add(-d).UnixMilli()
	}
	c := RetentionCutoffs{Bodies: at(p.Bodies), Payloads: at(p.Payloads), Turns: at(p.Turns), Rejected: at(p.Rejected)}
	if p.Identities > 0 && syncTokenMS > 0 {
		c.Identities = max(min(at(p.Identities), syncTokenMS-MinIdentityWindow.Milliseconds()), 0)
	}
	return c
}

// RetentionCount is what one pass, or all of them, pruned.
type RetentionCount struct {
	// Bodies are visible messages removed from the conversation, Edits
	// edits that never found their message.
	Bodies, Edits int64
	// Payloads are finished deliveries whose content was cleared.
	Payloads int64
	// Turns are turn records removed, Rejected malformed events' records.
	Turns, Rejected int64
	// Identities are events, Deliveries finished deliveries and Approvals
	// decided approvals removed for good.
	Identities, Deliveries, Approvals int64
	// Bytes are the bodies' and payloads' bytes cleared.
	Bytes int64
}

// Add sums two counts.
func (c RetentionCount) Add(o RetentionCount) RetentionCount {
	return RetentionCount{Bodies: c.Bodies + o.Bodies, Edits: c.Edits + o.Edits, Payloads: c.Payloads + o.Payloads,
		Turns: c.Turns + o.Turns, Rejected: c.Rejected + o.Rejected, Identities: c.Identities + o.Identities,
		Deliveries: c.Deliveries + o.Deliveries, Approvals: c.Approvals + o.Approvals, Bytes: c.Bytes + o.Bytes}
}

// Rows is every row the count touched.
func (c RetentionCount) Rows() int64 {
	return c.Bodies + c.Edits + c.Payloads + c.Turns + c.Rejected + c.Identities + c.Deliveries + c.Approvals
}

// RetentionStatus is a principal's retention so far.
type RetentionStatus struct {
	// Passes counts the passes run, LastPassMS is when the last ended.
	Passes     int64
	LastPassMS int64
	// Total is everything pruned so far.
	Total RetentionCount
	// IdentitiesBeforeMS is the newest cutoff identities were pruned at:
	// an event received before it may have been journaled and forgotten.
	IdentitiesBeforeMS int64
	// OldestBodyMS is the origin time of the oldest message still in the
	// conversation, 0 when there is none.
	OldestBodyMS int64
}

// Retention prunes one principal's settled data.
type Retention interface {
	// Retain runs one retention pass at p's cutoffs, in bounded batches,
	// each its own commit: nothing pending or owed is touched (an event not
	// settled, a room with pending work, an undelivered or unfinished
	// delivery, an open approval, a refetch debt).
	Retain(ctx context.Context, p RetentionPolicy) (RetentionCount, error)
	// RetentionStatus reads the principal's retention so far.
	RetentionStatus(ctx context.Context) (RetentionStatus, error)
	// IdentityHorizon is the newest cutoff identities were pruned at (0
	// when none were): an event received before it may have been
	// journaled and forgotten, so nothing older is taken for missed.
	IdentityHorizon(ctx context.Context) (int64, error)
}
