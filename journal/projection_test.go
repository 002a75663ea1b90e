package journal_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// memProjection is journal.ProjectionStore over maps: the rules decide, the
// maps only remember, so each case reads as the rule it checks.
type memProjection struct {
	seq        int64 // the event being projected
	journal    map[string]*journal.Event
	tombstones map[string]bool
	visible    map[string]*memRow
	held       map[heldKey]journal.HeldEdit
	settled    map[string]bool
}

type heldKey struct{ room, target, sender string }

type memRow struct {
	key  int64
	ev   *journal.Event
	rev  journal.Revision
	body []byte
	owes bool
}

func newMemProjection() *memProjection {
	return &memProjection{journal: map[string]*journal.Event{}, tombstones: map[string]bool{},
		visible: map[string]*memRow{}, held: map[heldKey]journal.HeldEdit{}, settled: map[string]bool{}}
}

func k(parts ...string) string { return fmt.Sprint(parts) }

func (m *memProjection) ProbeOriginal(room, id string) (bool, bool, error) {
	held := false
	for key := range m.held {
		held = held || (key.room == room && key.target == id)
	}
	return m.tombstones[k(room, id)], held, nil
}
func (m *memProjection) Tombstoned(room, id string) (bool, error) {
	return m.tombstones[k(room, id)], nil
}
func (m *memProjection) Tombstone(room, id string) error {
	m.tombstones[k(room, id)] = true
	return nil
}
func (m *memProjection) Journaled(room, id string) (bool, error) {
	ev, ok := m.journal[id]
	return ok && ev.RoomID == room, nil
}
func (m *memProjection) EditTarget(room, id string) (string, bool, error) {
	ev, ok := m.journal[id]
	if !ok || ev.RoomID != room || ev.Kind != journal.KindEdit {
		return "", false, nil
	}
	return ev.Target, true, nil
}
func (m *memProjection) Visible(room, id string) (journal.VisibleRow, bool, error) {
	r, ok := m.visible[k(room, id)]
	if !ok {
		return journal.VisibleRow{}, false, nil
	}
	return journal.VisibleRow{Key: r.key, Sender: r.ev.Sender, Revision: r.rev}, true, nil
}
func (m *memProjection) row(key int64) *memRow {
	for _, r := range m.visible {
		if r.key == key {
			return r
		}
	}
	panic("no row")
}
func (m *memProjection) AddVisible(ev *journal.Event, rev journal.Revision, body []byte, owes bool) error {
	m.visible[k(ev.RoomID, ev.ID)] = &memRow{key: m.seq, ev: ev, rev: rev, body: body, owes: owes}
	return nil
}
func (m *memProjection) ReviseVisible(row journal.VisibleRow, rev journal.Revision, body []byte, owes bool) error {
	r := m.row(row.Key)
	r.rev, r.body, r.owes = rev, body, owes
	return nil
}
func (m *memProjection) DropVisible(row journal.VisibleRow) error {
	r := m.row(row.Key)
	delete(m.visible, k(r.ev.RoomID, r.ev.ID))
	return nil
}
func (m *memProjection) ClearVisible(row journal.VisibleRow, revisionID string) error {
	if r := m.row(row.Key); r.rev.EventID == revisionID {
		r.body, r.owes = nil, true
	}
	return nil
}
func (m *memProjection) HeldEdit(room, target, sender string) (journal.HeldEdit, bool, error) {
	h, ok := m.held[heldKey{room, target, sender}]
	return h, ok, nil
}
func (m *memProjection) HoldEdit(room, target, sender string, h journal.HeldEdit) error {
	m.held[heldKey{room, target, sender}] = h
	return nil
}
func (m *memProjection) TakeHeldEdits(room, target string) (map[string]journal.HeldEdit, error) {
	out := map[string]journal.HeldEdit{}
	for key, h := range m.held {
		if key.room == room && key.target == target {
			out[key.sender] = h
			delete(m.held, key)
		}
	}
	return out, nil
}
func (m *memProjection) DropHeldEdits(room, target string) error {
	_, err := m.TakeHeldEdits(room, target)
	return err
}
func (m *memProjection) ClearHeldEdit(room, editID string) error {
	for key, h := range m.held {
		if h.Revision.EventID == editID {
			h.Body = nil
			m.held[key] = h
		}
	}
	return nil
}
func (m *memProjection) Settle(room, id string) error {
	m.settled[id] = true
	return nil
}

const (
	alice = "@alice:example.org"
	bob   = "@bob:example.org"
	self  = "@bot:example.org"
)

// admit journals and projects each event once, as admission does.
func (m *memProjection) admit(t *testing.T, departed bool, raws ...string) {
	t.Helper()
	for _, raw := range raws {
		ev, err := journal.ParseEvent(journal.Inbound{RoomID: parseRoom, Provenance: journal.Live, Event: json.RawMessage(raw)}, parseNow)
		if err != nil {
			t.Fatalf("parse %s: %v", raw, err)
		}
		if _, dup := m.journal[ev.ID]; dup {
			continue
		}
		m.seq++
		m.journal[ev.ID] = ev
		if err := journal.Project(m, ev, self, departed); err != nil {
			t.Fatalf("Project(%s): %v", ev.ID, err)
		}
	}
}

