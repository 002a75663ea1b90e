package bench

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// newPacer returns a sleepUntil that wakes at each due time (commands
// started 0.08 ms late at the median here), and a release for its timer.
//
// It waits on a timerfd read through the runtime's network poller, so the
// generator's goroutine parks and gives its processor to the commands it
// has just started. Two other ways were measured and rejected:
//   - time.Sleep: the runtime's timers wait in the poller with a timeout of
//     whole milliseconds, so time.Sleep(400µs) slept 1.13 ms at the median
//     here and the generator sent its commands two or three at a time.
//   - nanosleep: exact, but a system call keeps its processor until the
//     runtime's monitor takes it back, so the commands it had just started
//     waited to run: their starts were 4.4 to 6.4 ms late at the 99th
//     percentile, against 1.5 to 1.7 ms with the timerfd.
func newPacer() (sleepUntil func(time.Time), release func()) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return sleepPacer()
	}
	// A non-blocking descriptor is registered with the poller: a read parks
	// the goroutine instead of blocking its thread.
	timer := os.NewFile(uintptr(fd), "pacer-timerfd")
	var expirations [8]byte
	sleepUntil = func(due time.Time) {
		d := time.Until(due)
		if d <= 0 {
			return
		}
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
		if unix.TimerfdSettime(fd, 0, &spec, nil) != nil {
			time.Sleep(d)
			return
		}
		if _, err := timer.Read(expirations[:]); err != nil {
			time.Sleep(time.Until(due))
		}
	}
	return sleepUntil, func() { _ = timer.Close() }
}
