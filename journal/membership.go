package journal

import (
	"fmt"
	"time"
)

// OwedReportWindow is how long a local leave's owed echo may absorb a
// reported leave. An echo that never arrives must not swallow a later, real
// departure for good.
const OwedReportWindow = 24 * time.Hour

// MembershipStore is what the fence's rules read and write for one
// principal, inside one transaction. A backend implements it in its own
// SQL; the decisions are ApplyDeparture's and ApplyJoin's.
type MembershipStore interface {
	// RecordObservation records that observation of room was applied; it
	// reports false when it had been already.
	RecordObservation(room, observation string) (fresh bool, err error)
	// Membership returns the room's epoch and whether the principal is out
	// of it.
	Membership(room string) (epoch int64, departed bool, err error)
	// EndMembership advances the room's epoch, marks the principal out, and
	// deletes or retires everything derived from the old membership (see
	// Membership.FenceDeparture).
	EndMembership(room string) error
	// Rejoin marks the principal back in the room under its current epoch.
	Rejoin(room string) error
	// OweReport records that a local leave owes one sync-reported echo.
	OweReport(room string, at time.Time) error
	// DropOwedReportsBefore forgets the room's echoes owed since before t.
	DropOwedReportsBefore(room string, t time.Time) error
	// TakeOwedReport consumes the room's oldest echo owed since t, if any.
	TakeOwedReport(room string, since time.Time) (bool, error)
}

// ApplyDeparture applies one departure observation at time now. A local
// leave fences at once and owes one echo. A reported leave consumes an owed
// echo still within OwedReportWindow, and fences otherwise. A removal (kick
// or ban) is never the echo of a leave of ours, so it fences unless the
// principal is already out. A repeated observation changes nothing.
func ApplyDeparture(s MembershipStore, room string, source DepartureSource, observation string, now time.Time) (DepartureOutcome, error) {
	if !ValidRoomID(room) {
		return 0, fmt.Errorf("%w: %q is not a room ID", ErrInvalidArgument, room)
	}
	switch source {
	case DepartureLocal, DepartureReported, DepartureRemoved:
	default:
		return 0, fmt.Errorf("%w: unknown departure source %d", ErrInvalidArgument, source)
	}
	if observation != "" {
		fresh, err := s.RecordObservation(room, observation)
		if err != nil {
			return 0, fmt.Errorf("record observation: %w", err)
		}
		if !fresh {
			return RepeatedReport, nil
		}
	}
	_, departed, err := s.Membership(room)
	if err != nil {
		return 0, fmt.Errorf("read membership: %w", err)
	}
	if source == DepartureReported {
		horizon := now.Add(-OwedReportWindow)
		if err := s.DropOwedReportsBefore(room, horizon); err != nil {
			return 0, fmt.Errorf("expire owed reports: %w", err)
		}
		owed, err := s.TakeOwedReport(room, horizon)
		if err != nil {
			return 0, fmt.Errorf("consume owed report: %w", err)
		}
		if owed {
			return OwedReportConsumed, nil
		}
	}
	if departed {
		return AlreadyFenced, nil
	}
	if err := s.EndMembership(room); err != nil {
		return 0, fmt.Errorf("fence: %w", err)
	}
	if source == DepartureLocal {
		if err := s.OweReport(room, now); err != nil {
			return 0, fmt.Errorf("owe departure report: %w", err)
		}
	}
	return Fenced, nil
}

// ApplyJoin ends a departure: the principal is in the room again under the
// advanced epoch. An old join replayed cannot re-arm a newer departure.
func ApplyJoin(s MembershipStore, room, observation string) error {
	if !ValidRoomID(room) {
		return fmt.Errorf("%w: %q is not a room ID", ErrInvalidArgument, room)
	}
	if observation != "" {
		fresh, err := s.RecordObservation(room, observation)
		if err != nil {
			return fmt.Errorf("record observation: %w", err)
		}
		if !fresh {
			return nil
		}
	}
	if err := s.Rejoin(room); err != nil {
		return fmt.Errorf("rejoin: %w", err)
	}
	return nil
}
