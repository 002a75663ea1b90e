package outbox_test

import (
	"io"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/journal"
)

// The device an earlier process was signed in as; the tests' actors run as
// the package's device.
const oldDevice = "OLDDEVICE"

// sentFromOldDevice leaves reply-1 as an earlier process on oldDevice left
// it: claimed from that device, and, when reached is set, accepted by the
// server before the process died without acknowledging it. The client is
// then signed in again on the current device.
func sentFromOldDevice(h *harness, v journal.PrincipalStore, srv *fakeHomeserver, reached bool) journal.Delivery {
	h.t.Helper()
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Content: text("hello")})
	claimed, err := v.Claim(h.ctx, "reply-1", journal.StageFinal, oldDevice)
	if err != nil {
		h.t.Fatalf("Claim: %v", err)
	}
	if reached {
		wire, err := journal.WireContent(claimed)
		if err != nil {
			h.t.Fatalf("WireContent: %v", err)
		}
		srv.signIn(oldDevice)
		srv.accept(claimed, wire)
	}
	srv.signIn(device)
	return claimed
}

func TestAReplySentFromAnEarlierDeviceIsFoundInTheRoomNotSentAgain(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	claimed := sentFromOldDevice(h, v, srv, true)
	first := srv.Visible()[0]

	a := h.spawn(v, srv, func(d *outbox.Deps) { d.Reconciler = srv })
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)

	row := h.delivery(v, "reply-1", journal.StageFinal)
	if row.State != journal.DeliveryAcknowledged || row.EventID != first.EventID {
		t.Errorf("row = %v %q, want %v %q", row.State, row.EventID, journal.DeliveryAcknowledged, first.EventID)
	}
	if got := len(srv.Visible()); got != 1 {
		t.Errorf("the room shows the reply %d times, want once", got)
	}
	if got := srv.Attempts(claimed.TxnID); got != 0 {
		t.Errorf("sends through the actor = %d, want none", got)
	}
	if got := srv.Searches(); got != 1 {
		t.Errorf("searches = %d, want 1", got)
	}
}

func TestAReplyAttemptedFromAnEarlierDeviceIsSentAgainOnlyWhenTheRoomLacksIt(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	claimed := sentFromOldDevice(h, v, srv, false)

	a := h.spawn(v, srv, func(d *outbox.Deps) { d.Reconciler = srv; d.SettleDelay = 10 * time.Millisecond })
	c := srv.next(h.ctx, t)
	// Not found once, it is looked for once more before it is sent again.
	if got := srv.Searches(); got != 2 {
		t.Errorf("searches before the resend = %d, want 2", got)
	}
	if got, want := c.Delivery.DeviceID, device; got != want {
		t.Errorf("resent as the row of device %q, want %q", got, want)
	}
	if got, want := c.Delivery.TxnID, claimed.TxnID; got != want {
		t.Errorf("resent TxnID = %q, want the frozen %q", got, want)
	}
	eventID := c.accept(h.ctx, t)
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	row := h.delivery(v, "reply-1", journal.StageFinal)
	if row.State != journal.DeliveryAcknowledged || row.EventID != eventID || row.DeviceID != device {
		t.Errorf("row = %v %q from %q, want %v %q from %q", row.State, row.EventID, row.DeviceID,
			journal.DeliveryAcknowledged, eventID, device)
	}
	if got := len(srv.Visible()); got != 1 {
		t.Errorf("the room shows the reply %d times, want once", got)
	}
}

func TestWithoutAReconcilerAReplyFromAnEarlierDeviceIsNeverResent(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	claimed := sentFromOldDevice(h, v, srv, true)
	// A later reply of this device passes it: once that one is
	// acknowledged, the scan has been past reply-1 and left it alone.
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-2", Content: text("later")})

	a := h.spawn(v, srv, nil)
	c := srv.next(h.ctx, t)
	if got := c.Delivery.DeliveryID; got != "reply-2" {
		t.Fatalf("the actor sent %s, want only reply-2", got)
	}
	c.accept(h.ctx, t)
	a.waitFor(outbox.Acknowledged, "reply-2", journal.StageFinal)

	if got := srv.Attempts(claimed.TxnID); got != 0 {
		t.Errorf("reply-1 was sent %d times from the new device, want never", got)
	}
	row := h.delivery(v, "reply-1", journal.StageFinal)
	if row.State != journal.DeliveryAttempted || row.DeviceID != oldDevice {
		t.Errorf("reply-1 = %v from %q, want still %v from %q", row.State, row.DeviceID, journal.DeliveryAttempted, oldDevice)
	}
}

