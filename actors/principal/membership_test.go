package principal

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

func TestTheMembershipAppliesALeaveAndItsEchoInOrder(t *testing.T) {
	ctx := context.Background()
	s, _ := testsupport.MustOpen(t)
	v, err := s.Principal(ctx, "helper", "@bot:example.org")
	if err != nil {
		t.Fatal(err)
	}
	room := "!room:example.org"
	if _, err := v.AdmitBatch(ctx, mx.Live(room, mx.Message("$a", "@alice:example.org", 1000, "hi")), ""); err != nil {
		t.Fatal(err)
	}
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
