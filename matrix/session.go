package matrix

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/mindroomd/mindroomd/atomicfile"
)

// session is what a login leaves for the next run: above all the device,
// since the homeserver deduplicates transaction IDs per device.
type session struct {
	UserID      string `json:"user_id"`
	DeviceID    string `json:"device_id"`
	AccessToken string `json:"access_token"`
}

// sessionPath is <storage>/matrix/<agent>.session.json.
func sessionPath(storageDir, agent string) string {
	return filepath.Join(storageDir, "matrix", agent+".session.json")
}

// readSession loads a session file; a missing one is an empty session. A
// file that exists but does not decode is an error rather than a fresh
// start: starting over would silently lose the device.
func readSession(path string) (session, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return session{}, nil
	}
	if err != nil {
		return session{}, fmt.Errorf("read session file: %w", err)
	}
	var s session
	if err := json.Unmarshal(data, &s); err != nil {
		// The decoder's message quotes no input, so no token can leak.
		return session{}, fmt.Errorf("session file %s is damaged (fix or remove it): %w", path, err)
	}
	return s, nil
}

// writeSession replaces the session file atomically: a crash leaves the
// old file or the new one, never a torn one. The file is 0600 and its
// directory 0700, since it holds an access token.
func writeSession(path string, s session) error {
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
