package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// newApprovalFuzzAPI is alpha's API over a real journal, on the journal's
// own clock, so an expiry means the same to both.
func newApprovalFuzzAPI(tb testing.TB) *fuzzAPI {
	tb.Helper()
	st, _ := testsupport.MustOpen(tb)
	alpha, err := st.Principal(context.Background(), "alpha", "@alpha:example.org")
	if err != nil {
		tb.Fatalf("principal: %v", err)
	}
	fx := &fuzzAPI{alpha: alpha, empty: make(chan struct{}, 1), left: make(chan string, 1), hs: newFakeHomeserver()}
	fx.handler = api.New(api.Deps{
		Agents:    map[string]api.Agent{"alpha": {Store: alpha, Token: alphaToken, Hints: st.Hints()}},
		Log:       zerolog.Nop(),
		CursorKey: []byte("fuzz cursor key"),
		Heartbeat: time.Hour,
		Now:       func() time.Time { return testsupport.DefaultNow },
	})
	return fx
}

// approvalState is what an approval request may change: the outbox, the
// approvals of eventID and the approval of callID.
func (fx *fuzzAPI) approvalState(t *testing.T, eventID, callID string) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	b.WriteString(fx.outboxState(t))
	list, err := fx.alpha.ApprovalsForEvent(ctx, eventID)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range list {
		fmt.Fprintf(&b, "approval %s %s %s %s\n", a.CallID, a.CallHash, a.State, a.Arguments)
	}
	if a, card, found, err := fx.alpha.Approval(ctx, callID); err != nil {
		t.Fatal(err)
	} else if found {
		fmt.Fprintf(&b, "call %s %s %s %s %s\n", a.CallID, a.EventID, a.CallHash, a.State, card)
	}
	return b.String()
}

