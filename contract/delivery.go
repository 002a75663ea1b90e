package contract

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// RunDelivery runs the delivery, turn-record and membership-fence areas of
// the contract against the backend f makes. Each area gets fresh backends,
// so the areas can run in any order and beside Run.
func RunDelivery(t *testing.T, f Factory) {
	areas := []struct {
		name string
		run  func(*testing.T, Factory)
	}{
		{"Outbox", TestOutbox},
		{"DeliveryIsScopedToTheMembershipThatAuthorizedIt", TestDeliveryIsScopedToTheMembershipThatAuthorizedIt},
		{"DepartureBookkeeping", TestDepartureBookkeeping},
		{"MembershipEpoch", TestMembershipEpoch},
		{"MembershipFence", TestMembershipFence},
		{"TurnRecords", TestTurnRecords},
		{"InitialAndFinalStages", TestInitialAndFinalStages},
		{"TheHandoffIsOneTransaction", TestTheHandoffIsOneTransaction},
		{"OneTurnStageIsOneMessage", TestOneTurnStageIsOneMessage},
	}
	for _, a := range areas {
		t.Run(a.name, func(t *testing.T) { a.run(t, f) })
	}
}

// The delivery areas speak for one agent answering people in dRoom; they use
// names of their own so they never depend on another area's fixtures.
const (
	dRoom   = "!delivery:example.org"
	dRoom2  = "!second:example.org"
	dAgent  = "courier"
	dBot    = "@courier:example.org"
	dBot2   = "@courier2:example.org" // the same agent after a re-login
	dPerson = "@person:example.org"
	dDevice = "DEVICEA"
	// dServerEpochMS is where the homeserver's clock stands when the areas'
	// sends begin, after every timestamp they give a message.
	dServerEpochMS = 1_000_000
)

// dfx is one fresh backend with its open store and the default agent view.
type dfx struct {
	t *testing.T
	b Backend
	s journal.Store
	v journal.PrincipalStore
	// serverTS is the homeserver's clock as the fixtures' sends see it: each
	// acknowledged send is stamped one millisecond after the last, later
	// than every message the areas admit.
	serverTS int64
}

func newDFX(t *testing.T, f Factory) *dfx {
	t.Helper()
	x := &dfx{t: t, b: f(t)}
	x.s = x.b.Open(t)
	x.v = x.view(dAgent, dBot)
	return x
}

// view binds (agent, user) on the current store.
func (x *dfx) view(agent, user string) journal.PrincipalStore {
	x.t.Helper()
	v, err := x.s.Principal(context.Background(), agent, user)
	if err != nil {
		x.t.Fatalf("Principal(%q, %q): %v", agent, user, err)
	}
	return v
}

// restart closes the store and opens it again at the same location. Views
// bound before must not be used afterwards; the default view is rebound.
func (x *dfx) restart() {
	x.t.Helper()
	if err := x.s.Close(); err != nil {
		x.t.Fatalf("Close: %v", err)
	}
	x.s = x.b.Open(x.t)
	x.v = x.view(dAgent, dBot)
}

// dEvent is a Matrix event under construction.
type dEvent map[string]any

// dText is a text message from dPerson.
func dText(id string, ts int64, body string) dEvent {
	return dEvent{
		"event_id": id, "type": "m.room.message", "sender": dPerson, "origin_server_ts": ts,
		"content": map[string]any{"msgtype": "m.text", "body": body},
	}
}

// dImage is a media message from dPerson.
func dImage(id string, ts int64) dEvent {
	return dEvent{
		"event_id": id, "type": "m.room.message", "sender": dPerson, "origin_server_ts": ts,
		"content": map[string]any{"msgtype": "m.image", "body": "photo.png", "url": "mxc://example.org/photo"},
	}
}

