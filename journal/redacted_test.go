package journal_test

import (
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

const (
	redactedRoom = "!r:example.org"
	otherRoom    = "!other:example.org"
)

var skewMS = journal.RedactedCopySkew.Milliseconds()

// inDoubt is a row of redactedRoom attempted and not acknowledged,
// enqueued at created.
func inDoubt(id string, created int64) journal.Delivery {
	return journal.Delivery{DeliveryID: id, Stage: journal.StageFinal, RoomID: redactedRoom,
		CreatedMS: created, Position: created, State: journal.DeliveryAttempted}
}

func redactedAt(id string, ts int64) journal.RedactedSend {
	return journal.RedactedSend{EventID: id, ServerTS: ts}
}

func TestRedactedCopy(t *testing.T) {
	x, y := inDoubt("x", 3000), inDoubt("y", 8000)
	queued := x
	queued.State = journal.DeliveryQueued
	elsewhere := x
	elsewhere.RoomID = otherRoom
	initialOfY := y
	initialOfY.Stage = journal.StageInitial
	for _, c := range []struct {
		name      string
		d         journal.Delivery
		rows      []journal.Delivery
		redacted  []journal.RedactedSend
		delivered map[string]bool
		want      string // the event that explains d, "" for none
	}{
		{"NothingRedactedExplainsNothing", x, []journal.Delivery{x}, nil, nil, ""},
		{"ARedactedEventAfterTheEnqueueExplainsTheOnlyDeliveryInDoubt", x, []journal.Delivery{x},
			[]journal.RedactedSend{redactedAt("$e", 3200)}, nil, "$e"},
		{"TheRowNeedNotBeAmongTheScannedOnes", x, nil,
			[]journal.RedactedSend{redactedAt("$e", 3200)}, nil, "$e"},
		{"AnEventStampedAsEarlyAsTheSkewAllowsExplainsIt", x, []journal.Delivery{x},
			[]journal.RedactedSend{redactedAt("$e", 3000-skewMS)}, nil, "$e"},
		{"AnEventStampedBeforeThatExplainsNothing", x, []journal.Delivery{x},
			[]journal.RedactedSend{redactedAt("$e", 3000-skewMS-1)}, nil, ""},
		{"TheAcknowledgedEventOfADeliveryExplainsNothing", x, []journal.Delivery{x},
			[]journal.RedactedSend{redactedAt("$acked", 3200)}, map[string]bool{"$acked": true}, ""},
		{"AnEventWithoutAnIDOrATimestampExplainsNothing", x, []journal.Delivery{x},
			[]journal.RedactedSend{redactedAt("e", 3200), redactedAt("$e", 0)}, nil, ""},
		{"ADeliveryNotAttemptedIsNeverExplained", queued, []journal.Delivery{queued},
			[]journal.RedactedSend{redactedAt("$e", 3200)}, nil, ""},
		{"OfTwoEventsTheOldestExplainsTheDelivery", x, []journal.Delivery{x},
			[]journal.RedactedSend{redactedAt("$late", 3900), redactedAt("$early", 3200)}, nil, "$early"},

		// Two deliveries in doubt in one room, and one event that either
		// could be: a guess could lose the one never shown.
		{"OneEventThatEitherOfTwoCouldBeExplainsTheOlderNot", x, []journal.Delivery{x, y},
			[]journal.RedactedSend{redactedAt("$e", 8200)}, nil, ""},
		{"OneEventThatEitherOfTwoCouldBeExplainsTheNewerNot", y, []journal.Delivery{x, y},
			[]journal.RedactedSend{redactedAt("$e", 8200)}, nil, ""},
		{"OneEventListedTwiceIsStillOne", y, []journal.Delivery{x, y},
			[]journal.RedactedSend{redactedAt("$e", 8200), redactedAt("$e", 8200)}, nil, ""},
		{"TheOtherStageOfTheSameDeliveryIsAnotherRowInDoubt", y, []journal.Delivery{initialOfY, y},
			[]journal.RedactedSend{redactedAt("$e", 8200)}, nil, ""},
		// Only an event stamped before the newer was enqueued is the older's.
		{"AnEventOnlyTheOlderCouldBeExplainsIt", x, []journal.Delivery{x, y},
			[]journal.RedactedSend{redactedAt("$e", 3200)}, nil, "$e"},
		{"AnEventOnlyTheOlderCouldBeLeavesTheNewerUnexplained", y, []journal.Delivery{x, y},
			[]journal.RedactedSend{redactedAt("$e", 3200)}, nil, ""},
		{"OneEventEachExplainsTheOlderByTheOldest", x, []journal.Delivery{y, x},
			[]journal.RedactedSend{redactedAt("$second", 8300), redactedAt("$first", 8200)}, nil, "$first"},
		{"OneEventEachExplainsTheNewerByTheNext", y, []journal.Delivery{x, y},
			[]journal.RedactedSend{redactedAt("$second", 8300), redactedAt("$first", 8200)}, nil, "$second"},
		{"AnEventBeforeTheNewerAndOneAfterExplainBoth", y, []journal.Delivery{x, y},
			[]journal.RedactedSend{redactedAt("$before", 3200), redactedAt("$after", 8200)}, nil, "$after"},
		{"AnAcknowledgedEventIsNotASecondCopy", y, []journal.Delivery{x, y},
			[]journal.RedactedSend{redactedAt("$acked", 8200), redactedAt("$e", 8300)}, map[string]bool{"$acked": true}, ""},

		// Rows that cannot have a copy in the room do not compete.
		{"ARowNeverAttemptedIsNotInDoubt", y, []journal.Delivery{queued, y},
			[]journal.RedactedSend{redactedAt("$e", 8200)}, nil, "$e"},
		{"ARowOfAnotherRoomIsNotInDoubtHere", y, []journal.Delivery{elsewhere, y},
			[]journal.RedactedSend{redactedAt("$e", 8200)}, nil, "$e"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := journal.RedactedCopy(c.d, c.rows, c.redacted, c.delivered)
			if ok != (c.want != "") || got.EventID != c.want {
				t.Fatalf("RedactedCopy = %+v, %v; want %q", got, ok, c.want)
			}
			if ok && got.ServerTS != 0 {
				t.Fatalf("the acknowledgement carries server time %d: it would project a redacted reply", got.ServerTS)
			}
		})
	}
}
