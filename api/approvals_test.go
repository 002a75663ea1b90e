package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// approvalSignal tells a test each time the API read an approval and found
// it open, so a test can decide it while a long-poll waits.
type approvalSignal struct {
	journal.PrincipalStore
	open chan struct{}
}

func (s *approvalSignal) Approval(ctx context.Context, callID string) (journal.Approval, string, bool, error) {
	a, card, found, err := s.PrincipalStore.Approval(ctx, callID)
	if err == nil && found && a.State == journal.ApprovalOpen {
		select {
		case s.open <- struct{}{}:
		default:
		}
	}
	return a, card, found, err
}

// newApprovalFixture is the API on the journal's own clock, with alpha's
// approval reads signalled on the returned channel.
func newApprovalFixture(t *testing.T, tune func(*api.Deps)) (*fixture, chan struct{}) {
	t.Helper()
	open := make(chan struct{}, 1)
	fx := newFixture(t, func(d *api.Deps) {
		d.Now = func() time.Time { return testsupport.DefaultNow }
		a := d.Agents["alpha"]
		a.Store = &approvalSignal{PrincipalStore: a.Store, open: open}
		d.Agents["alpha"] = a
		if tune != nil {
			tune(d)
		}
	})
	return fx, open
}

type approvalCreatedBody struct {
	CallID         string   `json:"call_id"`
	EventID        string   `json:"event_id"`
	State          string   `json:"state"`
	Outcome        string   `json:"outcome"`
	CardDeliveryID string   `json:"card_delivery_id"`
	Approvers      []string `json:"approvers"`
	ExpiresAtMS    int64    `json:"expires_at_ms"`
}

type approvalBody struct {
	CallID          string          `json:"call_id"`
	EventID         string          `json:"event_id"`
	RoomID          string          `json:"room_id"`
	Tool            string          `json:"tool"`
	Arguments       json.RawMessage `json:"arguments"`
	Secret          []string        `json:"secret"`
	Approvers       []string        `json:"approvers"`
	State           string          `json:"state"`
	DecidedBy       string          `json:"decided_by"`
	DecisionEventID string          `json:"decision_event_id"`
	DecidedAtMS     int64           `json:"decided_at_ms"`
	Reason          string          `json:"reason"`
	CardEventID     string          `json:"card_event_id"`
	CreatedAtMS     int64           `json:"created_at_ms"`
	ExpiresAtMS     int64           `json:"expires_at_ms"`
	TimedOut        bool            `json:"timed_out"`
}

const mailCall = `{"call_id":"c1","tool":"send_mail","arguments":{"to":"bob@example.org","token":"s3cret"},"secret":["token"]}`

func approvalsPath(eventID string) string {
	return "/v1/agents/alpha/events/" + url.PathEscape(eventID) + "/approvals"
}

func (fx *fixture) askApproval(t *testing.T, eventID, body string) (int, []byte) {
	t.Helper()
	return fx.do(t, "POST", approvalsPath(eventID), alphaToken, strings.NewReader(body))
}

// ledger is what an approval request may change: alpha's approvals of the
// events named and its outbox.
func (fx *fixture) ledger(t *testing.T, events ...string) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	for _, id := range events {
		list, err := fx.alpha.ApprovalsForEvent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range list {
			fmt.Fprintf(&b, "approval %s %s %s %s %s\n", id, a.CallID, a.Tool, a.Arguments, a.State)
		}
	}
	rows, err := fx.alpha.Unacknowledged(ctx, 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range rows {
		fmt.Fprintf(&b, "outbox %s %d %s\n", d.DeliveryID, d.State, d.Content)
	}
	return b.String()
}

