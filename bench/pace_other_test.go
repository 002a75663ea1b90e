//go:build !linux

package bench

import "time"

// newPacer returns sleepPacer: other platforms have no timerfd, and the
// runtime's timers may wake a millisecond late (pace_linux_test.go).
func newPacer() (sleepUntil func(time.Time), release func()) {
	return sleepPacer()
}
