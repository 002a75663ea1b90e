package journal

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors shared by every backend, so callers can branch with
// errors.Is regardless of which storage answered.
var (
	// ErrInvalidPrincipal reports an agent name or Matrix user ID that cannot
	// name a principal.
	ErrInvalidPrincipal = errors.New("invalid principal")
	// ErrInvalidEvent reports an inbound event that cannot be admitted.
	ErrInvalidEvent = errors.New("invalid event")
	// ErrInvalidArgument reports a caller-supplied argument outside its domain
	// (a non-positive limit, a malformed room ID, ...).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrClosed reports an operation on a store that has been closed.
	ErrClosed = errors.New("store closed")
	// ErrStrictRead reports a strict read that could not show the
	// conversation whole: its hydration, or the refetch of a message its
	// page owes, failed. It fails closed rather than serve a page with
	// holes.
	ErrStrictRead = errors.New("strict read failed")
	// ErrConflict reports a write that would break a uniqueness or
	// primary-key rule of the journal: each store maps its database's own
	// code for it onto this.
	ErrConflict = errors.New("conflict")
	// ErrCorrupt reports a journal its database finds damaged (or, for a
	// file, not a database at all). Unlike a full disk or a lost
	// connection, it does not pass by itself: it waits for a restore.
	ErrCorrupt = errors.New("journal corrupt")
)

// EventError explains why one inbound event was rejected. It wraps
// ErrInvalidEvent so callers can test for the class with errors.Is.
type EventError struct {
	// Field names the offending part of the event ("event_id", "content", ...).
	Field string
	// Reason is a short human-readable explanation.
	Reason string
}

// Error implements error.
func (e *EventError) Error() string { return "invalid event: " + e.Field + ": " + e.Reason }

// Unwrap lets errors.Is(err, ErrInvalidEvent) succeed.
func (e *EventError) Unwrap() error { return ErrInvalidEvent }

func eventErr(field, reason string) error { return &EventError{Field: field, Reason: reason} }

// SendError is a failed send of a delivery, with the homeserver's
// answer: the transport reports it, the outbox decides from it whether to
// retry.
type SendError struct {
	// Status is the HTTP status; 0 for a network error.
	Status int
	// RetryAfter is the server's retry_after_ms on a 429.
	RetryAfter time.Duration
	Err        error
}

// Error implements error.
func (e *SendError) Error() string { return fmt.Sprintf("send: status %d: %v", e.Status, e.Err) }

// Unwrap returns the underlying error.
func (e *SendError) Unwrap() error { return e.Err }
