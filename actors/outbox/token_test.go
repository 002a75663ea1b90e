package outbox_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/logbuf"
)

// A send refused for its access token (the session signed out, a password
// reset) is not refused for what it sends: the row stays owed, retried
// with backoff, and goes out once a login is accepted. The refusal is
// logged once, not at every retry.
func TestASendRefusedForItsTokenStaysOwedAndGoesOutOnceALoginIsAccepted(t *testing.T) {
	h := newHarness(t)
	v := h.principal("helper", "@bot:example.org")
	srv := newFakeHomeserver("srv")
	h.enqueue(v, journal.EnqueueRequest{DeliveryID: "reply-1", Content: text("hello")})
	logged := &logbuf.Buffer{}
	a := h.spawn(v, srv, func(d *outbox.Deps) { d.Log = zerolog.New(logged) })
	const refusals = 3
	for i := range refusals {
		srv.next(h.ctx, t).fail(h.ctx, t, &journal.SendError{Status: 401, Err: errors.New("M_UNKNOWN_TOKEN")})
		// Polling the row until the actor has recorded the refusal.
		row := h.delivery(v, "reply-1", journal.StageFinal)
		for row.LastError == "" && h.ctx.Err() == nil {
			time.Sleep(time.Millisecond)
			row = h.delivery(v, "reply-1", journal.StageFinal)
		}
		if row.State != journal.DeliveryAttempted || !strings.Contains(row.LastError, "401") {
			t.Fatalf("after refusal %d the row is %v (%q), want it still owed with the refusal recorded", i+1, row.State, row.LastError)
		}
	}
	srv.next(h.ctx, t).accept(h.ctx, t)
	a.waitFor(outbox.Acknowledged, "reply-1", journal.StageFinal)
	a.stop()
	if got := len(srv.Visible()); got != 1 {
		t.Errorf("the room shows the reply %d times, want once", got)
	}
	if n := strings.Count(logged.String(), "refused the access token"); n != 1 {
		t.Errorf("the refusal was logged %d times, want once:\n%s", n, logged.String())
	}
}