// dEditOf is dPerson's edit of target.
func dEditOf(id string, ts int64, target, body string) dEvent {
	return dEvent{
		"event_id": id, "type": "m.room.message", "sender": dPerson, "origin_server_ts": ts,
		"content": map[string]any{
			"msgtype": "m.text", "body": "* " + body,
			"m.new_content": map[string]any{"msgtype": "m.text", "body": body},
			"m.relates_to":  map[string]any{"rel_type": "m.replace", "event_id": target},
		},
	}
}

// dRedact is dPerson's redaction of target.
func dRedact(id string, ts int64, target string) dEvent {
	return dEvent{
		"event_id": id, "type": "m.room.redaction", "sender": dPerson, "origin_server_ts": ts,
		"redacts": target, "content": map[string]any{"redacts": target},
	}
}

// dReact is dPerson's reaction to target.
func dReact(id string, ts int64, target string) dEvent {
	return dEvent{
		"event_id": id, "type": "m.reaction", "sender": dPerson, "origin_server_ts": ts,
		"content": map[string]any{"m.relates_to": map[string]any{"rel_type": "m.annotation", "event_id": target, "key": "+1"}},
	}
}

// admit admits evs as live events of roomID on v, one batch, and requires
// every one to be new.
func (x *dfx) admit(v journal.PrincipalStore, roomID string, evs ...dEvent) {
	x.t.Helper()
	got := x.admitOutcomes(v, roomID, evs...)
	for i, o := range got {
		if o != journal.Admitted {
			x.t.Fatalf("admit %v: event %d outcome %v, want admitted", evs[i]["event_id"], i, o)
		}
	}
}

// admitOutcomes admits evs as one live batch and returns the outcomes.
func (x *dfx) admitOutcomes(v journal.PrincipalStore, roomID string, evs ...dEvent) []journal.Outcome {
	x.t.Helper()
	in := make([]journal.Inbound, len(evs))
	for i, e := range evs {
		raw, err := json.Marshal(map[string]any(e))
		if err != nil {
			x.t.Fatalf("encode event: %v", err)
		}
		in[i] = journal.Inbound{RoomID: roomID, Provenance: journal.Live, Event: raw}
	}
	res, err := v.AdmitBatch(context.Background(), in, "")
	if err != nil {
		x.t.Fatalf("AdmitBatch: %v", err)
	}
	if len(res) != len(in) {
		x.t.Fatalf("AdmitBatch returned %d results for %d events", len(res), len(in))
	}
	out := make([]journal.Outcome, len(res))
	for i, r := range res {
		out[i] = r.Outcome
	}
	return out
}

// dBody is the content of a plain text answer.
func dBody(body string) json.RawMessage {
	return json.RawMessage(`{"body":"` + body + `","msgtype":"m.text"}`)
}

// answer builds the enqueue request of one text answer.
func answer(deliveryID string, stage journal.Stage, roomID, body string, sources ...string) journal.EnqueueRequest {
	return journal.EnqueueRequest{
		DeliveryID: deliveryID, Stage: stage, RoomID: roomID, Content: dBody(body), Sources: sources,
	}
}

// enqueue hands req to v's outbox and fails the test on an error.
func (x *dfx) enqueue(v journal.PrincipalStore, req journal.EnqueueRequest) journal.EnqueueResult {
	x.t.Helper()
	res, err := v.EnqueueAndSettle(context.Background(), req)
	if err != nil {
		x.t.Fatalf("EnqueueAndSettle(%s/%s): %v", req.DeliveryID, req.Stage, err)
	}
	return res
}

// refuse requires enqueueing req on v to fail with want.
func (x *dfx) refuse(v journal.PrincipalStore, req journal.EnqueueRequest, want error) {
	x.t.Helper()
	res, err := v.EnqueueAndSettle(context.Background(), req)
	if !errors.Is(err, want) {
		x.t.Fatalf("EnqueueAndSettle(%s/%s) = %+v, %v; want error %v", req.DeliveryID, req.Stage, res, err, want)
	}
}

