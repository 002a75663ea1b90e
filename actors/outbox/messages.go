package outbox

import "github.com/mindroomd/mindroomd/journal"

type (
	// DeliverPending asks the actor to scan the outbox and send what is due.
	// Hints and start-up send it; extra ones coalesce.
	DeliverPending struct{}

	// sent reports the outcome of one send started by the actor.
	sent struct {
		delivery journal.Delivery
		record   journal.Sent
		err      error
	}

	// reconciled reports the search for a delivery attempted from another
	// device.
	reconciled struct {
		delivery journal.Delivery
		search   journal.Search
		err      error
	}

	// retryDue wakes the actor when the earliest backoff has passed.
	retryDue struct{}

	// trackedRows asks how many rows the actor holds state for; it is
	// answered with an int.
	trackedRows struct{}
)
