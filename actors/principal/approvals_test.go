package principal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const (
	apRoom  = "!room:example.org"
	apBot   = "@bot:example.org"
	apAlice = "@alice:example.org"
	apBob   = "@bob:example.org"
	apCarol = "@carol:example.org"
	apDave  = "@dave:example.org"
)

// roomMembers is the homeserver as the approval tests need it: who is in
// the room, or a failure to say. Nothing else is ever asked of it.
type roomMembers struct {
	mu      sync.Mutex
	members []string
	err     error
	asked   int
}

func (r *roomMembers) UserID() string { return apBot }

func (r *roomMembers) Sync(context.Context, string, time.Duration) (*matrix.SyncBatch, error) {
	return nil, errors.New("no sync in this test")
}

func (r *roomMembers) Messages(context.Context, string, string, matrix.Direction, int) (matrix.MessagesPage, error) {
	return matrix.MessagesPage{}, errors.New("no messages in this test")
}

func (r *roomMembers) Join(context.Context, string) (string, error) {
	return "", errors.New("no join in this test")
}
func (r *roomMembers) Leave(context.Context, string) error {
	return errors.New("no leave in this test")
}

func (r *roomMembers) Send(context.Context, string, string, string, json.RawMessage) (string, error) {
	return "", errors.New("no send in this test")
}

func (r *roomMembers) JoinedMembers(_ context.Context, room string) ([]matrix.Member, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked++
	if r.err != nil {
		return nil, r.err
	}
	if room != apRoom {
		return nil, &matrix.HTTPError{Status: 403, ErrCode: "M_FORBIDDEN"}
	}
	var out []matrix.Member
	for _, m := range r.members {
		out = append(out, matrix.Member{UserID: m})
	}
	return out, nil
}

func (r *roomMembers) set(err error, members ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err, r.members = err, members
}

// turns is an Agent that asks about a call until it is decided, then
// answers with what it was told, and keeps every turn it was offered.
type turns struct {
	mu    sync.Mutex
	seen  []agent.Turn
	reply func(agent.Turn) agent.Reply
}

func (a *turns) Answer(_ context.Context, turn agent.Turn) (agent.Reply, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = append(a.seen, turn)
	return a.reply(turn), nil
}

func (a *turns) offered() []agent.Turn {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.seen)
}

// askOnce asks about c1 until it is decided, then says what was decided.
func askOnce(turn agent.Turn) agent.Reply {
	if len(turn.Approvals) == 0 {
		return agent.Reply{Approval: &agent.ApprovalAsk{CallID: "c1", Tool: "send_mail",
			Arguments: json.RawMessage(`{"to": "bob@example.org"}`), ExpiresIn: 10 * time.Minute}}
	}
	c := turn.Approvals[0]
	content, _ := json.Marshal(map[string]string{"msgtype": "m.text", "body": c.CallID + " " + c.State.String() + " by " + c.DecidedBy})
	return agent.Reply{Content: content}
}

// lockedClock is a settable clock read by the loop under test.
type lockedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *lockedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *lockedClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// approvalRig is one principal over a real journal, its clock the
// journal's, with alice's pending question $q in apRoom and a homeserver
// that only lists the room's members.
type approvalRig struct {
	t     *testing.T
	ctx   context.Context
	clock *lockedClock
	v     journal.PrincipalStore
	hs    *roomMembers
	agent *turns
	a     *principalActor
	syncs int
}

func newApprovalRig(t *testing.T) *approvalRig {
	t.Helper()
	ctx := context.Background()
	clock := &lockedClock{t: testsupport.DefaultNow}
	s := testsupport.MustOpenWith(t, store.Options{StorageDir: t.TempDir(), Now: clock.Now})
	v, err := s.Principal(ctx, "helper", apBot)
	if err != nil {
		t.Fatal(err)
	}
	r := &approvalRig{t: t, ctx: ctx, clock: clock, v: v, hs: &roomMembers{members: []string{apBot, apAlice, apBob, apCarol}},
		agent: &turns{reply: askOnce}}
	r.a = &principalActor{deps: Deps{Store: v, Transport: r.hs, Agent: r.agent, Now: clock.Now,
		BackoffBase: time.Second, BackoffMax: time.Minute, ApprovalSweep: DefaultApprovalSweep}, log: zerolog.Nop(),
		members: &membership{store: v, log: zerolog.Nop()}}
	r.sync(mx.Message("$q", apAlice, 1000, "mail bob"))
	return r
}

