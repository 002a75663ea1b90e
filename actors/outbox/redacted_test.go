package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/journal"
)

// acceptEverySend answers every send with success until ctx ends, so a
// send the test does not expect shows in its outcome instead of hanging.
func (f *fakeHomeserver) acceptEverySend(ctx context.Context) {
	go func() {
		for {
			select {
			case c := <-f.calls:
				c.reply <- nil
				<-c.returned
			case <-ctx.Done():
				return
			}
		}
	}()
}

// A reply the server accepted from an earlier device and someone redacted
// before it was acknowledged has no marker left to find. The deciding
// search takes the redacted event for it, and the reply is never sent
// again.
func TestAReplyRedactedBeforeItsAcknowledgementIsAcknowledgedNotSentAgain(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	claimed := sentFromOldDevice(h, v, srv, true)
	copyID := srv.Visible()[0].EventID
	srv.redact(copyID)
	srv.acceptEverySend(h.ctx)

	a := h.spawn(v, srv, func(d *outbox.Deps) { d.Reconciler = srv; d.SettleDelay = 10 * time.Millisecond })
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	if got := srv.Attempts(claimed.TxnID); got != 0 {
		t.Errorf("the reply was sent %d time(s) after the restart, want never", got)
	}
	if row := h.delivery(v, "reply-1", journal.StageFinal); row.EventID != copyID {
		t.Errorf("acknowledged %q, want the redacted copy %q", row.EventID, copyID)
	}
	// The first search finding no marker may be early; only the second
	// weighs the redacted event.
	if got := srv.Searches(); got != 2 {
		t.Errorf("searches = %d, want 2", got)
	}
}

// A redacted reply the principal acknowledged is accounted for: it is not
// taken for another reply that never reached the room, which is sent.
func TestARedactedReplyAlreadyAcknowledgedIsNotTakenForAnotherThatIsSent(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-0", Content: text("earlier")})
	d, err := v.Claim(h.ctx, "reply-0", journal.StageFinal, oldDevice)
	if err != nil {
		t.Fatal(err)
	}
	wire, err := journal.WireContent(d)
	if err != nil {
		t.Fatal(err)
	}
	srv.signIn(oldDevice)
	earlier := srv.accept(d, wire)
	if _, err := v.Acknowledge(h.ctx, "reply-0", journal.StageFinal, earlier); err != nil {
		t.Fatal(err)
	}
	srv.redact(earlier.EventID)
	claimed := sentFromOldDevice(h, v, srv, false)
	srv.acceptEverySend(h.ctx)

	a := h.spawn(v, srv, func(d *outbox.Deps) { d.Reconciler = srv; d.SettleDelay = 10 * time.Millisecond })
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	if got := srv.Attempts(claimed.TxnID); got != 1 {
		t.Errorf("reply-1 was sent %d time(s), want once: it never reached the room", got)
	}
	if row := h.delivery(v, "reply-1", journal.StageFinal); row.EventID == earlier.EventID {
		t.Errorf("reply-1 was acknowledged as reply-0's redacted event %q", row.EventID)
	}
}
