package outbox_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// trackedRows asks the actor how many rows it holds state for.
func (r *running) trackedRows() int {
	r.h.t.Helper()
	n, err := outbox.TrackedRows(r.h.system.Root, r.pid, testDeadline)
	if err != nil {
		r.h.t.Fatalf("ask the outbox actor: %v", err)
	}
	return n
}

// A daemon sends replies without end: the actor keeps state only for rows
// still owed, and lets go of each row once it is acknowledged (after a send
// or a search of the room), failed for good, or finished elsewhere.
func TestTheOutboxForgetsEveryRowOnceItIsFinished(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	const replies = 20
	for i := range replies {
		h.enqueue(v, journal.EnqueueRequest{DeliveryID: fmt.Sprintf("reply-%02d", i), Content: text("answer")})
	}
	a := h.spawn(v, srv, nil)
	for i := range replies {
		c := srv.next(h.ctx, t)
		switch {
		case i%5 == 1:
			// Retried once before it goes through.
			c.fail(h.ctx, t, &journal.SendError{Status: 502, Err: errors.New("bad gateway")})
			c = srv.next(h.ctx, t)
			c.accept(h.ctx, t)
		case i%5 == 2:
			c.fail(h.ctx, t, &journal.SendError{Status: 403, Err: errors.New("M_FORBIDDEN")})
			continue
		default:
			c.accept(h.ctx, t)
		}
		a.waitFor(outbox.Acknowledged, c.Delivery.DeliveryID, journal.StageFinal)
	}
	if got := h.unacknowledged(v); len(got) != 0 {
		t.Fatalf("unacknowledged = %v, want none", got)
	}
	if n := a.trackedRows(); n != 0 {
		t.Errorf("after %d finished replies the actor holds state for %d rows, want none", replies, n)
	}

	// Rows an earlier run attempted are acknowledged by the search that
	// finds them in the room, and forgotten as well.
	a.stop()
	for i := range 3 {
		id := fmt.Sprintf("earlier-%d", i)
		h.enqueue(v, journal.EnqueueRequest{DeliveryID: id, Content: text("answer")})
		if _, err := v.Claim(h.ctx, id, journal.StageFinal, device); err != nil {
			t.Fatal(err)
		}
		d := h.delivery(v, id, journal.StageFinal)
		content, err := journal.WireContent(d)
		if err != nil {
			t.Fatal(err)
		}
		srv.accept(d, content)
	}
	b := h.spawn(v, srv, func(d *outbox.Deps) { d.Reconciler = srv })
	for i := range 3 {
		b.waitFor(outbox.Acknowledged, fmt.Sprintf("earlier-%d", i), journal.StageFinal)
	}
	if n := b.trackedRows(); n != 0 {
		t.Errorf("after the searches found every earlier row the actor holds state for %d rows, want none", n)
	}
}

// A stopped actor leaves no subscription on the hint bus: the principal
// that started it hands it one and never closes it itself.
func TestAStoppedOutboxLeavesNoSubscriptionOnTheHintBus(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	a := h.spawn(v, newFakeHomeserver("srv"), nil)
	// Stopped without the harness closing the subscription afterwards.
	a.stopOnce.Do(func() {})
	if err := h.system.Root.StopFuture(a.pid).Wait(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.sub.C():
	default:
	}
	h.store.Hints().Publish([]hint.Hint{{Principal: v.Principal().String(), Room: room, Position: 1}})
	select {
	case <-a.sub.C():
		t.Fatal("the stopped actor's subscription still receives hints")
	default:
	}
}
