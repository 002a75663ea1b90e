package bench

import "time"

// sleepPacer paces with the runtime's timers, which may wake up to a
// millisecond late.
func sleepPacer() (sleepUntil func(time.Time), release func()) {
	return func(due time.Time) { time.Sleep(time.Until(due)) }, func() {}
}
