package journal_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// memRefetch adds journal.RefetchStore to the in-memory projection: a
// row's refresh token is the key of the event that put the debt on it.
type memRefetch struct {
	*memProjection
	epoch    int64
	departed bool
	tokens   map[int64]int64 // row key -> token
}

func (m *memRefetch) Membership(string) (int64, bool, error) { return m.epoch, m.departed, nil }
func (m *memRefetch) Debt(room, id string) (journal.VisibleRow, int64, bool, error) {
	row, ok, _ := m.Visible(room, id)
	if !ok || !m.row(row.Key).owes {
		return row, 0, ok, nil
	}
	return row, m.tokens[row.Key], true, nil
}
func (m *memRefetch) JournalEdit(e *journal.Event) error {
	if _, ok := m.journal[e.ID]; !ok {
		m.journal[e.ID] = e
	}
	return nil
}
func (m *memRefetch) InstallRevision(row journal.VisibleRow, rev journal.Revision, body []byte) error {
	r := m.row(row.Key)
	r.rev, r.body, r.owes = rev, body, false
	return nil
}

func parsed(t *testing.T, raw string) *journal.Event {
	t.Helper()
	ev, err := journal.ParseEvent(journal.Inbound{RoomID: parseRoom, Provenance: journal.History, Event: json.RawMessage(raw)}, parseNow)
	if err != nil {
		t.Fatalf("parse %s: %v", raw, err)
	}
	return ev
}

// redactedCopy is an event as a server hands it over once redacted: its
// content, relation included, stripped.
func redactedCopy(id, sender string, ts int) string {
	return fmt.Sprintf(`{"event_id":%q,"type":"m.room.message","sender":%q,"origin_server_ts":%d,"content":{},`+
		`"unsigned":{"redacted_because":{"type":"m.room.redaction"}}}`, id, sender, ts)
}

func TestAnEventTheServerHandsOverRedactedNeverShows(t *testing.T) {
	for _, c := range []struct {
		name   string
		events []string
		screen []string
	}{
		{"AloneItAddsNothing", []string{redactedCopy("$m", alice, 1000)}, []string{}},
		{"ItTakesDownTheRowOfItsLiveCopy", []string{msgEv("$m", alice, 1000, "hi"), redactedCopy("$m", alice, 1000)}, []string{}},
		{"ALaterLiveCopyCannotResurrectIt", []string{redactedCopy("$m", alice, 1000), msgEv("$m", alice, 1000, "hi")}, []string{}},
		{"ARedactedEditLeavesTheOriginalShown", []string{msgEv("$m", alice, 1000, "hi"), redactedCopy("$e", alice, 2000)}, []string{"$m=hi"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMemProjection()
			// Each copy is projected, as history re-projects what it fetches.
			for _, raw := range c.events {
				ev := parsed(t, raw)
				m.seq++
				if _, seen := m.journal[ev.ID]; !seen {
					m.journal[ev.ID] = ev
				}
				if err := journal.Reproject(m, ev, self); err != nil {
					t.Fatal(err)
				}
			}
			if got := m.screen(); !slices.Equal(got, c.screen) {
				t.Errorf("screen = %v, want %v", got, c.screen)
			}
		})
	}
}