// FuzzApprovalRequest posts fuzzed approval requests for a fuzzed event
// (seeded with one pending, one settled and one never admitted). A request
// taken is exactly one approval under its call ID, for that event, with
// its card queued, or the recorded one replayed with nothing changed; the
// same request again is replayed, and the call is read back by its ID. A
// refused one stores and queues nothing.
func FuzzApprovalRequest(f *testing.F) {
	in := testsupport.DefaultNow.Add(time.Hour).UnixMilli()
	for _, seed := range []struct{ event, body string }{
		{"$fz.ask", `{"call_id":"c1","tool":"send_mail","arguments":{"to":"bob@example.org"}}`},
		{"$fz.ask", `{"call_id":"c2","tool":"send_mail","arguments":{"to":"bob@example.org","token":"x"},"secret":["token"],"approvers":["@bob:example.org"],"expires_in_s":60,"rendering":"Mail bob?"}`},
		{"$fz.ask", fmt.Sprintf(`{"call_id":"c3","tool":"deploy","arguments":{},"expires_at_ms":%d}`, in)},
		{"$fz.ask", `{"call_id":"c1","tool":"send_mail","arguments":{"to":"eve@example.org"}}`},
		{"$fz.ask", `{"call_id":"c4","tool":"t","arguments":[1]}`},
		{"$fz.ask", `{"call_id":"c5","tool":"t","arguments":{"a":1,"a":2}}`},
		{"$fz.ask", `{"call_id":"c6","tool":"t","arguments":{},"approvers":["bob"]}`},
		{"$fz.ask", `{"call_id":"c7","tool":"t","arguments":{},"expires_in_s":604801}`},
		{"$fz.ask", `{"call_id":"c8","tool":"t","arguments":{},"expires_at_ms":1}`},
		{"$fz.ask", `{"call_id":"","tool":"t","arguments":{}}`},
		{"$fz.ask", `{"call_id":"c9","tool":"a b","arguments":{}}`},
		{"$fz.ask", `{"call_id":"c10","tool":"t","arguments":{},"extra":1}`},
		{"$fz.ask", `{"call_id":"c11","tool":"t","arguments":{"` + strings.Repeat("n", api.MaxReplyBytes-100) + `":1}}`},
		{"$fz.done", `{"call_id":"c12","tool":"t","arguments":{}}`},
		{"$nope", `{"call_id":"c13","tool":"t","arguments":{}}`},
		{"fz.ask", `{"call_id":"c14","tool":"t","arguments":{}}`},
	} {
		f.Add(seed.event, []byte(seed.body))
	}
	fx := newApprovalFuzzAPI(f)
	fx.admit(f, mx.Message("$fz.ask", alice, 999, "ask"), mx.Message("$fz.done", alice, 998, "done"))
	if _, err := fx.alpha.Settle(context.Background(), "$fz.done"); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, event string, body []byte) {
		if !routable(event) {
			return
		}
		ctx := context.Background()
		path := "/v1/agents/alpha/events/" + url.PathEscape(event) + "/approvals"
		var probe struct {
			CallID string `json:"call_id"`
		}
		_ = json.Unmarshal(body, &probe)
		before := fx.approvalState(t, event, probe.CallID)
		rec := serveRequest(fx, fuzzRequest(ctx, t, "POST", path, body))
		checkAnswer(t, rec)
		if rec.Code != http.StatusOK {
			if after := fx.approvalState(t, event, probe.CallID); after != before {
				t.Fatalf("a request refused with %d changed the ledger:\n%s\nto\n%s", rec.Code, before, after)
			}
			return
		}
		got := decode[approvalCreatedBody](t, rec.Body.Bytes())
		if got.CallID != probe.CallID || got.EventID != event || got.CardDeliveryID != journal.ApprovalDeliveryID(got.CallID) {
			t.Fatalf("answer %s for call %q of %q", rec.Body.Bytes(), probe.CallID, event)
		}
		after := fx.approvalState(t, event, got.CallID)
		a, _, found, err := fx.alpha.Approval(ctx, got.CallID)
		if err != nil || !found || a.EventID != event {
			t.Fatalf("the approval taken is not stored for %q: %+v %v %v", event, a, found, err)
		}
		switch got.Outcome {
		case "created":
			if strings.Contains(before, "call "+got.CallID+" ") {
				t.Fatalf("created a call already recorded:\n%s", before)
			}
			if strings.Count(after, got.CardDeliveryID+" ") != 1 || strings.Count(before, got.CardDeliveryID+" ") != 0 ||
				strings.Count(after, "\n") != strings.Count(before, "\n")+3 {
				t.Fatalf("a created approval is not one approval and its card:\n%s\nwas\n%s", after, before)
			}
			card, err := fx.alpha.Delivery(ctx, got.CardDeliveryID, journal.StageInitial)
			if err != nil || card.State != journal.DeliveryQueued {
				t.Fatalf("the card = %+v, %v; want queued", card, err)
			}
			if got.State != "open" {
				t.Fatalf("a created approval is %s", got.State)
			}
		case "replayed":
			if after != before {
				t.Fatalf("a replay changed the ledger:\n%s\nwas\n%s", after, before)
			}
		default:
			t.Fatalf("outcome %q", got.Outcome)
		}
		// The same request again is the recorded one.
		rec2 := serveRequest(fx, fuzzRequest(ctx, t, "POST", path, body))
		if rec2.Code != http.StatusOK || decode[approvalCreatedBody](t, rec2.Body.Bytes()).Outcome != "replayed" {
			t.Fatalf("the same request again: %d %s", rec2.Code, rec2.Body.Bytes())
		}
		// Every call taken can be read back by its ID.
		rec3 := serveRequest(fx, fuzzRequest(ctx, t, "GET", path+"/"+url.PathEscape(got.CallID), nil))
		if rec3.Code != http.StatusOK || decode[approvalBody](t, rec3.Body.Bytes()).CallID != got.CallID {
			t.Fatalf("the read of %q: %d %s", got.CallID, rec3.Code, rec3.Body.Bytes())
		}
	})
}