// sync has the principal admit one incremental sync of apRoom bringing
// evs in its timeline and state in its state.
func (r *approvalRig) syncWithState(state []mx.Ev, evs ...mx.Ev) {
	r.t.Helper()
	r.syncs++
	tl := matrix.RoomTimeline{RoomID: apRoom}
	for _, e := range evs {
		tl.Events = append(tl.Events, e.JSON())
	}
	for _, e := range state {
		tl.State = append(tl.State, e.JSON())
	}
	batch := &matrix.SyncBatch{NextBatch: fmt.Sprintf("s%d", r.syncs+1), Joined: []matrix.RoomTimeline{tl}}
	if err := r.a.apply(r.ctx, fmt.Sprintf("s%d", r.syncs), batch); err != nil {
		r.t.Fatalf("apply: %v", err)
	}
}

func (r *approvalRig) sync(evs ...mx.Ev) {
	r.t.Helper()
	r.syncWithState(nil, evs...)
}

// ask records the call callID of $q, approvers deciding (alice when none).
func (r *approvalRig) ask(callID string, approvers ...string) journal.Approval {
	r.t.Helper()
	a, _, err := r.v.RequestApproval(r.ctx, journal.ApprovalRequest{EventID: "$q", CallID: callID, Tool: "send_mail",
		Arguments: json.RawMessage(`{"to":"bob@example.org"}`), Approvers: approvers,
		ExpiresMS: r.clock.Now().Add(time.Hour).UnixMilli()}, journal.DefaultApprovalKeys)
	if err != nil {
		r.t.Fatalf("request approval: %v", err)
	}
	return a
}

// sendCard has the outbox send the card of callID as cardEventID.
func (r *approvalRig) sendCard(callID, cardEventID string) {
	r.t.Helper()
	id := journal.ApprovalDeliveryID(callID)
	if _, err := r.v.Claim(r.ctx, id, journal.StageInitial, "DEV"); err != nil {
		r.t.Fatalf("claim card: %v", err)
	}
	if _, err := r.v.Acknowledge(r.ctx, id, journal.StageInitial, journal.Sent{EventID: cardEventID}); err != nil {
		r.t.Fatalf("acknowledge card: %v", err)
	}
}

func (r *approvalRig) call(callID string) journal.Approval {
	r.t.Helper()
	a, _, found, err := r.v.Approval(r.ctx, callID)
	if err != nil || !found {
		r.t.Fatalf("approval %s: %v %v", callID, found, err)
	}
	return a
}

// edit is the card's edit of callID ("" TxnID when there is none).
func (r *approvalRig) edit(callID string) journal.Delivery {
	r.t.Helper()
	d, err := r.v.Delivery(r.ctx, journal.ApprovalDeliveryID(callID), journal.StageFinal)
	if err != nil && !errors.Is(err, journal.ErrNoDelivery) {
		r.t.Fatal(err)
	}
	return d
}

