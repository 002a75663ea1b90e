package principal

import (
	"context"
	"errors"
	"github.com/mindroomd/mindroomd/agent"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// viewWithMessage is a principal's view over an on-disk journal holding
// one pending message, $a, in the room it returns.
func viewWithMessage(t *testing.T) (journal.PrincipalStore, string) {
	t.Helper()
	s, _ := testsupport.MustOpen(t)
	v, err := s.Principal(context.Background(), "helper", "@bot:example.org")
	if err != nil {
		t.Fatal(err)
	}
	room := "!room:example.org"
	if _, err := v.AdmitBatch(context.Background(), mx.Live(room, mx.Message("$a", "@alice:example.org", 1000, "hi")), "s1"); err != nil {
		t.Fatal(err)
	}
	return v, room
}

func TestTheMembershipAppliesALeaveAndItsEchoInOrder(t *testing.T) {
	ctx := context.Background()
	v, room := viewWithMessage(t)
	m := &membership{store: v, log: zerolog.Nop()}
	for _, step := range []struct {
		source      journal.DepartureSource
		observation string
		want        journal.DepartureOutcome
	}{
		{journal.DepartureLocal, "leave-1", journal.Fenced},
		{journal.DepartureReported, "$leave", journal.OwedReportConsumed},
		{journal.DepartureReported, "$leave", journal.RepeatedReport},
	} {
		var o journal.DepartureOutcome
		err := m.locked(func() (err error) {
			o, err = m.fence(ctx, room, step.source, step.observation)
			return err
		})
		if err != nil || o != step.want {
			t.Fatalf("%+v: outcome %s err %v, want %s", step, o, err, step.want)
		}
	}
	p, err := v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: 10})
	if err != nil || len(p.Messages) != 0 {
		t.Fatalf("after the fence the room shows %d messages (err %v), want none", len(p.Messages), err)
	}
	if err := m.locked(func() error { return m.join(ctx, room, "$join") }); err != nil {
		t.Fatal(err)
	}
	if _, departed, err := v.RoomEpoch(ctx, room); err != nil || departed {
		t.Fatalf("after the join departed=%v err=%v, want back in the room", departed, err)
	}
	if n, err := m.retireOwed(ctx, room); err != nil || n != 0 {
		t.Fatalf("retired %d (err %v), want 0: the echo already consumed the report", n, err)
	}
}

func TestABackoffIsForgottenOnceItsEventIsNoLongerPending(t *testing.T) {
	ctx := context.Background()
	v, _ := viewWithMessage(t)
	failing := agent.AgentFunc(func(context.Context, agent.Turn) (agent.Reply, error) {
		return agent.Reply{}, errors.New("model unavailable")
	})
	a := &principalActor{deps: Deps{Store: v, Agent: failing, Now: time.Now, BackoffBase: time.Hour, BackoffMax: time.Hour},
		log: zerolog.Nop()}
	retries, reported := map[string]retry{}, map[int64]bool{}
	if _, err := a.offerBacklog(ctx, retries, reported); err != nil {
		t.Fatal(err)
	}
	if _, ok := retries["$a"]; !ok {
		t.Fatalf("after a failed turn the backoffs are %v, want one for $a", retries)
	}
	// Answered some other way (the API, an operator): no longer pending.
	if _, err := v.Settle(ctx, "$a"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.offerBacklog(ctx, retries, reported); err != nil {
		t.Fatal(err)
	}
	if len(retries) != 0 {
		t.Fatalf("after the event settled the worker still holds %v", retries)
	}
}
