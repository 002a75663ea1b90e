// Package contract is the behavioural contract every journal backend must
// pass. A backend's own test file calls Run with a factory; the suite uses
// only the journal interfaces plus the few backend hooks below, so a second
// backend runs the very same tests unchanged.
package contract

import (
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// Backend is one backend instance at one storage location.
type Backend interface {
	// Open opens the store at this backend's location. Opening again after
	// Close is a restart: everything committed must still be there.
	Open(tb testing.TB) journal.Store
	// CorruptPayload overwrites the stored payload of one of p's pending
	// events with bytes that do not decode, as bit rot or a foreign writer
	// would.
	CorruptPayload(tb testing.TB, p journal.Principal, eventID string)
	// Advance moves the clock of the stores this backend opens forward by
	// d, as time passing would.
	Advance(d time.Duration)
}

// Factory returns a fresh, empty backend for one test.
type Factory func(tb testing.TB) Backend
