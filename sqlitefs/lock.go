package sqlitefs

import "errors"

// ErrLocked reports a journal another DB holds open for writing, in this
// process or in another: only one writer may have the file at a time.
var ErrLocked = errors.New("journal is open for writing by another process")

// lockSuffix names the lock file beside the journal. The file stays when
// the lock is released: removing it could let two processes lock two
// different files of the same name.
const lockSuffix = ".lock"