func (x *dfx) claim(v journal.PrincipalStore, id string, stage journal.Stage) journal.Delivery {
	x.t.Helper()
	d, err := v.Claim(context.Background(), id, stage, dDevice)
	if err != nil {
		x.t.Fatalf("Claim(%s/%s): %v", id, stage, err)
	}
	return d
}

// claimErr requires claiming id/stage on v to fail with want.
func (x *dfx) claimErr(v journal.PrincipalStore, id string, stage journal.Stage, want error) {
	x.t.Helper()
	d, err := v.Claim(context.Background(), id, stage, dDevice)
	if !errors.Is(err, want) {
		x.t.Fatalf("Claim(%s/%s) = state %v, %v; want error %v", id, stage, d.State, err, want)
	}
}

// ack acknowledges id/stage as accepted by the homeserver under eventID, at
// the next tick of the server's clock.
func (x *dfx) ack(v journal.PrincipalStore, id string, stage journal.Stage, eventID string) journal.AckResult {
	x.t.Helper()
	if x.serverTS == 0 {
		x.serverTS = dServerEpochMS
	}
	x.serverTS++
	r, err := v.Acknowledge(context.Background(), id, stage, journal.Sent{EventID: eventID, ServerTS: x.serverTS})
	if err != nil {
		x.t.Fatalf("Acknowledge(%s/%s, %s): %v", id, stage, eventID, err)
	}
	return r
}

func (x *dfx) fail(v journal.PrincipalStore, id string, stage journal.Stage, reason string, permanent bool) {
	x.t.Helper()
	if err := v.Fail(context.Background(), id, stage, reason, permanent); err != nil {
		x.t.Fatalf("Fail(%s/%s): %v", id, stage, err)
	}
}

func (x *dfx) delivery(v journal.PrincipalStore, id string, stage journal.Stage) journal.Delivery {
	x.t.Helper()
	d, err := v.Delivery(context.Background(), id, stage)
	if err != nil {
		x.t.Fatalf("Delivery(%s/%s): %v", id, stage, err)
	}
	return d
}

// state is the state of one stage, or "absent" when there is no such row.
func (x *dfx) state(v journal.PrincipalStore, id string, stage journal.Stage) string {
	x.t.Helper()
	d, err := v.Delivery(context.Background(), id, stage)
	if errors.Is(err, journal.ErrNoDelivery) {
		return "absent"
	}
	if err != nil {
		x.t.Fatalf("Delivery(%s/%s): %v", id, stage, err)
	}
	return d.State.String()
}

// unacked walks v's whole recovery scan in pages of two and renders each
// row as "delivery/stage".
func (x *dfx) unacked(v journal.PrincipalStore) []string {
	x.t.Helper()
	out := []string{}
	var after *journal.DeliveryCursor
	for i := 0; ; i++ {
		if i > 1000 {
			x.t.Fatalf("Unacknowledged does not end")
		}
		page, err := v.Unacknowledged(context.Background(), 2, after)
		if err != nil {
			x.t.Fatalf("Unacknowledged: %v", err)
		}
		for _, d := range page {
			out = append(out, d.DeliveryID+"/"+d.Stage.String())
		}
		if len(page) < 2 {
			return out
		}
		last := page[len(page)-1]
		after = &journal.DeliveryCursor{CreatedMS: last.CreatedMS, Position: last.Position}
	}
}

// pendingIDs lists v's readable pending event IDs in receipt order.
func (x *dfx) pendingIDs(v journal.PrincipalStore) []string {
	x.t.Helper()
	out := []string{}
	for _, e := range x.pending(v) {
		out = append(out, e.EventID)
	}
	return out
}

// pending lists v's readable pending events in receipt order.
func (x *dfx) pending(v journal.PrincipalStore) []journal.PendingEvent {
	x.t.Helper()
	var (
		out   []journal.PendingEvent
		after int64
	)
	for {
		page, err := v.Pending(context.Background(), 50, after)
		if err != nil {
			x.t.Fatalf("Pending: %v", err)
		}
		out = append(out, page.Events...)
		if !page.More {
			return out
		}
		after = page.Next
	}
}

