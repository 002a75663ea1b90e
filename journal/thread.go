package journal

import "fmt"

// Storage keys never depend on NULL equality: an unthreaded conversation is
// the empty string on disk. These two helpers are the only crossing between
// the typed form and the stored form, so no caller invents a third spelling.

// EncodeThread turns a typed thread reference (nil for the room itself) into
// its storage key. A non-nil thread must be a valid event ID.
func EncodeThread(thread *string) (string, error) {
	if thread == nil {
		return "", nil
	}
	if !ValidEventID(*thread) {
		return "", fmt.Errorf("%w: thread %q is not an event ID", ErrInvalidArgument, *thread)
	}
	return *thread, nil
}

// DecodeThread turns a storage key back into the typed form.
func DecodeThread(key string) *string {
	if key == "" {
		return nil
	}
	return &key
}