// Some homeservers keep their transaction IDs in memory, per access token:
// after their restart, or a new token on the same device, a resend is a
// second event. A row an earlier run sent is therefore looked for first.
func TestAReplyAnEarlierRunSentIsLookedForBeforeItIsSentAgain(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Content: text("hello")})
	claimed, err := v.Claim(h.ctx, "reply-1", journal.StageFinal, device)
	if err != nil {
		t.Fatal(err)
	}
	wire, err := journal.WireContent(claimed)
	if err != nil {
		t.Fatal(err)
	}
	first := srv.accept(claimed, wire)
	srv.forgetTransactions()

	a := h.spawn(v, srv, func(d *outbox.Deps) { d.Reconciler = srv })
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	row := h.delivery(v, "reply-1", journal.StageFinal)
	if row.State != journal.DeliveryAcknowledged || row.EventID != first.EventID {
		t.Errorf("row = %v %q, want %v %q", row.State, row.EventID, journal.DeliveryAcknowledged, first.EventID)
	}
	if got := len(srv.Visible()); got != 1 {
		t.Errorf("the room shows the reply %d times, want once", got)
	}
	if got := srv.Attempts(claimed.TxnID); got != 0 {
		t.Errorf("sends through the actor = %d, want none", got)
	}
}

func TestARowThisRunClaimedIsRetriedWithoutSearchingTheRoom(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Content: text("hello")})
	a := h.spawn(v, srv, func(d *outbox.Deps) { d.Reconciler = srv })
	c := srv.next(h.ctx, t)
	c.fail(h.ctx, t, &journal.SendError{Status: 502})
	srv.next(h.ctx, t).accept(h.ctx, t)
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	if got := srv.Searches(); got != 0 {
		t.Errorf("searches = %d, want none for a row this run sent", got)
	}
	if got := len(srv.Visible()); got != 1 {
		t.Errorf("the room shows the reply %d times, want once", got)
	}
}

// A send cut off by a crash may still land after the restart's first
// search: the row is looked for once more before it is sent again, and the
// late copy is acknowledged instead of a second one sent.
func TestACutOffSendThatLandsAfterTheFirstSearchIsFoundNotSentAgain(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	claimed := sentFromOldDevice(h, v, srv, false)
	wire, err := journal.WireContent(claimed)
	if err != nil {
		t.Fatal(err)
	}
	srv.afterSearch = func(n int) {
		if n == 1 {
			srv.signIn(oldDevice)
			srv.accept(claimed, wire)
			srv.signIn(device)
		}
	}
	a := h.spawn(v, srv, func(d *outbox.Deps) { d.Reconciler = srv; d.SettleDelay = 10 * time.Millisecond })
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	if got := len(srv.Visible()); got != 1 {
		t.Errorf("the room shows the reply %d times, want once", got)
	}
	if got := srv.Attempts(claimed.TxnID); got != 0 {
		t.Errorf("sends through the actor = %d, want none", got)
	}
	if got := srv.Searches(); got != 2 {
		t.Errorf("searches = %d, want 2", got)
	}
}

// A send that got no answer may have reached the room: when the homeserver
// restarts meanwhile and forgets its transaction IDs (Dendrite keeps them
// in memory), a blind resend in the same run would be a second event. The
// row is looked for first, and the copy that landed is acknowledged.
func TestAnUnansweredSendIsLookedForBeforeTheSameRunSendsItAgain(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Content: text("hello")})
	a := h.spawn(v, srv, func(d *outbox.Deps) { d.Reconciler = srv; d.SettleDelay = 10 * time.Millisecond })
	c := srv.next(h.ctx, t)
	// The server stores the event and dies before it answers; it comes
	// back without its memory of transaction IDs.
	landed := srv.accept(c.Delivery, c.Content)
	c.fail(h.ctx, t, &journal.SendError{Status: 0, Err: io.ErrUnexpectedEOF})
	srv.forgetTransactions()
	// Any send again is accepted, as the restarted server would.
	go func() {
		for {
			select {
			case c := <-srv.calls:
				c.reply <- nil
				<-c.returned
			case <-h.ctx.Done():
				return
			}
		}
	}()

	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	if got := len(srv.Visible()); got != 1 {
		t.Errorf("the room shows the reply %d times, want once", got)
	}
	if row := h.delivery(v, "reply-1", journal.StageFinal); row.EventID != landed.EventID {
		t.Errorf("acknowledged %q, want the copy that landed, %q", row.EventID, landed.EventID)
	}
}