func TestReprojectingHistoryRebuildsOnlyWhatIsMissing(t *testing.T) {
	m := newMemProjection()
	m.admit(t, false, msgEv("$a", alice, 1000, "a"), editEv("$e", alice, 2000, "$a", "a2"))
	// The fence took $b's row; $a is still on screen.
	m.admit(t, false, msgEv("$b", bob, 1500, "b"))
	delete(m.visible, k(parseRoom, "$b"))
	for _, raw := range []string{editEv("$e", alice, 2000, "$a", "a2"), msgEv("$b", bob, 1500, "b"), msgEv("$a", alice, 1000, "a")} {
		m.seq++
		if err := journal.Reproject(m, parsed(t, raw), self); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := m.screen(), []string{"$a=a2", "$b=b"}; !slices.Equal(got, want) {
		t.Fatalf("screen = %v, want %v", got, want)
	}
}

func TestThePointRefetchRules(t *testing.T) {
	const epoch = 3
	// Every case starts from $m edited by $e1 then $e2, with $e2 redacted:
	// the row owes a refetch under token 4 (the redaction's key).
	setup := func(t *testing.T) *memRefetch {
		m := &memRefetch{memProjection: newMemProjection(), epoch: epoch, tokens: map[int64]int64{}}
		m.admit(t, false, msgEv("$m", alice, 1000, "hi"), editEv("$e1", alice, 2000, "$m", "one"),
			editEv("$e2", alice, 3000, "$m", "two"), redactEv("$x", alice, 4000, "$e2"))
		row, _, _ := m.Visible(parseRoom, "$m")
		m.tokens[row.Key] = 4
		return m
	}
	debt := journal.RefreshDebt{RoomID: parseRoom, EventID: "$m", Epoch: epoch, Token: 4}
	for _, c := range []struct {
		name    string
		change  func(m *memRefetch)
		debt    journal.RefreshDebt
		orig    string
		edits   []string
		outcome journal.RefetchOutcome
		err     error
		screen  []string
	}{
		{name: "TheServersRevisionIsInstalled", debt: debt, orig: msgEv("$m", alice, 1000, "hi"),
			edits:   []string{editEv("$e1", alice, 2000, "$m", "one"), redactedCopy("$e2", alice, 3000)},
			outcome: journal.RefetchInstalled, screen: []string{"$m=one"}},
		{name: "TheOriginalWinsWhenEveryEditIsGone", debt: debt, orig: msgEv("$m", alice, 1000, "hi"),
			edits: []string{redactedCopy("$e2", alice, 3000)}, outcome: journal.RefetchInstalled, screen: []string{"$m=hi"}},
		{name: "AStrangersEditIsNoCandidate", debt: debt, orig: msgEv("$m", alice, 1000, "hi"),
			edits: []string{editEv("$z", bob, 9000, "$m", "hijack")}, outcome: journal.RefetchInstalled, screen: []string{"$m=hi"}},
		{name: "ARevisionRedactedHereIsRefused", debt: debt, orig: msgEv("$m", alice, 1000, "hi"),
			edits: []string{editEv("$e2", alice, 3000, "$m", "two")}, err: journal.ErrRefetchRefused, screen: []string{"$m owes"}},
		{name: "ASidecarPreviewIsRefused", debt: debt, orig: sidecarEv("$m", 1000), err: journal.ErrRefetchRefused, screen: []string{"$m owes"}},
		{name: "AChangedTokenMeansSomethingNewerWon", debt: journal.RefreshDebt{RoomID: parseRoom, EventID: "$m", Epoch: epoch, Token: 3},
			orig: msgEv("$m", alice, 1000, "hi"), outcome: journal.RefetchSuperseded, screen: []string{"$m owes"}},
		{name: "AnEndedMembershipInstallsNothing", debt: debt, change: func(m *memRefetch) { m.epoch++ },
			orig: msgEv("$m", alice, 1000, "hi"), outcome: journal.RefetchSuperseded, screen: []string{"$m owes"}},
		{name: "NothingIsInstalledWhileOutOfTheRoom", debt: debt, change: func(m *memRefetch) { m.departed = true },
			orig: msgEv("$m", alice, 1000, "hi"), outcome: journal.RefetchSuperseded, screen: []string{"$m owes"}},
		{name: "AnOriginalRedactedOnTheServerGoes", debt: debt, orig: redactedCopy("$m", alice, 1000),
			outcome: journal.RefetchGone, screen: []string{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := setup(t)
			if c.change != nil {
				c.change(m)
			}
			r := journal.Refetched{Debt: c.debt, Original: parsed(t, c.orig)}
			for _, e := range c.edits {
				r.Edits = append(r.Edits, parsed(t, e))
			}
			outcome, err := journal.ApplyRefetch(m, r, self)
			if !errors.Is(err, c.err) || (c.err == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, c.err)
			}
			if outcome != c.outcome {
				t.Errorf("outcome = %v, want %v", outcome, c.outcome)
			}
			if got := m.screen(); !slices.Equal(got, c.screen) {
				t.Errorf("screen = %v, want %v", got, c.screen)
			}
		})
	}
}