// screen renders the visible rows oldest first: "id=body" or "id owes".
func (m *memProjection) screen() []string {
	rows := make([]*memRow, 0, len(m.visible))
	for _, r := range m.visible {
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].ev.TS < rows[j].ev.TS })
	out := []string{}
	for _, r := range rows {
		if r.owes {
			out = append(out, r.ev.ID+" owes")
			continue
		}
		var c struct {
			Body string `json:"body"`
		}
		_ = json.Unmarshal(r.body, &c)
		out = append(out, r.ev.ID+"="+c.Body)
	}
	return out
}

func msgEv(id, sender string, ts int, body string) string {
	return fmt.Sprintf(`{"event_id":%q,"type":"m.room.message","sender":%q,"origin_server_ts":%d,"content":{"msgtype":"m.text","body":%q}}`,
		id, sender, ts, body)
}

func editEv(id, sender string, ts int, target, body string) string {
	return fmt.Sprintf(`{"event_id":%q,"type":"m.room.message","sender":%q,"origin_server_ts":%d,"content":{"msgtype":"m.text","body":"* x",`+
		`"m.new_content":{"msgtype":"m.text","body":%q},"m.relates_to":{"rel_type":"m.replace","event_id":%q}}}`, id, sender, ts, body, target)
}

func streamEv(id string, ts int, target, body, status string) string {
	return fmt.Sprintf(`{"event_id":%q,"type":"m.room.message","sender":%q,"origin_server_ts":%d,"content":{"body":"* x",`+
		`"m.new_content":{"body":%q,"io.mindroom.stream_status":%q},"m.relates_to":{"rel_type":"m.replace","event_id":%q}}}`, id, self, ts, body, status, target)
}

func redactEv(id, sender string, ts int, target string) string {
	return fmt.Sprintf(`{"event_id":%q,"type":"m.room.redaction","sender":%q,"origin_server_ts":%d,"redacts":%q,"content":{}}`, id, sender, ts, target)
}

func reactEv(id string, ts int, target string) string {
	return fmt.Sprintf(`{"event_id":%q,"type":"m.reaction","sender":%q,"origin_server_ts":%d,"content":{"m.relates_to":{"rel_type":"m.annotation","event_id":%q,"key":"+1"}}}`,
		id, alice, ts, target)
}

func encryptedEv(id string, ts int) string {
	return fmt.Sprintf(`{"event_id":%q,"type":"m.room.encrypted","sender":%q,"origin_server_ts":%d,"content":{"algorithm":"m.megolm.v1.aes-sha2"}}`, id, alice, ts)
}

func sidecarEv(id string, ts int) string {
	return fmt.Sprintf(`{"event_id":%q,"type":"m.room.message","sender":%q,"origin_server_ts":%d,"content":{"msgtype":"m.text","body":"preview",`+
		`"io.mindroom.long_text":{"version":2,"encoding":"matrix_event_content_json"},"url":"mxc://x/y"}}`, id, alice, ts)
}

