package e2ee

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/mindroomd/mindroomd/atomicfile"
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

// createPickleKey writes a new random key to path, whole or not at all:
// a torn key would lock the agents out of their accounts. Only one daemon
// writes it (the journal's lock keeps a second from starting).
func createPickleKey(path string) ([]byte, error) {
	buf := make([]byte, pickleKeyBytes)
	if _, err := rand.Read(buf); err != nil {
		return nil, fmt.Errorf("generate pickle key: %w", err)
	}
	key := base64.RawStdEncoding.EncodeToString(buf)
	if err := atomicfile.Write(path, []byte(key+"\n")); err != nil {
		return nil, fmt.Errorf("pickle key: %w", err)
	}
	return []byte(key), nil
}