func TestAnApprovalRequestIsStoredWithItsCardAndReplayedByCallID(t *testing.T) {
	fx, _ := newApprovalFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "mail bob"))
	status, b := fx.askApproval(t, "$q", mailCall)
	if status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	got := decode[approvalCreatedBody](t, b)
	want := approvalCreatedBody{CallID: "c1", EventID: "$q", State: "open", Outcome: "created",
		CardDeliveryID: journal.ApprovalDeliveryID("c1"), Approvers: []string{alice},
		ExpiresAtMS: testsupport.DefaultNow.Add(api.DefaultApprovalExpiry).UnixMilli()}
	if !equalCreated(got, want) {
		t.Fatalf("created = %+v, want %+v", got, want)
	}
	card, err := fx.alpha.Delivery(context.Background(), got.CardDeliveryID, journal.StageInitial)
	if err != nil || card.State != journal.DeliveryQueued || card.RoomID != room {
		t.Fatalf("card = %+v, %v; want queued in the room", card, err)
	}
	c := decode[map[string]any](t, card.Content)
	if c["msgtype"] != "m.notice" || !strings.Contains(c["body"].(string), "send_mail") ||
		strings.Contains(string(card.Content), "s3cret") || c[journal.ApprovalKey] == nil {
		t.Fatalf("card content = %s", card.Content)
	}
	before := fx.ledger(t, "$q")

	// The same call spelled otherwise, with another expiry: the recorded
	// request, nothing new queued.
	status, b = fx.askApproval(t, "$q", `{"tool":"send_mail","call_id":"c1","expires_in_s":60,
		"arguments":{"token":"s3cret", "to":"bob@example.org"}}`)
	if status != http.StatusOK {
		t.Fatalf("replay status = %d: %s", status, b)
	}
	want.Outcome = "replayed"
	if again := decode[approvalCreatedBody](t, b); !equalCreated(again, want) {
		t.Fatalf("replayed = %+v, want %+v", again, want)
	}
	if after := fx.ledger(t, "$q"); after != before {
		t.Fatalf("a replay changed the ledger:\n%s\nwas\n%s", after, before)
	}

	status, b = fx.do(t, "GET", approvalsPath("$q")+"/c1", alphaToken, nil)
	if status != http.StatusOK {
		t.Fatalf("read = %d: %s", status, b)
	}
	read := decode[approvalBody](t, b)
	if read.CallID != "c1" || read.EventID != "$q" || read.RoomID != room || read.Tool != "send_mail" ||
		read.State != "open" || read.DecidedBy != "" || read.CardEventID != "" || read.TimedOut ||
		!slices.Equal(read.Secret, []string{"token"}) || !slices.Equal(read.Approvers, []string{alice}) ||
		read.ExpiresAtMS != want.ExpiresAtMS || read.CreatedAtMS != testsupport.DefaultNow.UnixMilli() {
		t.Fatalf("read = %s", b)
	}
	if same, _ := jsonEqual(read.Arguments, []byte(`{"to":"bob@example.org","token":"s3cret"}`)); !same {
		t.Fatalf("arguments = %s", read.Arguments)
	}
	// The turn waits for the agent: asking settles nothing.
	if got, want := fx.pendingIDs(t), []string{"$q"}; !slices.Equal(got, want) {
		t.Fatalf("pending = %v, want %v", got, want)
	}
	// Once the event is answered, the recorded request is still replayed.
	if status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$q/reply", alphaToken, replyJSON("sent")); status != http.StatusOK {
		t.Fatalf("reply = %d: %s", status, b)
	}
	if status, b := fx.askApproval(t, "$q", mailCall); status != http.StatusOK || decode[approvalCreatedBody](t, b).Outcome != "replayed" {
		t.Fatalf("replay after the answer = %d: %s", status, b)
	}
}

func equalCreated(a, b approvalCreatedBody) bool {
	return a.CallID == b.CallID && a.EventID == b.EventID && a.State == b.State && a.Outcome == b.Outcome &&
		a.CardDeliveryID == b.CardDeliveryID && slices.Equal(a.Approvers, b.Approvers) && a.ExpiresAtMS == b.ExpiresAtMS
}

func jsonEqual(a, b []byte) (bool, error) {
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		return false, err
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		return false, err
	}
	ja, _ := json.Marshal(va)
	jb, _ := json.Marshal(vb)
	return bytes.Equal(ja, jb), nil
}