func TestTheProjectionRules(t *testing.T) {
	for _, c := range []struct {
		name    string
		events  []string
		screen  []string
		held    int
		settled []string
	}{
		{"AnOriginalIsShown", []string{msgEv("$m", alice, 1000, "hi")}, []string{"$m=hi"}, 0, nil},
		{"TheAuthorsNewerEditApplies", []string{msgEv("$m", alice, 1000, "hi"), editEv("$e", alice, 2000, "$m", "edited")},
			[]string{"$m=edited"}, 0, nil},
		{"AnOlderEditDoesNotWin", []string{msgEv("$m", alice, 1000, "hi"), editEv("$e2", alice, 3000, "$m", "new"), editEv("$e1", alice, 2000, "$m", "old")},
			[]string{"$m=new"}, 0, nil},
		{"EqualTimestampsAreOrderedByEventID", []string{msgEv("$m", alice, 1000, "hi"), editEv("$eB", alice, 2000, "$m", "b"), editEv("$eA", alice, 2000, "$m", "a")},
			[]string{"$m=b"}, 0, nil},
		{"AStrangersEditNeverApplies", []string{msgEv("$m", alice, 1000, "hi"), editEv("$e", bob, 2000, "$m", "hijack")},
			[]string{"$m=hi"}, 0, nil},
		{"AnEditBeforeItsOriginalIsHeldThenApplied", []string{editEv("$e", alice, 2000, "$m", "edited"), msgEv("$m", alice, 1000, "hi")},
			[]string{"$m=edited"}, 0, nil},
		{"AStrangerCannotEvictTheAuthorsHeldEdit", []string{editEv("$e", alice, 2000, "$m", "edited"), editEv("$x", bob, 3000, "$m", "hijack"),
			msgEv("$m", alice, 1000, "hi")}, []string{"$m=edited"}, 0, nil},
		{"AnEditWaitsOnlyForAnUnknownTarget", []string{editEv("$e", alice, 2000, "$m", "edited")}, []string{}, 1, nil},
		{"AnEditOfAJournaledButHiddenTargetIsDropped", []string{encryptedEv("$enc", 1000), editEv("$e", alice, 2000, "$enc", "edited")},
			[]string{}, 0, nil},
		{"AnyArrivalOfTheTargetResolvesItsHeldEdits", []string{editEv("$e", alice, 2000, "$enc", "edited"), encryptedEv("$enc", 1000)},
			[]string{}, 0, nil},
		{"RedactingTheOriginalRemovesTheMessage", []string{msgEv("$m", alice, 1000, "hi"), redactEv("$x", alice, 2000, "$m")},
			[]string{}, 0, []string{"$m"}},
		{"RedactingTheRevisionOnScreenOwesARefetch", []string{msgEv("$m", alice, 1000, "hi"), editEv("$e", alice, 2000, "$m", "edited"),
			redactEv("$x", alice, 3000, "$e")}, []string{"$m owes"}, 0, []string{"$e"}},
		{"RedactingASupersededEditChangesNothing", []string{msgEv("$m", alice, 1000, "hi"), editEv("$e1", alice, 2000, "$m", "one"),
			editEv("$e2", alice, 3000, "$m", "two"), redactEv("$x", alice, 4000, "$e1")}, []string{"$m=two"}, 0, []string{"$e1"}},
		{"AnEditRedactedBeforeItArrivesKeepsItsPlaceBodiless", []string{msgEv("$m", alice, 1000, "hi"), redactEv("$x", alice, 3000, "$e"),
			editEv("$e", alice, 2000, "$m", "gone")}, []string{"$m owes"}, 0, []string{"$e"}},
		{"ARedactedHeldEditOwesARefetchWhenItsOriginalLands", []string{editEv("$e", alice, 2000, "$m", "gone"), redactEv("$x", alice, 3000, "$e"),
			msgEv("$m", alice, 1000, "hi")}, []string{"$m owes"}, 0, []string{"$e"}},
		{"AnOriginalRedactedBeforeItArrivesNeverShows", []string{redactEv("$x", alice, 3000, "$m"), msgEv("$m", alice, 1000, "hi")},
			[]string{}, 0, []string{"$m"}},
		{"AnEditOfARedactedTargetIsNeverHeld", []string{redactEv("$x", alice, 3000, "$m"), editEv("$e", alice, 2000, "$m", "words")},
			[]string{}, 0, []string{"$m"}},
		{"OwnStreamingProgressNeverReachesTheScreen", []string{msgEv("$m", self, 1000, "..."), streamEv("$s1", 1500, "$m", "partial", "streaming"),
			streamEv("$s2", 2000, "$m", "done", "completed")}, []string{"$m=done"}, 0, nil},
		{"ASidecarPreviewOwesARefetch", []string{sidecarEv("$m", 1000)}, []string{"$m owes"}, 0, nil},
		{"AReactionRedactedBeforeItArrivesIsSettled", []string{redactEv("$x", alice, 3000, "$r"), reactEv("$r", 2000, "$m")}, []string{}, 0, []string{"$r"}},
		{"ARedactedRedactionIsSettled", []string{redactEv("$y", alice, 4000, "$x"), redactEv("$x", alice, 3000, "$m")}, []string{}, 0, []string{"$m", "$x"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMemProjection()
			m.admit(t, false, c.events...)
			if got := m.screen(); !slices.Equal(got, c.screen) {
				t.Errorf("screen = %v, want %v", got, c.screen)
			}
			if got := len(m.held); got != c.held {
				t.Errorf("held edits = %d, want %d", got, c.held)
			}
			// What the rules asked to settle; the store settles only what is
			// still pending.
			var settled []string
			for id := range m.settled {
				settled = append(settled, id)
			}
			sort.Strings(settled)
			if !slices.Equal(settled, c.settled) {
				t.Errorf("settled = %v, want %v", settled, c.settled)
			}
		})
	}
}

func TestNothingIsProjectedWhileOutOfTheRoom(t *testing.T) {
	m := newMemProjection()
	m.admit(t, false, editEv("$e", alice, 2000, "$m", "edited"))
	m.admit(t, true, msgEv("$m", alice, 1000, "hi"), redactEv("$x", alice, 3000, "$q"))
	if got := m.screen(); len(got) != 0 {
		t.Fatalf("screen = %v, want nothing", got)
	}
	if len(m.held) != 0 || len(m.tombstones) != 0 {
		t.Fatalf("held %v, tombstones %v; want neither", m.held, m.tombstones)
	}
}
