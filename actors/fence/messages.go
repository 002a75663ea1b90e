package fence

import "github.com/mindroomd/mindroomd/journal"

type (
	// FenceDeparture applies a departure observation. Reply: *DepartureFenced.
	FenceDeparture struct {
		RoomID string
		Source journal.DepartureSource
		// ObservationID is the membership event ID (or a local leave's
		// request ID); a repeated one is a no-op.
		ObservationID string
	}
	// DepartureFenced answers FenceDeparture.
	DepartureFenced struct {
		Outcome journal.DepartureOutcome
		Err     error
	}

	// RecordJoin ends a departure. Reply: *JoinRecorded.
	RecordJoin struct {
		RoomID        string
		ObservationID string
	}
	// JoinRecorded answers RecordJoin.
	JoinRecorded struct{ Err error }

	// RetireOwedReports forgets the owed echoes of rooms. Reply:
	// *OwedReportsRetired.
	RetireOwedReports struct{ RoomIDs []string }
	// OwedReportsRetired answers RetireOwedReports.
	OwedReportsRetired struct {
		Retired int
		Err     error
	}
)