func TestAnApprovalNamesItsApproversAndExpiry(t *testing.T) {
	fx, _ := newApprovalFixture(t, func(d *api.Deps) {
		a := d.Agents["alpha"]
		a.ApprovalKeys = journal.ApprovalKeys{Approve: "👍", Deny: "👎"}
		d.Agents["alpha"] = a
	})
	fx.admit(t, room, mx.Message("$q", alice, 1000, "deploy"))
	at := testsupport.DefaultNow.Add(24 * time.Hour).UnixMilli()
	status, b := fx.askApproval(t, "$q", fmt.Sprintf(`{"call_id":"deploy-1","tool":"deploy","arguments":{},
		"approvers":["@bob:example.org","@carol:example.org"],"expires_at_ms":%d,"rendering":"Ship release 1.2?"}`, at))
	if status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	got := decode[approvalCreatedBody](t, b)
	if !slices.Equal(got.Approvers, []string{"@bob:example.org", "@carol:example.org"}) || got.ExpiresAtMS != at {
		t.Fatalf("created = %+v", got)
	}
	card, err := fx.alpha.Delivery(context.Background(), got.CardDeliveryID, journal.StageInitial)
	if err != nil {
		t.Fatal(err)
	}
	body := decode[map[string]any](t, card.Content)["body"].(string)
	for _, want := range []string{"Ship release 1.2?", "@bob:example.org, @carol:example.org", "👍", "👎", "(no arguments)"} {
		if !strings.Contains(body, want) {
			t.Fatalf("card body %q does not hold %q", body, want)
		}
	}
	// At the end of the window, exactly.
	status, b = fx.askApproval(t, "$q", `{"call_id":"deploy-2","tool":"deploy","arguments":{},"expires_in_s":604800}`)
	if status != http.StatusOK || decode[approvalCreatedBody](t, b).ExpiresAtMS != testsupport.DefaultNow.Add(journal.MaxApprovalWindow).UnixMilli() {
		t.Fatalf("a 7-day expiry = %d: %s", status, b)
	}
}

func TestAnotherCallUnderTheSameCallIDConflicts(t *testing.T) {
	fx, _ := newApprovalFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "mail bob"), mx.Message("$r", alice, 1001, "and carol"))
	if status, b := fx.askApproval(t, "$q", mailCall); status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	before := fx.ledger(t, "$q", "$r")
	for what, req := range map[string]struct{ event, body string }{
		"other arguments": {"$q", `{"call_id":"c1","tool":"send_mail","arguments":{"to":"eve@example.org"}}`},
		"another tool":    {"$q", `{"call_id":"c1","tool":"delete_mail","arguments":{"to":"bob@example.org","token":"s3cret"}}`},
		"another event":   {"$r", mailCall},
	} {
		status, b := fx.askApproval(t, req.event, req.body)
		wantError(t, status, b, http.StatusConflict, "conflict")
		if after := fx.ledger(t, "$q", "$r"); after != before {
			t.Fatalf("%s changed the ledger:\n%s\nwas\n%s", what, after, before)
		}
	}
}

func TestAnApprovalForAnEventNeverAdmittedIsNotFound(t *testing.T) {
	fx, _ := newApprovalFixture(t, nil)
	status, b := fx.askApproval(t, "$never", mailCall)
	wantError(t, status, b, http.StatusNotFound, "not_found")
	if got := fx.ledger(t, "$never"); got != "" {
		t.Fatalf("a refused request stored %s", got)
	}
	status, b = fx.do(t, "GET", approvalsPath("$never"), alphaToken, nil)
	wantError(t, status, b, http.StatusNotFound, "not_found")
}

