package fence_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/fence"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// requestTimeout bounds each request; a fence is one small transaction.
const requestTimeout = 30 * time.Second

func TestTheActorAppliesALeaveAndItsEchoInOrder(t *testing.T) {
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
	system := actors.NewSystem(zerolog.Nop())
	pid := system.Root.Spawn(fence.Props(fence.Deps{Membership: v, Log: zerolog.Nop()}))
	defer system.Root.Stop(pid)

	ask := func(msg any) any {
		t.Helper()
		r, err := system.Root.RequestFuture(pid, msg, requestTimeout).Result()
		if err != nil {
			t.Fatalf("request %T: %v", msg, err)
		}
		return r
	}
	for _, step := range []struct {
		msg  *fence.FenceDeparture
		want journal.DepartureOutcome
	}{
		{&fence.FenceDeparture{RoomID: room, Source: journal.DepartureLocal, ObservationID: "leave-1"}, journal.Fenced},
		{&fence.FenceDeparture{RoomID: room, Source: journal.DepartureReported, ObservationID: "$leave"}, journal.OwedReportConsumed},
		{&fence.FenceDeparture{RoomID: room, Source: journal.DepartureReported, ObservationID: "$leave"}, journal.RepeatedReport},
	} {
		r := ask(step.msg).(*fence.DepartureFenced)
		if r.Err != nil || r.Outcome != step.want {
			t.Fatalf("%+v: outcome %s err %v, want %s", step.msg, r.Outcome, r.Err, step.want)
		}
	}
	p, err := v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: 10})
	if err != nil || len(p.Messages) != 0 {
		t.Fatalf("after the fence the room shows %d messages (err %v), want none", len(p.Messages), err)
	}
	if r := ask(&fence.RecordJoin{RoomID: room, ObservationID: "$join"}).(*fence.JoinRecorded); r.Err != nil {
		t.Fatal(r.Err)
	}
	if _, departed, err := v.RoomEpoch(ctx, room); err != nil || departed {
		t.Fatalf("after the join departed=%v err=%v, want back in the room", departed, err)
	}
	if r := ask(&fence.RetireOwedReports{RoomIDs: []string{room}}).(*fence.OwedReportsRetired); r.Err != nil || r.Retired != 0 {
		t.Fatalf("retired %d (err %v), want 0: the echo already consumed the report", r.Retired, r.Err)
	}
}
