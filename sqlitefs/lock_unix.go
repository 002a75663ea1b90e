//go:build unix

package sqlitefs

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// lockWriter takes the journal's writer lock: an exclusive flock on a file
// beside it, held until the returned file is closed. The kernel drops it
// when the process dies, however it dies, so a killed daemon never leaves
// the journal locked. A flock belongs to an open file description, so a
// second lockWriter in the same process conflicts too.
func lockWriter(path string) (*os.File, error) {
	f, err := os.OpenFile(path+lockSuffix, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open journal lock: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open journal lock: %w", err)
	}
	var lockErr error
	if err := rc.Control(func(fd uintptr) {
		for {
			lockErr = unix.Flock(int(fd), unix.LOCK_EX|unix.LOCK_NB)
			if !errors.Is(lockErr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		lockErr = err
	}
	switch {
	case errors.Is(lockErr, unix.EWOULDBLOCK):
		f.Close()
		return nil, fmt.Errorf("%w: %s", ErrLocked, path)
	case lockErr != nil:
		f.Close()
		return nil, fmt.Errorf("lock journal: %w", lockErr)
	}
	return f, nil
}
