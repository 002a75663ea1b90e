// Package logbuf is a log buffer for tests: a daemon, an actor or a child
// process writes it from goroutines of its own while the test reads it.
package logbuf

import (
	"bytes"
	"sync"
)

// Buffer is a log that may be read while it is written. The zero value is
// empty and ready.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