func TestAHistoryEditWaitsForAFencedTargetTheWalkBringsBack(t *testing.T) {
	for _, c := range []struct {
		name string
		prov journal.Provenance
		want []string
	}{
		{"History", journal.History, []string{"$a=a2"}},
		// Live, a target the journal holds but does not show never projects.
		{"Live", journal.Live, []string{"$a=a"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMemProjection()
			m.admit(t, false, msgEv("$a", alice, 1000, "a"))
			delete(m.visible, k(parseRoom, "$a")) // the fence took its row
			edit, err := journal.ParseEvent(journal.Inbound{RoomID: parseRoom, Provenance: c.prov,
				Event: json.RawMessage(editEv("$e", alice, 2000, "$a", "a2"))}, parseNow)
			if err != nil {
				t.Fatal(err)
			}
			m.seq++
			m.journal[edit.ID] = edit
			if err := journal.Project(m, edit, self, false); err != nil {
				t.Fatal(err)
			}
			m.seq++
			if err := journal.Reproject(m, parsed(t, msgEv("$a", alice, 1000, "a")), self); err != nil {
				t.Fatal(err)
			}
			if got := m.screen(); !slices.Equal(got, c.want) {
				t.Fatalf("screen = %v, want %v", got, c.want)
			}
		})
	}
}

func TestNoRedactedBodyStaysOnScreenWhicheverWayItCame(t *testing.T) {
	t.Run("AnEditARefetchInstalledIsTakenDownByItsRedaction", func(t *testing.T) {
		m := &memRefetch{memProjection: newMemProjection(), tokens: map[int64]int64{}}
		m.admit(t, false, sidecarEv("$m", 1000))
		row, _, _ := m.Visible(parseRoom, "$m")
		m.tokens[row.Key] = 1
		// The server holds an edit the journal never saw.
		r := journal.Refetched{Debt: journal.RefreshDebt{RoomID: parseRoom, EventID: "$m", Token: 1},
			Original: parsed(t, sidecarEv("$m", 1000)), Edits: []*journal.Event{parsed(t, editEv("$e", alice, 2000, "$m", "secret"))}}
		if outcome, err := journal.ApplyRefetch(m, r, self); err != nil || outcome != journal.RefetchInstalled {
			t.Fatalf("ApplyRefetch = %v, %v", outcome, err)
		}
		m.admit(t, false, redactEv("$x", bob, 3000, "$e"))
		if got := m.screen(); !slices.Equal(got, []string{"$m owes"}) {
			t.Fatalf("screen = %v, want the redacted body gone", got)
		}
	})
	t.Run("AnEditOnScreenIsTakenDownByItsRedactedCopy", func(t *testing.T) {
		m := newMemProjection()
		m.admit(t, false, msgEv("$m", alice, 1000, "hi"), editEv("$e", alice, 2000, "$m", "secret"))
		m.seq++
		if err := journal.Reproject(m, parsed(t, redactedCopy("$e", alice, 2000)), self); err != nil {
			t.Fatal(err)
		}
		if got := m.screen(); !slices.Equal(got, []string{"$m owes"}) {
			t.Fatalf("screen = %v, want the redacted body gone", got)
		}
	})
}

func TestARedactedReactionIsAcceptedAsContextAndAnUnredactedOneNeedsItsRelation(t *testing.T) {
	redacted := `{"event_id":"$r","type":"m.reaction","sender":"@a:x","origin_server_ts":1000,"content":{},` +
		`"unsigned":{"redacted_because":{"type":"m.room.redaction"}}}`
	ev, err := journal.ParseEvent(journal.Inbound{RoomID: "!room:x", Provenance: journal.History, Event: json.RawMessage(redacted)}, time.UnixMilli(2000))
	if err != nil {
		t.Fatalf("a redacted reaction was rejected: %v", err)
	}
	if !ev.Redacted || ev.Kind != journal.KindOther || ev.Target != "" {
		t.Fatalf("parsed as %+v, want a redacted event of no kind that shows", ev)
	}
	bare := `{"event_id":"$r","type":"m.reaction","sender":"@a:x","origin_server_ts":1000,"content":{}}`
	if _, err := journal.ParseEvent(journal.Inbound{RoomID: "!room:x", Provenance: journal.Live, Event: json.RawMessage(bare)}, time.UnixMilli(2000)); err == nil {
		t.Fatal("a reaction without a relation, not redacted, was accepted")
	}
}