func TestAnApprovalForAnEventNoLongerPendingConflicts(t *testing.T) {
	fx, _ := newApprovalFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "noise"), mx.Message("$r", alice, 1001, "mail bob"))
	if status, b := fx.do(t, "POST", "/v1/agents/alpha/events/$q/ignore", alphaToken, nil); status != http.StatusOK {
		t.Fatalf("ignore = %d: %s", status, b)
	}
	status, b := fx.askApproval(t, "$q", mailCall)
	wantError(t, status, b, http.StatusConflict, "conflict")
	// The agent left the room: nothing it asks there may be shown.
	if _, err := fx.alpha.FenceDeparture(context.Background(), room, journal.DepartureRemoved, "kick-1"); err != nil {
		t.Fatal(err)
	}
	status, b = fx.askApproval(t, "$r", strings.Replace(mailCall, `"c1"`, `"c2"`, 1))
	wantError(t, status, b, http.StatusConflict, "conflict")
	if got := fx.ledger(t, "$q", "$r"); got != "" {
		t.Fatalf("refused requests stored %s", got)
	}
}

func TestAMalformedApprovalRequestIsRefusedAndStoresNothing(t *testing.T) {
	fx, _ := newApprovalFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "mail bob"))
	now := testsupport.DefaultNow
	approvers := make([]string, journal.MaxApprovers+1)
	for i := range approvers {
		approvers[i] = fmt.Sprintf("@u%d:example.org", i)
	}
	many, _ := json.Marshal(approvers)
	for what, body := range map[string]string{
		"not JSON":                  `{"call_id":`,
		"an array":                  `[]`,
		"an unknown field":          `{"call_id":"c1","tool":"t","arguments":{},"colour":"red"}`,
		"trailing data":             `{"call_id":"c1","tool":"t","arguments":{}} {}`,
		"no arguments":              `{"call_id":"c1","tool":"t"}`,
		"null arguments":            `{"call_id":"c1","tool":"t","arguments":null}`,
		"arguments an array":        `{"call_id":"c1","tool":"t","arguments":[1,2]}`,
		"arguments a string":        `{"call_id":"c1","tool":"t","arguments":"{}"}`,
		"arguments repeating a key": `{"call_id":"c1","tool":"t","arguments":{"a":1,"a":2}}`,
		"no call_id":                `{"tool":"t","arguments":{}}`,
		"a call_id too long":        `{"call_id":"` + strings.Repeat("c", journal.MaxCallIDBytes+1) + `","tool":"t","arguments":{}}`,
		"a call_id with a control":  `{"call_id":"c\u0001","tool":"t","arguments":{}}`,
		"a call_id of dots":         `{"call_id":"..","tool":"t","arguments":{}}`,
		"no tool":                   `{"call_id":"c1","arguments":{}}`,
		"a tool with a space":       `{"call_id":"c1","tool":"send mail","arguments":{}}`,
		"a tool too long":           `{"call_id":"c1","tool":"` + strings.Repeat("t", journal.MaxToolBytes+1) + `","arguments":{}}`,
		"an approver not a user":    `{"call_id":"c1","tool":"t","arguments":{},"approvers":["bob"]}`,
		"an approver a room":        `{"call_id":"c1","tool":"t","arguments":{},"approvers":["!r:example.org"]}`,
		"too many approvers":        `{"call_id":"c1","tool":"t","arguments":{},"approvers":` + string(many) + `}`,
		"an expiry in the past":     fmt.Sprintf(`{"call_id":"c1","tool":"t","arguments":{},"expires_at_ms":%d}`, now.UnixMilli()-1),
		"an expiry now":             fmt.Sprintf(`{"call_id":"c1","tool":"t","arguments":{},"expires_at_ms":%d}`, now.UnixMilli()),
		"an expiry past 7 days":     fmt.Sprintf(`{"call_id":"c1","tool":"t","arguments":{},"expires_at_ms":%d}`, now.Add(journal.MaxApprovalWindow).UnixMilli()+1),
		"expires_in_s 0":            `{"call_id":"c1","tool":"t","arguments":{},"expires_in_s":0}`,
		"expires_in_s negative":     `{"call_id":"c1","tool":"t","arguments":{},"expires_in_s":-5}`,
		"expires_in_s past 7 days":  `{"call_id":"c1","tool":"t","arguments":{},"expires_in_s":604801}`,
		"expires_in_s huge":         `{"call_id":"c1","tool":"t","arguments":{},"expires_in_s":9223372036854775807}`,
		"expires_in_s a fraction":   `{"call_id":"c1","tool":"t","arguments":{},"expires_in_s":1.5}`,
		"both expiries":             fmt.Sprintf(`{"call_id":"c1","tool":"t","arguments":{},"expires_in_s":60,"expires_at_ms":%d}`, now.Add(time.Hour).UnixMilli()),
		"a rendering too long":      `{"call_id":"c1","tool":"t","arguments":{},"rendering":"` + strings.Repeat("r", journal.MaxRenderingBytes+1) + `"}`,
		// Within the body's cap, but the card adds its own words to the
		// argument's name.
		"a card too large": `{"call_id":"c1","tool":"t","arguments":{"` + strings.Repeat("n", api.MaxReplyBytes-100) + `":1}}`,
	} {
		status, b := fx.askApproval(t, "$q", body)
		if status != http.StatusBadRequest {
			t.Fatalf("%s: status %d (%s), want 400", what, status, b)
		}
		wantError(t, status, b, http.StatusBadRequest, "bad_request")
		if what == "a card too large" && !strings.Contains(decode[apiError](t, b).Error.Message, "card") {
			t.Fatalf("%s: refused for another reason: %s", what, b)
		}
	}
	status, b := fx.do(t, "POST", "/v1/agents/alpha/events/not-an-event/approvals", alphaToken, strings.NewReader(mailCall))
	wantError(t, status, b, http.StatusBadRequest, "bad_request")
	status, b = fx.askApproval(t, "$q", `{"call_id":"c1","tool":"t","arguments":{"a":"`+strings.Repeat("x", api.MaxReplyBytes)+`"}}`)
	wantError(t, status, b, http.StatusRequestEntityTooLarge, "payload_too_large")
	if got := fx.ledger(t, "$q"); got != "" {
		t.Fatalf("refused requests stored %s", got)
	}
}

