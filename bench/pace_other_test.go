//go:build !linux

package bench

import "time"

// newPacer returns a sleepUntil built on the runtime's timers, which may
// wake a millisecond late; pace_linux_test.go has the exact one.
func newPacer() (sleepUntil func(time.Time), release func()) {
	return func(due time.Time) { time.Sleep(time.Until(due)) }, func() {}
}
