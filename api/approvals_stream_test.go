package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// nextApproval reads the stream up to its next approval event.
func nextApproval(t *testing.T, rd *bufio.Reader) map[string]any {
	t.Helper()
	for {
		ev := readSSE(t, rd)
		if ev.event != "approval" {
			continue
		}
		if ev.id != "" {
			t.Fatalf("an approval event carries the ID %q: the stream's one cursor is the pending position", ev.id)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(ev.data), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestTheStreamCarriesEachDecisionOfAPendingTurnAndAgainOnReconnect(t *testing.T) {
	fx := newFixture(t, func(d *api.Deps) { d.Heartbeat = time.Hour })
	fx.admit(t, room, mx.Message("$q", alice, 1000, "mail bob"), mx.Message("$r", alice, 1001, "and carol"),
		mx.Message("$s", alice, 1002, "and dan"))
	ctx := context.Background()
	for call, ev := range map[string]string{"c1": "$q", "c2": "$r", "c3": "$s"} {
		if _, _, err := fx.alpha.RequestApproval(ctx, journal.ApprovalRequest{EventID: ev, CallID: call, Tool: "send_mail",
			Arguments: json.RawMessage(`{}`), ExpiresMS: time.Now().Add(time.Hour).UnixMilli()}, journal.DefaultApprovalKeys); err != nil {
			t.Fatal(err)
		}
	}
	open := func() *bufio.Reader {
		resp := fx.send(t, http.MethodGet, "/v1/agents/alpha/pending/stream", alphaToken, nil, nil)
		t.Cleanup(func() { resp.Body.Close() })
		return bufio.NewReader(resp.Body)
	}
	rd := open()
	if _, _, err := fx.alpha.DecideApproval(ctx, "c1", journal.ApprovalDecision{State: journal.ApprovalApproved, By: alice}); err != nil {
		t.Fatal(err)
	}
	if got := nextApproval(t, rd); got["call_id"] != "c1" || got["state"] != "approved" || got["decided_by"] != alice {
		t.Fatalf("the stream's approval = %v", got)
	}
	// The other turn is answered before its decision: its decision is of no
	// turn still pending, and is not sent.
	if _, err := fx.alpha.Settle(ctx, "$r"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fx.alpha.DecideApproval(ctx, "c2", journal.ApprovalDecision{State: journal.ApprovalDenied, By: alice}); err != nil {
		t.Fatal(err)
	}
	again := open()
	if got := nextApproval(t, again); got["call_id"] != "c1" {
		t.Fatalf("on reconnect the stream's approval = %v, want c1 again", got)
	}
	if _, _, err := fx.alpha.DecideApproval(ctx, "c3", journal.ApprovalDecision{State: journal.ApprovalExpired}); err != nil {
		t.Fatal(err)
	}
	if got := nextApproval(t, again); got["call_id"] != "c3" || got["state"] != "expired" {
		t.Fatalf("the next approval = %v, want c3 expired: c2's turn is no longer pending", got)
	}
}