func TestTheApprovalLongPollIsAnsweredByTheDecision(t *testing.T) {
	fx, open := newApprovalFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "mail bob"))
	if status, b := fx.askApproval(t, "$q", mailCall); status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	// Drained: the request's own read is not the wait's.
	select {
	case <-open:
	default:
	}
	type result struct {
		status int
		body   []byte
	}
	done := make(chan result, 1)
	go func() {
		// Errors are reported through the result: t.Fatal may not run here.
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", fx.srv.URL+approvalsPath("$q")+"/c1?wait=300", nil)
		req.Header.Set("Authorization", "Bearer "+alphaToken)
		resp, err := fx.srv.Client().Do(req)
		if err != nil {
			done <- result{body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- result{resp.StatusCode, b}
	}()
	// The poll has read the approval open and is waiting.
	<-open
	select {
	case res := <-done:
		t.Fatalf("the poll answered before the decision: %d %s", res.status, res.body)
	default:
	}
	if _, decided, err := fx.alpha.DecideApproval(context.Background(), "c1", journal.ApprovalDecision{
		State: journal.ApprovalApproved, By: alice, EventID: "$yes"}); err != nil || !decided {
		t.Fatalf("decide = %v, %v", decided, err)
	}
	res := <-done
	if res.status != http.StatusOK {
		t.Fatalf("status = %d: %s", res.status, res.body)
	}
	got := decode[approvalBody](t, res.body)
	if got.State != "approved" || got.DecidedBy != alice || got.DecisionEventID != "$yes" || got.TimedOut ||
		got.DecidedAtMS != testsupport.DefaultNow.UnixMilli() {
		t.Fatalf("woken poll = %s", res.body)
	}
	// Decided, a wait answers at once; the request replays the decision.
	status, b := fx.do(t, "GET", approvalsPath("$q")+"/c1?wait=300", alphaToken, nil)
	if status != http.StatusOK || decode[approvalBody](t, b).State != "approved" {
		t.Fatalf("read after the decision = %d: %s", status, b)
	}
	if status, b := fx.askApproval(t, "$q", mailCall); status != http.StatusOK || decode[approvalCreatedBody](t, b).State != "approved" {
		t.Fatalf("replay after the decision = %d: %s", status, b)
	}
}

func TestTheApprovalLongPollTimesOutStillOpen(t *testing.T) {
	fx, _ := newApprovalFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "mail bob"))
	if status, b := fx.askApproval(t, "$q", mailCall); status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	// Other commits wake the poll; it answers only for a decision or the end
	// of the wait.
	fx.admit(t, room, mx.Message("$other", alice, 1001, "unrelated"))
	status, b := fx.do(t, "GET", approvalsPath("$q")+"/c1?wait=50ms", alphaToken, nil)
	if status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	if got := decode[approvalBody](t, b); got.State != "open" || !got.TimedOut {
		t.Fatalf("timed-out poll = %s", b)
	}
	if got := decode[approvalBody](t, fx.mustGet(t, approvalsPath("$q")+"/c1")); got.TimedOut {
		t.Fatalf("a read without wait timed out")
	}
}

