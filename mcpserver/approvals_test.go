package mcpserver_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

type approvalOut struct {
	CallID         string   `json:"call_id"`
	EventID        string   `json:"event_id"`
	State          string   `json:"state"`
	Outcome        string   `json:"outcome"`
	CardDeliveryID string   `json:"card_delivery_id"`
	Approvers      []string `json:"approvers"`
	ExpiresAtMS    int64    `json:"expires_at_ms"`
}

type decisionOut struct {
	CallID          string          `json:"call_id"`
	EventID         string          `json:"event_id"`
	Tool            string          `json:"tool"`
	Arguments       json.RawMessage `json:"arguments"`
	Secret          []string        `json:"secret"`
	State           string          `json:"state"`
	DecidedBy       string          `json:"decided_by"`
	DecisionEventID string          `json:"decision_event_id"`
	TimedOut        bool            `json:"timed_out"`
	Context         json.RawMessage `json:"context"`
}

func TestMCPRequestApprovalAsksOnceAndPostsTheCard(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "mail bob the report"))
	cs := fx.overNetwork(t)
	args := map[string]any{"event_id": "$q", "call_id": "mail-1", "tool": "send_mail",
		"arguments": map[string]any{"to": "bob@example.org", "token": "s3cret", "attach": []any{"report.pdf"}},
		"secret":    []string{"token"}, "approvers": []string{"@bob:example.org"}, "expires_in_s": 600,
		"rendering": "Mail the report to Bob?"}
	first := ok[approvalOut](t, cs, "request_approval", args)
	if first.Outcome != "created" || first.State != "open" || first.CallID != "mail-1" || first.EventID != "$q" ||
		first.CardDeliveryID != journal.ApprovalDeliveryID("mail-1") ||
		!slices.Equal(first.Approvers, []string{"@bob:example.org"}) ||
		first.ExpiresAtMS != testsupport.DefaultNow.Add(10*time.Minute).UnixMilli() {
		t.Fatalf("request = %+v", first)
	}
	again := ok[approvalOut](t, cs, "request_approval", args)
	if again.Outcome != "replayed" || again.CardDeliveryID != first.CardDeliveryID {
		t.Fatalf("request again = %+v", again)
	}
	card, err := fx.alpha.Delivery(context.Background(), first.CardDeliveryID, journal.StageInitial)
	if err != nil || card.State != journal.DeliveryQueued || !strings.Contains(string(card.Content), "Mail the report to Bob?") ||
		strings.Contains(string(card.Content), "s3cret") {
		t.Fatalf("card %s (%v)", card.Content, err)
	}
	rows, err := fx.alpha.Unacknowledged(context.Background(), 10, nil)
	if err != nil || len(rows) != 1 {
		t.Fatalf("outbox holds %d rows (%v), want the one card", len(rows), err)
	}
	// Another call under the same ID, an event never admitted.
	other := map[string]any{"event_id": "$q", "call_id": "mail-1", "tool": "send_mail", "arguments": map[string]any{"to": "eve@example.org"}}
	fails(t, cs, "request_approval", other, "conflict", 409)
	other["event_id"], other["call_id"] = "$never", "mail-2"
	fails(t, cs, "request_approval", other, "not_found", 404)
	other["event_id"], other["approvers"] = "$q", []string{"bob"}
	fails(t, cs, "request_approval", other, "bad_request", 400)
}

func TestMCPWaitForDecisionReturnsTheDecision(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "deploy"))
	cs := fx.overNetwork(t)
	ok[approvalOut](t, cs, "request_approval", map[string]any{"event_id": "$q", "call_id": "deploy-1", "tool": "deploy",
		"arguments": map[string]any{"version": "1.2", "replicas": 3}, "context": map[string]any{"plan": "step 2 of 3"}})
	open := ok[decisionOut](t, cs, "wait_for_decision", map[string]any{"event_id": "$q", "call_id": "deploy-1", "wait_seconds": 0})
	if open.State != "open" || open.TimedOut || open.Tool != "deploy" || !strings.Contains(string(open.Arguments), `"replicas":3`) ||
		string(open.Context) != `{"plan":"step 2 of 3"}` {
		t.Fatalf("read = %+v, want the call and the context it was asked with", open)
	}
	waited := ok[decisionOut](t, cs, "wait_for_decision", map[string]any{"event_id": "$q", "call_id": "deploy-1", "wait_seconds": 1})
	if waited.State != "open" || !waited.TimedOut {
		t.Fatalf("a wait without a decision = %+v", waited)
	}
	// A wait is answered by the decision it waited for.
	done := make(chan decisionOut, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "wait_for_decision",
			Arguments: map[string]any{"event_id": "$q", "call_id": "deploy-1", "wait_seconds": 300}})
		var out decisionOut
		if err == nil && !res.IsError {
			b, _ := json.Marshal(res.StructuredContent)
			_ = json.Unmarshal(b, &out)
		}
		done <- out
	}()
	time.Sleep(100 * time.Millisecond)
	if _, decided, err := fx.alpha.DecideApproval(context.Background(), "deploy-1", journal.ApprovalDecision{
		State: journal.ApprovalApproved, By: alice, EventID: "$yes"}); err != nil || !decided {
		t.Fatalf("decide = %v, %v", decided, err)
	}
	select {
	case got := <-done:
		if got.State != "approved" || got.DecidedBy != alice || got.DecisionEventID != "$yes" || got.TimedOut {
			t.Fatalf("the wait = %+v", got)
		}
	case <-time.After(testTimeout):
		t.Fatal("the wait did not end with the decision")
	}
	fails(t, cs, "wait_for_decision", map[string]any{"event_id": "$q", "call_id": "deploy-2"}, "not_found", 404)
	fails(t, cs, "wait_for_decision", map[string]any{"event_id": "$other", "call_id": "deploy-1"}, "not_found", 404)
}

func TestMCPApprovalArgumentsOfTheWrongTypeReachNoRoute(t *testing.T) {
	fx := newFixture(t)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "deploy"))
	cs := fx.overNetwork(t)
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"request_approval", map[string]any{"event_id": "$q", "call_id": "c", "tool": "t"}},
		{"request_approval", map[string]any{"event_id": "$q", "call_id": "c", "tool": "t", "arguments": []any{1}}},
		{"request_approval", map[string]any{"event_id": "$q", "call_id": "c", "tool": "t", "arguments": "{}"}},
		{"request_approval", map[string]any{"event_id": "$q", "call_id": "c", "tool": "t", "arguments": map[string]any{}, "expires_in_s": 0}},
		{"request_approval", map[string]any{"event_id": "$q", "call_id": "c", "tool": "t", "arguments": map[string]any{}, "expires_in_s": 604801}},
		{"request_approval", map[string]any{"event_id": "$q", "call_id": "c", "tool": "t", "arguments": map[string]any{}, "approvers": "@bob:example.org"}},
		{"wait_for_decision", map[string]any{"event_id": "$q", "call_id": "c", "wait_seconds": 301}},
		{"wait_for_decision", map[string]any{"event_id": "$q"}},
	} {
		if res := call(t, cs, tc.tool, tc.args); !res.IsError {
			t.Errorf("%s(%v) succeeded: %s", tc.tool, tc.args, text(res))
		}
	}
	if fx.called("/approvals") || fx.called("/c") {
		t.Fatalf("a refused argument reached the API: %v", fx.calls)
	}
}
