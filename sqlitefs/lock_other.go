//go:build !unix

package sqlitefs

import (
	"errors"
	"os"
)

// lockWriter refuses to open the journal for writing where this package has
// no file lock to keep a second writer out: running unguarded would make
// a second daemon a silent risk instead of an error.
func lockWriter(string) (*os.File, error) {
	return nil, errors.New("lock journal: no single-writer lock on this platform")
}