func (fx *fixture) mustGet(t *testing.T, path string) []byte {
	t.Helper()
	status, b := fx.do(t, "GET", path, alphaToken, nil)
	if status != http.StatusOK {
		t.Fatalf("GET %s = %d: %s", path, status, b)
	}
	return b
}

func TestAnApprovalIsReadOnlyUnderItsOwnEventAndPrincipal(t *testing.T) {
	fx, _ := newApprovalFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "mail bob"), mx.Message("$r", alice, 1001, "other"))
	if status, b := fx.askApproval(t, "$q", mailCall); status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	for _, path := range []string{approvalsPath("$r") + "/c1", approvalsPath("$q") + "/c2", approvalsPath("$never") + "/c1"} {
		status, b := fx.do(t, "GET", path, alphaToken, nil)
		wantError(t, status, b, http.StatusNotFound, "not_found")
	}
	// Beta, on its own routes, never sees alpha's approval.
	status, b := fx.do(t, "GET", "/v1/agents/beta/events/$q/approvals/c1", betaToken, nil)
	wantError(t, status, b, http.StatusNotFound, "not_found")
	status, b = fx.do(t, "GET", approvalsPath("$q")+"/c1", betaToken, nil)
	wantError(t, status, b, http.StatusForbidden, "forbidden")
	for _, path := range []string{
		approvalsPath("$q") + "/c1?wait=301", approvalsPath("$q") + "/c1?wait=soon",
		approvalsPath("$q") + "/" + strings.Repeat("c", journal.MaxCallIDBytes+1),
		approvalsPath("$q") + "/c%01", "/v1/agents/alpha/events/q/approvals/c1", "/v1/agents/alpha/events/q/approvals",
	} {
		status, b := fx.do(t, "GET", path, alphaToken, nil)
		wantError(t, status, b, http.StatusBadRequest, "bad_request")
	}
}

func TestTheApprovalsOfAnEventAreListedOldestFirstWithTheirCards(t *testing.T) {
	fx, _ := newApprovalFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "mail bob and carol"), mx.Message("$r", alice, 1001, "other"))
	var list struct {
		EventID   string         `json:"event_id"`
		Approvals []approvalBody `json:"approvals"`
	}
	if list = decode[struct {
		EventID   string         `json:"event_id"`
		Approvals []approvalBody `json:"approvals"`
	}](t, fx.mustGet(t, approvalsPath("$q"))); list.EventID != "$q" || list.Approvals == nil || len(list.Approvals) != 0 {
		t.Fatalf("no approvals = %+v", list)
	}
	for _, id := range []string{"c-bob", "c-carol"} {
		body := strings.Replace(mailCall, `"c1"`, `"`+id+`"`, 1)
		if status, b := fx.askApproval(t, "$q", body); status != http.StatusOK {
			t.Fatalf("status = %d: %s", status, b)
		}
	}
	if status, b := fx.askApproval(t, "$r", strings.Replace(mailCall, `"c1"`, `"c-other"`, 1)); status != http.StatusOK {
		t.Fatalf("status = %d: %s", status, b)
	}
	ctx := context.Background()
	id := journal.ApprovalDeliveryID("c-bob")
	if _, err := fx.alpha.Claim(ctx, id, journal.StageInitial, "DEV"); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.alpha.Acknowledge(ctx, id, journal.StageInitial, journal.Sent{EventID: "$card"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fx.alpha.DecideApproval(ctx, "c-bob", journal.ApprovalDecision{State: journal.ApprovalDenied, By: alice}); err != nil {
		t.Fatal(err)
	}
	b := fx.mustGet(t, approvalsPath("$q"))
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Approvals) != 2 {
		t.Fatalf("approvals = %s", b)
	}
	bob, carol := list.Approvals[0], list.Approvals[1]
	if bob.CallID != "c-bob" || bob.State != "denied" || bob.CardEventID != "$card" || bob.DecidedBy != alice ||
		carol.CallID != "c-carol" || carol.State != "open" || carol.CardEventID != "" {
		t.Fatalf("approvals = %s", b)
	}
	if got := decode[approvalBody](t, fx.mustGet(t, approvalsPath("$q")+"/c-bob")); got.CardEventID != "$card" {
		t.Fatalf("the read's card event = %q", got.CardEventID)
	}
}

