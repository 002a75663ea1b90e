package matrix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/mindroomd/mindroomd/atomicfile"
)

// Session is what a login leaves for the next run: above all the device,
// since the homeserver deduplicates transaction IDs per device.
type Session struct {
	UserID      string `json:"user_id"`
	DeviceID    string `json:"device_id"`
	AccessToken string `json:"access_token"`
}

// String names the session's user and device, never its token.
func (s Session) String() string { return s.UserID + " on " + s.DeviceID }

// GoString keeps %#v as quiet as %v.
func (s Session) GoString() string { return "matrix.Session{" + s.String() + "}" }

// Sessions keeps each agent's session between runs. An agent with none
// yet has the empty Session.
type Sessions interface {
	LoadSession(ctx context.Context, agent string) (Session, error)
	SaveSession(ctx context.Context, agent string, s Session) error
}

// FileSessions keeps each agent's session in a file of its own,
// <StorageDir>/matrix/<agent>.session.json.
type FileSessions struct{ StorageDir string }

var _ Sessions = FileSessions{}

// LoadSession implements Sessions.
func (f FileSessions) LoadSession(_ context.Context, agent string) (Session, error) {
	return readSession(sessionPath(f.StorageDir, agent))
}

// SaveSession implements Sessions.
func (f FileSessions) SaveSession(_ context.Context, agent string, s Session) error {
	return writeSession(sessionPath(f.StorageDir, agent), s)
}

// sessionPath is <storage>/matrix/<agent>.session.json.
func sessionPath(storageDir, agent string) string {
	return filepath.Join(storageDir, "matrix", agent+".session.json")
}

// readSession loads a session file; a missing one is an empty session. A
// file that exists but does not decode is an error rather than a fresh
// start: starting over would silently lose the device.
func readSession(path string) (Session, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Session{}, nil
	}
	if err != nil {
		return Session{}, fmt.Errorf("read session file: %w", err)
	}
	var s Session
	if err := json.Unmarshal(data, &s); err != nil {
		// The decoder's message quotes no input, so no token can leak.
		return Session{}, fmt.Errorf("session file %s is damaged (fix or remove it): %w", path, err)
	}
	return s, nil
}

// writeSession replaces the session file atomically: a crash leaves the
// old file or the new one, never a torn one. The file is 0600 and its
// directory 0700, since it holds an access token.
func writeSession(path string, s Session) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("session directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("session directory: %w", err)
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode session: %w", err)
	}
	if err := atomicfile.Write(path, append(data, '\n')); err != nil {
		return fmt.Errorf("session file: %w", err)
	}
	return nil
}
