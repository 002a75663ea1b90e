package e2ee

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// pickleKeyBytes is the size of a generated pickle key.
const pickleKeyBytes = 32

// LoadPickleKey reads the pickle key from its secret file, or on the first
// start (no file yet) generates one and writes it there, 0600. The key is
// the file's text, surrounding white space removed; an empty file is an
// error rather than a key.
func LoadPickleKey(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return createPickleKey(path)
	case err != nil:
		return nil, fmt.Errorf("read pickle key file: %w", err)
	}
	key := strings.TrimSpace(string(data))
	if key == "" {
		return nil, fmt.Errorf("pickle key file %s is empty", path)
	}
	return []byte(key), nil
}

// createPickleKey writes a new random key to path, never over a file
// another process made meanwhile.
func createPickleKey(path string) ([]byte, error) {
	buf := make([]byte, pickleKeyBytes)
	if _, err := rand.Read(buf); err != nil {
		return nil, fmt.Errorf("generate pickle key: %w", err)
	}
	key := base64.RawStdEncoding.EncodeToString(buf)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("pickle key directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create pickle key file: %w", err)
	}
	if _, err := f.WriteString(key + "\n"); err != nil {
		f.Close()
		return nil, fmt.Errorf("write pickle key file: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("write pickle key file: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("write pickle key file: %w", err)
	}
	return []byte(key), nil
}