func TestConcurrentSameApprovalRequestsRecordOne(t *testing.T) {
	fx, _ := newApprovalFixture(t, nil)
	fx.admit(t, room, mx.Message("$q", alice, 1000, "mail bob"))
	const n = 8
	outcomes := make(chan string, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			req, _ := http.NewRequest("POST", fx.srv.URL+approvalsPath("$q"), strings.NewReader(mailCall))
			req.Header.Set("Authorization", "Bearer "+alphaToken)
			resp, err := fx.srv.Client().Do(req)
			if err != nil {
				outcomes <- err.Error()
				return
			}
			defer resp.Body.Close()
			var out approvalCreatedBody
			if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil {
				outcomes <- fmt.Sprint(resp.StatusCode)
				return
			}
			outcomes <- out.Outcome
		}()
	}
	close(start)
	counts := map[string]int{}
	for range n {
		counts[<-outcomes]++
	}
	if counts["created"] != 1 || counts["replayed"] != n-1 {
		t.Fatalf("outcomes = %v, want one created and %d replayed", counts, n-1)
	}
	rows, err := fx.alpha.Unacknowledged(context.Background(), 100, nil)
	if err != nil || len(rows) != 1 || rows[0].DeliveryID != journal.ApprovalDeliveryID("c1") {
		t.Fatalf("outbox = %+v, %v; want the one card", rows, err)
	}
}

// The approvals routes refuse malformed path values before anything is
// read or written, as every route does.
func TestMalformedApprovalPathsAreRefusedBeforeAnythingIsTouched(t *testing.T) {
	fx := newSecFixture(t)
	before := fx.state(t)
	auth := "Bearer " + secToken("alpha")
	long := strings.Repeat("x", 300)
	for _, ev := range []string{"e1", "$" + long, "!a1:x", "$with%20space", "$%C3%A9"} {
		base := "/v1/agents/alpha/events/" + ev + "/approvals"
		for _, req := range []struct{ method, path, body string }{
			{http.MethodPost, base, `{"call_id":"c1","tool":"t","arguments":{}}`},
			{http.MethodGet, base, ""},
			{http.MethodGet, base + "/c1", ""},
		} {
			r := fx.call(t, req.method, req.path, auth, strings.NewReader(req.body), nil)
			wantRefusal(t, req.method+" "+req.path, r, http.StatusBadRequest, "bad_request")
		}
	}
	for _, q := range []string{"/c1?wait=301", "/c1?wait=-1", "/c1?wait=NaN", "/" + long} {
		r := fx.call(t, http.MethodGet, "/v1/agents/alpha/events/$a1/approvals"+q, auth, nil, nil)
		wantRefusal(t, "GET approvals"+q, r, http.StatusBadRequest, "bad_request")
	}
	if got := fx.state(t); got != before {
		t.Fatalf("refused requests changed the state:\n%s\nwas\n%s", got, before)
	}
}
