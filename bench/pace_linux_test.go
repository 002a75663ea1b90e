package bench

import (
	"runtime"
	"syscall"
	"time"
)

// prSetTimerSlack is prctl's PR_SET_TIMERSLACK.
const prSetTimerSlack = 29

// newPacer returns a sleepUntil that wakes about a tenth of a millisecond
// after each due time. The runtime's own timers wait in the network poller,
// whose timeout is whole milliseconds: on the machine these figures come
// from, time.Sleep(400µs) slept 1.13 ms at the median, so a generator
// built on it offered its load as bursts of two or three commands a
// millisecond apart, and counted its own oversleep as command latency. A
// nanosleep on a thread of its own, with the timer slack at its minimum,
// overslept by about 0.1 ms. It locks the calling goroutine to its thread
// until the returned release, which gives the thread back with its default
// slack (0 restores it), is called.
func newPacer() (sleepUntil func(time.Time), release func()) {
	runtime.LockOSThread()
	// Best effort: with the default slack (50 µs) the pacer is only a little
	// less exact.
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, 1, 0)
	sleepUntil = func(due time.Time) {
		d := time.Until(due)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(d.Nanoseconds())
		for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
		}
	}
	release = func() {
		_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, 0, 0)
		runtime.UnlockOSThread()
	}
	return sleepUntil, release
}
