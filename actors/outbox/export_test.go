package outbox

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// TrackedRows asks the outbox actor pid how many delivery rows it holds
// state for (backoff, rows it may resend unsearched, rows a search missed).
func TrackedRows(root *actor.RootContext, pid *actor.PID, timeout time.Duration) (int, error) {
	res, err := root.RequestFuture(pid, &trackedRows{}, timeout).Result()
	if err != nil {
		return 0, err
	}
	return res.(int), nil
}