func (r *approvalRig) pending() []journal.PendingEvent {
	r.t.Helper()
	page, err := r.v.Pending(r.ctx, 100, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	return page.Events
}

func (r *approvalRig) pendingIDs() []string {
	r.t.Helper()
	var ids []string
	for _, e := range r.pending() {
		ids = append(ids, e.EventID)
	}
	return ids
}

// offer offers the pending event id to the worker.
func (r *approvalRig) offer(id string) error {
	r.t.Helper()
	for _, e := range r.pending() {
		if e.EventID == id {
			return r.a.offer(r.ctx, e)
		}
	}
	r.t.Fatalf("%s is not pending", id)
	return nil
}

// reply is a reply of sender to target saying body.
func reply(id, sender string, ts int64, target, body string) mx.Ev {
	e := mx.Message(id, sender, ts, "> <@bot:example.org> the card\n\n"+body)
	e["content"].(map[string]any)["m.relates_to"] = map[string]any{"m.in_reply_to": map[string]any{"event_id": target}}
	return e
}

// departure is target's membership changed to membership by sender.
func departure(id, sender, target, membership string) mx.Ev {
	return mx.Member(id, sender, 5000, membership).With("state_key", target)
}

func TestAnApproversReactionDecidesOnceAndEveryLaterVoteIsConsumed(t *testing.T) {
	r := newApprovalRig(t)
	r.ask("c1")
	r.sendCard("c1", "$card")
	r.sync(mx.Reaction("$yes", apAlice, 2000, "$card", "✅"))
	c := r.call("c1")
	if c.State != journal.ApprovalApproved || c.DecidedBy != apAlice || c.DecisionEventID != "$yes" {
		t.Fatalf("after alice's ✅ the call is %+v", c)
	}
	edit := r.edit("c1")
	if edit.State != journal.DeliveryQueued {
		t.Fatalf("the card's edit = %+v, want queued", edit)
	}
	r.sync(mx.Reaction("$no", apAlice, 2001, "$card", "❌"), reply("$no2", apAlice, 2002, "$card", "deny"))
	if c := r.call("c1"); c.State != journal.ApprovalApproved || c.DecisionEventID != "$yes" {
		t.Fatalf("after later votes the call is %+v; the first decision stands", c)
	}
	if again := r.edit("c1"); again.TxnID != edit.TxnID || string(again.Content) != string(edit.Content) {
		t.Fatalf("the card's edit changed: %+v", again)
	}
	if got := r.pendingIDs(); !slices.Equal(got, []string{"$q"}) {
		t.Fatalf("pending = %v: every vote is settled, the turn waits for its agent", got)
	}
	if turns := r.agent.offered(); len(turns) != 0 {
		t.Fatalf("the agent was offered %d turns; a vote is never work", len(turns))
	}
}

func TestAVoteThatOvertakesItsCardsAcknowledgementDecidesOnceTheAcknowledgementIsRecorded(t *testing.T) {
	r := newApprovalRig(t)
	r.ask("c1")
	// The homeserver took the card, alice voted on it, and the sync
	// brings the card's echo and her vote before the outbox has recorded
	// the send's answer.
	r.sync(mx.Message("$card", apBot, 1900, "the card"), mx.Reaction("$yes", apAlice, 2000, "$card", "✅"))
	if c := r.call("c1"); c.State != journal.ApprovalOpen {
		t.Fatalf("before the card's acknowledgement the call is %+v, want open", c)
	}
	if got := r.pendingIDs(); !slices.Equal(got, []string{"$q", "$yes"}) {
		t.Fatalf("pending = %v: the vote waits, pending", got)
	}
	// The worker, finding it pending meanwhile, does not make it a turn.
	if err := r.offer("$yes"); !errors.Is(err, errCardInFlight) {
		t.Fatalf("offering the early vote: %v, want it left to the approvals loop", err)
	}
	if turns := r.agent.offered(); len(turns) != 0 {
		t.Fatalf("the agent was offered %d turns; a vote is never work", len(turns))
	}
	if !r.a.approvals.rescan.Load() {
		t.Fatal("the early vote asked for no second look")
	}
	// The acknowledgement is recorded: the loop's next look decides.
	r.sendCard("c1", "$card")
	if err := r.a.scanPending(r.ctx); err != nil {
		t.Fatal(err)
	}
	if c := r.call("c1"); c.State != journal.ApprovalApproved || c.DecisionEventID != "$yes" {
		t.Fatalf("after the card's acknowledgement the call is %+v, want approved by $yes", c)
	}
	if got := r.pendingIDs(); !slices.Equal(got, []string{"$q"}) {
		t.Fatalf("pending = %v: the vote is settled", got)
	}
	// With no card in flight, a ✅ on anything else is an ordinary event.
	r.sync(mx.Message("$chat", apBob, 3000, "lunch?"), mx.Reaction("$lunch", apAlice, 3001, "$chat", "✅"))
	if got := r.pendingIDs(); !slices.Contains(got, "$lunch") {
		t.Fatalf("pending = %v: a ✅ on a message is work like any reaction", got)
	}
	for _, e := range r.pending() {
		if e.EventID != "$lunch" {
			continue
		}
		if handled, err := r.a.pendingCardEvent(r.ctx, e); handled || err != nil {
			t.Fatalf("an ordinary ✅ was taken for a vote: handled %v, %v", handled, err)
		}
	}
}

func TestAReplyDeniesAndStrangersAndOtherRoomsDecideNothing(t *testing.T) {
	r := newApprovalRig(t)
	r.ask("c1")
	r.sendCard("c1", "$card")
	r.sync(mx.Reaction("$bob", apBob, 2000, "$card", "✅"), // a member, not an approver
		mx.Reaction("$thumbs", apAlice, 2001, "$card", "👍"), // no vote
		reply("$chat", apAlice, 2002, "$card", "approve it later maybe"))
	if c := r.call("c1"); c.State != journal.ApprovalOpen {
		t.Fatalf("after a stranger's ✅ the call is %+v, want open", c)
	}
	if got := r.pendingIDs(); !slices.Equal(got, []string{"$q", "$thumbs", "$chat"}) {
		t.Fatalf("pending = %v: the stranger's vote is settled, what is no vote stays work", got)
	}
	// A vote in another room on this room's card decides nothing.
	other := matrix.RoomTimeline{RoomID: "!other:example.org",
		Events: []json.RawMessage{mx.Reaction("$elsewhere", apAlice, 2003, "$card", "✅").JSON()}}
	if err := r.a.apply(r.ctx, "s9", &matrix.SyncBatch{NextBatch: "s10", Joined: []matrix.RoomTimeline{other}}); err != nil {
		t.Fatal(err)
	}
	if c := r.call("c1"); c.State != journal.ApprovalOpen {
		t.Fatalf("after a vote from another room the call is %+v, want open", c)
	}
	r.sync(reply("$deny", apAlice, 2004, "$card", "Deny."))
	if c := r.call("c1"); c.State != journal.ApprovalDenied || c.DecidedBy != apAlice || c.DecisionEventID != "$deny" {
		t.Fatalf("after alice's reply the call is %+v, want denied", c)
	}
}

func TestAnApproversVoteFromOutsideTheRoomOrTooLateIsIgnored(t *testing.T) {
	r := newApprovalRig(t)
	r.ask("c1")
	r.sendCard("c1", "$card")
	r.hs.set(nil, apBot, apBob)
	r.sync(mx.Reaction("$yes", apAlice, 2000, "$card", "✅"))
	if c := r.call("c1"); c.State != journal.ApprovalOpen {
		t.Fatalf("after a vote of an approver out of the room the call is %+v, want open", c)
	}
	r.hs.set(nil, apBot, apAlice)
	r.clock.set(r.clock.Now().Add(time.Hour))
	r.sync(mx.Reaction("$late", apAlice, 3000, "$card", "✅"))
	if c := r.call("c1"); c.State != journal.ApprovalOpen {
		t.Fatalf("after a vote past the expiry the call is %+v, want open until the sweep", c)
	}
	if got := r.pendingIDs(); !slices.Equal(got, []string{"$q"}) {
		t.Fatalf("pending = %v, want both ignored votes settled", got)
	}
}

func TestAVoteWhoseRoomCannotBeReadStaysPendingAndIsJudgedLater(t *testing.T) {
	r := newApprovalRig(t)
	r.agent.reply = func(agent.Turn) agent.Reply { return agent.Reply{Ignore: true} }
	r.ask("c1")
	r.sendCard("c1", "$card")
	r.hs.set(errors.New("homeserver unreachable"), apBot, apAlice)
	r.sync(mx.Reaction("$yes", apAlice, 2000, "$card", "✅"))
	if c := r.call("c1"); c.State != journal.ApprovalOpen {
		t.Fatalf("the call is %+v, want open: the vote could not be judged", c)
	}
	if got := r.pendingIDs(); !slices.Equal(got, []string{"$q", "$yes"}) || !r.a.approvals.rescan.Load() {
		t.Fatalf("pending = %v, rescan %v: the vote stays pending for the sweep", got, r.a.approvals.rescan.Load())
	}
	// The worker meets it: still not judged, and never offered.
	if err := r.offer("$yes"); !errors.Is(err, errMembersUnknown) {
		t.Fatalf("offering the vote = %v, want it failed for a retry", err)
	}
	r.hs.set(nil, apBot, apAlice)
	if err := r.a.scanPending(r.ctx); err != nil {
		t.Fatal(err)
	}
	if c := r.call("c1"); c.State != journal.ApprovalApproved || c.DecisionEventID != "$yes" {
		t.Fatalf("after the scan the call is %+v, want approved", c)
	}
	if turns := r.agent.offered(); len(turns) != 0 {
		t.Fatalf("the agent was offered %d turns", len(turns))
	}
}

func TestAVoteACrashLeftPendingIsDecidedAndNeverOffered(t *testing.T) {
	r := newApprovalRig(t)
	r.ask("c1")
	r.sendCard("c1", "$card")
	// Admitted, and the process died before it was judged.
	if _, err := r.v.AdmitBatch(r.ctx, mx.Live(apRoom, reply("$yes", apAlice, 2000, "$card", "yes")), "s5"); err != nil {
		t.Fatal(err)
	}
	if err := r.offer("$yes"); err != nil {
		t.Fatal(err)
	}
	if c := r.call("c1"); c.State != journal.ApprovalApproved || c.DecisionEventID != "$yes" {
		t.Fatalf("the call is %+v, want approved by the vote the worker met", c)
	}
	if turns := r.agent.offered(); len(turns) != 0 {
		t.Fatalf("the agent was offered %d turns, want none: a vote is never work", len(turns))
	}
}

func TestACardsRedactionWithdrawsItsCall(t *testing.T) {
	r := newApprovalRig(t)
	r.ask("c1")
	r.sendCard("c1", "$card")
	r.sync(mx.Redaction("$gone", apBob, 2000, "$card"))
	c := r.call("c1")
	if c.State != journal.ApprovalWithdrawn || c.Reason != reasonCardRemoved || c.DecidedBy != "" {
		t.Fatalf("after the card's redaction the call is %+v, want withdrawn", c)
	}
	if r.edit("c1").State != journal.DeliveryQueued {
		t.Fatal("no edit of the card was enqueued")
	}
	if got := r.pendingIDs(); !slices.Equal(got, []string{"$q"}) {
		t.Fatalf("pending = %v, want the redaction settled", got)
	}
}

func TestTheLastApproversDepartureWithdrawsAndARejoinRevivesNothing(t *testing.T) {
	r := newApprovalRig(t)
	r.ask("c1", apAlice, apCarol)
	r.ask("c2", apDave) // dave never joined: nobody left
	r.sendCard("c1", "$card")
	r.hs.set(nil, apBot, apAlice, apBob)
	r.sync(departure("$carol-left", apCarol, apCarol, "leave"))
	if c := r.call("c1"); c.State != journal.ApprovalOpen {
		t.Fatalf("with alice still in, the call is %+v, want open", c)
	}
	r.hs.set(nil, apBot, apBob)
	r.syncWithState([]mx.Ev{departure("$alice-kicked", apBob, apAlice, "leave")})
	c := r.call("c1")
	if c.State != journal.ApprovalWithdrawn || c.Reason != reasonApproverLeft {
		t.Fatalf("with no approver left, the call is %+v, want withdrawn", c)
	}
	if c := r.call("c2"); c.State != journal.ApprovalOpen {
		t.Fatalf("a call none of whose approvers left is %+v, want open", c)
	}
	r.hs.set(nil, apBot, apAlice, apBob)
	r.sync(departure("$alice-back", apAlice, apAlice, "join"), mx.Reaction("$yes", apAlice, 6000, "$card", "✅"))
	if c := r.call("c1"); c.State != journal.ApprovalWithdrawn {
		t.Fatalf("after alice came back and voted the call is %+v; a decision is final", c)
	}
	// Kicked on the homeserver but not yet in this batch: nothing.
	r.hs.set(errors.New("unreachable"))
	r.syncs++
	err := r.a.apply(r.ctx, "s20", &matrix.SyncBatch{NextBatch: "s21", Joined: []matrix.RoomTimeline{{RoomID: apRoom,
		Events: []json.RawMessage{departure("$dave-banned", apBob, apDave, "ban").JSON()}}}})
	if err == nil {
		t.Fatal("a departure whose room's members could not be read was admitted; a crash would lose it")
	}
	r.hs.set(nil, apBot, apBob)
	r.syncWithState(nil, departure("$dave-banned", apBob, apDave, "ban"))
	if c := r.call("c2"); c.State != journal.ApprovalWithdrawn {
		t.Fatalf("after dave's ban the call is %+v, want withdrawn", c)
	}
}

func TestTheSweepExpiresWhatNobodyDecidedInTime(t *testing.T) {
	r := newApprovalRig(t)
	c1 := r.ask("c1")
	r.sendCard("c1", "$card")
	r.clock.set(r.clock.Now().Add(time.Minute))
	r.ask("c2") // never sent
	next, err := r.a.sweepApprovals(r.ctx)
	if err != nil || next.UnixMilli() != c1.ExpiresMS {
		t.Fatalf("sweep = %v, %v; want nothing due and c1's expiry next", next, err)
	}
	r.clock.set(time.UnixMilli(c1.ExpiresMS))
	next, err = r.a.sweepApprovals(r.ctx)
	if err != nil || next.IsZero() {
		t.Fatalf("sweep = %v, %v; want c2 next", next, err)
	}
	c := r.call("c1")
	if c.State != journal.ApprovalExpired || c.Reason != reasonExpired || r.edit("c1").State != journal.DeliveryQueued {
		t.Fatalf("at its expiry c1 is %+v, want expired, its card edited", c)
	}
	if c := r.call("c2"); c.State != journal.ApprovalOpen {
		t.Fatalf("c2 is %+v before its expiry", c)
	}
	r.clock.set(r.clock.Now().Add(time.Minute))
	if next, err = r.a.sweepApprovals(r.ctx); err != nil || !next.IsZero() {
		t.Fatalf("sweep = %v, %v; want nothing left", next, err)
	}
	if c := r.call("c2"); c.State != journal.ApprovalExpired {
		t.Fatalf("c2 is %+v, want expired", c)
	}
	if card, err := r.v.Delivery(r.ctx, journal.ApprovalDeliveryID("c2"), journal.StageInitial); err != nil || card.State != journal.DeliveryRetired {
		t.Fatalf("c2's card, never sent, is %+v, %v; want retired", card, err)
	}
}

func TestTheTurnWaitsForItsCallAndIsOfferedAgainWithTheDecision(t *testing.T) {
	r := newApprovalRig(t)
	if err := r.offer("$q"); err != nil {
		t.Fatal(err)
	}
	c := r.call("c1")
	if c.State != journal.ApprovalOpen || c.ExpiresMS != r.clock.Now().Add(10*time.Minute).UnixMilli() ||
		!slices.Equal(c.Approvers, []string{apAlice}) {
		t.Fatalf("the agent's call is %+v, want open for ten minutes, alice deciding", c)
	}
	if err := r.offer("$q"); err != nil {
		t.Fatal(err)
	}
	if n := len(r.agent.offered()); n != 1 {
		t.Fatalf("the agent was offered the turn %d times while its call was open, want once", n)
	}
	r.sendCard("c1", "$card")
	r.sync(mx.Reaction("$yes", apAlice, 2000, "$card", "✅"))
	if got := r.pendingIDs(); !slices.Equal(got, []string{"$q"}) {
		t.Fatalf("pending = %v", got)
	}
	if err := r.offer("$q"); err != nil {
		t.Fatal(err)
	}
	turns := r.agent.offered()
	if len(turns) != 2 || len(turns[1].Approvals) != 1 || turns[1].Approvals[0].State != journal.ApprovalApproved ||
		turns[1].Approvals[0].DecidedBy != apAlice {
		t.Fatalf("the turns offered = %+v, want the second with c1 approved by alice", turns)
	}
	if got := r.pendingIDs(); len(got) != 0 {
		t.Fatalf("pending = %v, want the turn answered", got)
	}
	d, err := r.v.Delivery(r.ctx, journal.ReplyDeliveryID("$q"), journal.StageFinal)
	if err != nil || !strings.Contains(string(d.Content), "c1 approved by "+apAlice) {
		t.Fatalf("the answer = %s, %v", d.Content, err)
	}
}

func TestAnAgentThatAsksAgainAboutADecidedCallFailsItsTurn(t *testing.T) {
	r := newApprovalRig(t)
	r.agent.reply = func(agent.Turn) agent.Reply {
		return agent.Reply{Approval: &agent.ApprovalAsk{CallID: "c1", Tool: "send_mail",
			Arguments: json.RawMessage(`{"to":"bob@example.org"}`)}}
	}
	if err := r.offer("$q"); err != nil {
		t.Fatal(err)
	}
	if c := r.call("c1"); c.ExpiresMS != r.clock.Now().Add(DefaultApprovalExpiry).UnixMilli() {
		t.Fatalf("expires %d, want the default an hour ahead", c.ExpiresMS)
	}
	r.sendCard("c1", "$card")
	r.sync(reply("$no", apAlice, 2000, "$card", "no"))
	if err := r.offer("$q"); err == nil || !strings.Contains(err.Error(), "already denied") {
		t.Fatalf("asking again about a denied call = %v, want the turn failed", err)
	}
	if got := r.pendingIDs(); !slices.Equal(got, []string{"$q"}) {
		t.Fatalf("pending = %v, want the turn still owed", got)
	}
}

func TestWithoutAnAgentTheLoopJudgesWhatACrashLeftAndExpiresOnTime(t *testing.T) {
	r := newApprovalRig(t)
	r.a.deps.Agent = nil
	bus := &hint.Bus{}
	r.a.deps.Hints = bus
	r.ask("c1")
	r.sendCard("c1", "$card1")
	c2 := r.ask("c2")
	// Admitted, and the process died before it was judged.
	if _, err := r.v.AdmitBatch(r.ctx, mx.Live(apRoom, mx.Reaction("$yes", apAlice, 2000, "$card1", "✅")), "s5"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan error, 1)
	go func() { done <- r.a.approvalsLoop(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	r.await("c1", journal.ApprovalApproved)
	if c := r.call("c2"); c.State != journal.ApprovalOpen {
		t.Fatalf("c2 is %+v before its expiry", c)
	}
	// The journal's clock passes the expiry; a commit wakes the sweep.
	r.clock.set(time.UnixMilli(c2.ExpiresMS))
	bus.Publish([]hint.Hint{{Principal: r.v.Principal().String()}})
	r.await("c2", journal.ApprovalExpired)
}

// await waits until callID is in state.
func (r *approvalRig) await(callID string, state journal.ApprovalState) {
	r.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		c := r.call(callID)
		if c.State == state {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s is %+v, want %s", callID, c, state)
		}
	}
}

func TestTheAgentsOwnApprovalKeysDecideAndTheDefaultsDoNot(t *testing.T) {
	r := newApprovalRig(t)
	r.a.deps.ApprovalKeys = journal.ApprovalKeys{Approve: "👍", Deny: "👎"}
	r.ask("c1")
	r.sendCard("c1", "$card")
	r.sync(mx.Reaction("$tick", apAlice, 2000, "$card", "✅"))
	if c := r.call("c1"); c.State != journal.ApprovalOpen {
		t.Fatalf("after a default key the call is %+v; only the agent's keys decide", c)
	}
	r.sync(mx.Reaction("$thumb", apAlice, 2001, "$card", "👍"))
	if c := r.call("c1"); c.State != journal.ApprovalApproved || c.DecisionEventID != "$thumb" {
		t.Fatalf("after the agent's approve key the call is %+v", c)
	}
}