// screen renders roomID as v sees it, oldest first, one "event_id:body" per
// message ("event_id:<no body>" when the body is gone).
func (x *dfx) screen(v journal.PrincipalStore, roomID string) []string {
	x.t.Helper()
	page, err := v.Read(context.Background(), journal.ReadRequest{RoomID: roomID, Limit: 100})
	if err != nil {
		x.t.Fatalf("Read(%s): %v", roomID, err)
	}
	out := []string{}
	for _, m := range page.Messages {
		out = append(out, m.EventID+":"+bodyOf(m.Content))
	}
	return out
}

// bodyOf is the body of a content, or "<no body>".
func bodyOf(content json.RawMessage) string {
	var c struct {
		Body *string `json:"body"`
	}
	if len(content) == 0 || json.Unmarshal(content, &c) != nil || c.Body == nil {
		return "<no body>"
	}
	return *c.Body
}

func (x *dfx) fence(v journal.PrincipalStore, roomID string, src journal.DepartureSource, obs string) journal.DepartureOutcome {
	x.t.Helper()
	o, err := v.FenceDeparture(context.Background(), roomID, src, obs)
	if err != nil {
		x.t.Fatalf("FenceDeparture(%s, %d, %q): %v", roomID, src, obs, err)
	}
	return o
}

func (x *dfx) join(v journal.PrincipalStore, roomID, obs string) {
	x.t.Helper()
	if err := v.RecordJoin(context.Background(), roomID, obs); err != nil {
		x.t.Fatalf("RecordJoin(%s, %q): %v", roomID, obs, err)
	}
}

// membership renders the room's epoch and departure as "epoch N, in|out".
func (x *dfx) membership(v journal.PrincipalStore, roomID string) string {
	x.t.Helper()
	epoch, departed, err := v.RoomEpoch(context.Background(), roomID)
	if err != nil {
		x.t.Fatalf("RoomEpoch(%s): %v", roomID, err)
	}
	if departed {
		return fmt.Sprintf("epoch %d, out", epoch)
	}
	return fmt.Sprintf("epoch %d, in", epoch)
}

// owing lists the rooms v owes departure reports for, never nil.
func (x *dfx) owing(v journal.PrincipalStore) []string {
	x.t.Helper()
	rooms, err := v.RoomsOwingDepartureReports(context.Background())
	if err != nil {
		x.t.Fatalf("RoomsOwingDepartureReports: %v", err)
	}
	if rooms == nil {
		rooms = []string{}
	}
	return rooms
}

func (x *dfx) upsertTurn(v journal.PrincipalStore, rec journal.TurnRecord) {
	x.t.Helper()
	if err := v.UpsertTurn(context.Background(), rec); err != nil {
		x.t.Fatalf("UpsertTurn(%s): %v", rec.TurnID, err)
	}
}

// turnFor renders the record eventID indexes as "turn state event_id", or
// "none".
func (x *dfx) turnFor(v journal.PrincipalStore, eventID string) string {
	x.t.Helper()
	rec, ok, err := v.TurnForEvent(context.Background(), eventID)
	if err != nil {
		x.t.Fatalf("TurnForEvent(%s): %v", eventID, err)
	}
	if !ok {
		return "none"
	}
	return fmt.Sprintf("%s %d %s", rec.TurnID, rec.State, rec.EventID)
}

func (x *dfx) turn(v journal.PrincipalStore, turnID string) (journal.TurnRecord, bool) {
	x.t.Helper()
	rec, ok, err := v.Turn(context.Background(), turnID)
	if err != nil {
		x.t.Fatalf("Turn(%s): %v", turnID, err)
	}
	return rec, ok
}

// same fails the test unless got deeply equals want.
func same[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got %#v\nwant %#v", what, got, want)
	}
}
