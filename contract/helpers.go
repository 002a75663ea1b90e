package contract

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// The suite speaks for one bot account in one room unless a test says
// otherwise. Timestamps are small positive milliseconds so they are valid
// under any backend clock that reads a date after 1970.
const (
	room      = "!room:example.org"
	otherRoom = "!elsewhere:example.org"
	agentName = "helper"
	botUser   = "@bot:example.org"
	alice     = "@alice:example.org"
	bob       = "@bob:example.org"
	mallory   = "@mallory:example.org"
)

// farFuture is 2200-01-01 in milliseconds: absurd for any clock this suite
// will ever run under, unlike a date a few years ahead.
const farFuture = int64(7258118400000)

// fixture is one fresh backend, its open store and the default bot view.
type fixture struct {
	t *testing.T
	b Backend
	s journal.Store
	v journal.PrincipalStore
}

func newFixture(t *testing.T, f Factory) *fixture {
	t.Helper()
	fx := &fixture{t: t, b: f(t)}
	fx.s = fx.b.Open(t)
	fx.v = fx.principal(agentName, botUser)
	return fx
}

// principal returns the view of (agent, user) on the current store.
func (fx *fixture) principal(agent, user string) journal.PrincipalStore {
	fx.t.Helper()
	v, err := fx.s.Principal(context.Background(), agent, user)
	if err != nil {
		fx.t.Fatalf("Principal(%q, %q): %v", agent, user, err)
	}
	return v
}

// restart closes the store and opens it again at the same location, as a
// process restart would; the default view is bound afresh. Views taken
// before the restart must not be used afterwards.
func (fx *fixture) restart() {
	fx.t.Helper()
	if err := fx.s.Close(); err != nil {
		fx.t.Fatalf("Close: %v", err)
	}
	fx.s = fx.b.Open(fx.t)
	fx.v = fx.principal(agentName, botUser)
}

// admit runs one batch on v and fails the test on a batch-level error.
func (fx *fixture) admit(v journal.PrincipalStore, in []journal.Inbound, token string) []journal.AdmitResult {
	fx.t.Helper()
	res, err := v.AdmitBatch(context.Background(), in, token)
	if err != nil {
		fx.t.Fatalf("AdmitBatch: %v", err)
	}
	if got, want := len(res), len(in); got != want {
		fx.t.Fatalf("AdmitBatch returned %d results for %d events", got, want)
	}
	return res
}

// mustAdmit admits a batch on the default view and requires every event to
// be new.
func (fx *fixture) mustAdmit(in ...journal.Inbound) {
	fx.t.Helper()
	fx.mustAdmitOn(fx.v, in...)
}

func (fx *fixture) mustAdmitOn(v journal.PrincipalStore, in ...journal.Inbound) {
	fx.t.Helper()
	for i, r := range fx.admit(v, in, "") {
		if r.Outcome != journal.Admitted {
			fx.t.Fatalf("event %d (%s): outcome %v (err %v), want admitted", i, r.EventID, r.Outcome, r.Err)
		}
	}
}

// live admits events one batch each, in order, as live sync timelines of
// room, so receipt order is exactly the argument order.
func (fx *fixture) live(evs ...event) {
	fx.t.Helper()
	for _, e := range evs {
		fx.mustAdmit(e.In(room, journal.Live))
	}
}

// pending lists every readable pending event of v in receipt order.
func (fx *fixture) pending(v journal.PrincipalStore) []journal.PendingEvent {
	fx.t.Helper()
	var (
		out   []journal.PendingEvent
		after int64
	)
	for {
		page, err := v.Pending(context.Background(), 7, after)
		if err != nil {
			fx.t.Fatalf("Pending: %v", err)
		}
		out = append(out, page.Events...)
		if !page.More {
			return out
		}
		if page.Next <= after {
			fx.t.Fatalf("Pending did not advance: next %d after %d", page.Next, after)
		}
		after = page.Next
	}
}

// pendingIDs lists the event IDs of v's readable pending events.
func (fx *fixture) pendingIDs(v journal.PrincipalStore) []string {
	fx.t.Helper()
	ids := []string{}
	for _, e := range fx.pending(v) {
		ids = append(ids, e.EventID)
	}
	return ids
}

// read returns one page of a conversation of v, newest messages first.
func (fx *fixture) read(v journal.PrincipalStore, roomID string, thread *string, limit int) journal.Page {
	fx.t.Helper()
	page, err := v.Read(context.Background(), journal.ReadRequest{RoomID: roomID, Thread: thread, Limit: limit})
	if err != nil {
		fx.t.Fatalf("Read(%s, %v): %v", roomID, thread, err)
	}
	return page
}

// screen renders what a page shows, one "event_id=content" per message
// oldest first, so a test compares the exact visible bodies at once.
func screen(p journal.Page) []string {
	out := []string{}
	for _, m := range p.Messages {
		out = append(out, m.EventID+"="+string(m.Content))
	}
	return out
}

// owed returns the page's owed refetches, never nil, for comparison.
func owed(p journal.Page) []string {
	if p.OwedRefetch == nil {
		return []string{}
	}
	return p.OwedRefetch
}

// roomScreen reads the whole (small) room conversation of the default view.
func (fx *fixture) roomScreen() []string {
	fx.t.Helper()
	return screen(fx.read(fx.v, room, nil, 100))
}

// latest answers LatestVisibleEventID on the default view.
func (fx *fixture) latest(roomID string, thread *string) (string, bool) {
	fx.t.Helper()
	id, ok, err := fx.v.LatestVisibleEventID(context.Background(), roomID, thread)
	if err != nil {
		fx.t.Fatalf("LatestVisibleEventID(%s, %v): %v", roomID, thread, err)
	}
	return id, ok
}

// settle settles ids on v and returns how many changed.
func (fx *fixture) settle(v journal.PrincipalStore, ids ...string) int {
	fx.t.Helper()
	n, err := v.Settle(context.Background(), ids...)
	if err != nil {
		fx.t.Fatalf("Settle(%v): %v", ids, err)
	}
	return n
}

func ptr(s string) *string { return &s }

// threadName renders a typed thread for messages.
func threadName(th *string) string {
	if th == nil {
		return "<room>"
	}
	return *th
}

// text is the canonical content of a plain text message.
func text(body string) string { return `{"body":"` + body + `","msgtype":"m.text"}` }

// shown is the screen entry of a message showing a plain text body.
func shown(id, body string) string { return id + "=" + text(body) }

// shownReply is the screen entry of a thread reply showing a text body.
func shownReply(id, root, body string) string {
	return id + `={"body":"` + body + `","m.relates_to":{"event_id":"` + root + `","rel_type":"m.thread"},"msgtype":"m.text"}`
}

// event and its builders come from the shared Matrix event package.
type event = mx.Ev

var (
	msg        = mx.Message
	notice     = mx.Notice
	image      = mx.Image
	reply      = mx.ThreadReply
	edit       = mx.Edit
	editWith   = mx.EditContent
	streamEdit = mx.StreamEdit
	reaction   = mx.Reaction
	redaction  = mx.Redaction
	encrypted  = mx.Encrypted
	member     = mx.Member
	sidecar    = mx.Sidecar
	batch      = mx.In
)

// outcomes renders results as "event_id:outcome/class" for comparison.
func outcomes(res []journal.AdmitResult) string {
	parts := make([]string, len(res))
	for i, r := range res {
		parts[i] = fmt.Sprintf("%s:%v", r.EventID, r.Outcome)
		if r.Outcome == journal.Admitted {
			parts[i] += "/" + r.Class.String()
		}
	}
	return strings.Join(parts, " ")
}
