package journal_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// memOutbox is journal.OutboxStore over a map of rows, one room.
type memOutbox struct {
	rows      map[string]*journal.Delivery // delivery/stage
	epoch     int64
	departed  bool
	sources   map[string]int64 // event -> epoch admitted under, in outboxRoom
	settled   []string
	turns     map[string]string
	projected []string
	next      int64
}

const outboxRoom = "!out:example.org"

func newMemOutbox() *memOutbox {
	return &memOutbox{rows: map[string]*journal.Delivery{}, sources: map[string]int64{"$q": 0}, turns: map[string]string{}}
}

func rowKey(id string, stage journal.Stage) string { return id + "/" + stage.String() }

func (m *memOutbox) Delivery(id string, stage journal.Stage) (journal.Delivery, bool, error) {
	d, ok := m.rows[rowKey(id, stage)]
	if !ok {
		return journal.Delivery{}, false, nil
	}
	return *d, true, nil
}
func (m *memOutbox) HasRetiredStage(id string) (bool, error) {
	for _, st := range []journal.Stage{journal.StageInitial, journal.StageFinal} {
		if d, ok := m.rows[rowKey(id, st)]; ok && d.State == journal.DeliveryRetired {
			return true, nil
		}
	}
	return false, nil
}
func (m *memOutbox) Membership(string) (int64, bool, error) { return m.epoch, m.departed, nil }
func (m *memOutbox) Source(id string) (string, int64, bool, error) {
	e, ok := m.sources[id]
	return outboxRoom, e, ok, nil
}
func (m *memOutbox) InsertStage(req journal.EnqueueRequest, txn string, epoch int64) error {
	m.next++
	m.rows[rowKey(req.DeliveryID, req.Stage)] = &journal.Delivery{Position: m.next, DeliveryID: req.DeliveryID, Stage: req.Stage,
		RoomID: req.RoomID, TxnID: txn, TurnID: req.TurnID, Content: req.Content, Epoch: epoch}
	return nil
}
func (m *memOutbox) UpdateStage(d journal.Delivery, req journal.EnqueueRequest, epoch int64) error {
	r := m.rows[rowKey(d.DeliveryID, d.Stage)]
	r.Content, r.Epoch = req.Content, epoch
	return nil
}
func (m *memOutbox) Settle(ids []string) error {
	m.settled = append(m.settled, ids...)
	return nil
}
func (m *memOutbox) MarkAttempted(d journal.Delivery, device, replaces string) error {
	r := m.rows[rowKey(d.DeliveryID, d.Stage)]
	r.State, r.ReplacesEventID, r.Attempts = journal.DeliveryAttempted, replaces, r.Attempts+1
	if r.DeviceID == "" {
		r.DeviceID = device
	}
	return nil
}
func (m *memOutbox) MarkRetired(d journal.Delivery) error {
	if r := m.rows[rowKey(d.DeliveryID, d.Stage)]; r.State == journal.DeliveryQueued {
		r.State = journal.DeliveryRetired
	}
	return nil
}
func (m *memOutbox) MarkAcknowledged(d journal.Delivery, eventID string) error {
	r := m.rows[rowKey(d.DeliveryID, d.Stage)]
	r.State, r.EventID = journal.DeliveryAcknowledged, eventID
	return nil
}
func (m *memOutbox) MarkFailed(d journal.Delivery, reason string, permanent bool) error {
	r := m.rows[rowKey(d.DeliveryID, d.Stage)]
	if r.State != journal.DeliveryQueued && r.State != journal.DeliveryAttempted {
		return nil
	}
	r.LastError = reason
	if permanent {
		r.State = journal.DeliveryFailed
	}
	return nil
}
func (m *memOutbox) AssignDevice(d journal.Delivery, device string) error {
	m.rows[rowKey(d.DeliveryID, d.Stage)].DeviceID = device
	return nil
}
func (m *memOutbox) RecordTurn(rec journal.TurnRecord) error {
	m.turns[rec.TurnID] = ""
	return nil
}
func (m *memOutbox) CompleteTurn(turn, eventID string) error {
	m.turns[turn] = eventID
	return nil
}
func (m *memOutbox) ProjectDelivered(d journal.Delivery, sent journal.Sent) (bool, error) {
	m.projected = append(m.projected, sent.EventID)
	return true, nil
}

var outboxPrincipal = journal.Principal{Agent: "helper", UserID: "@bot:example.org"}

func reply(id string, stage journal.Stage, sources ...string) journal.EnqueueRequest {
	return journal.EnqueueRequest{DeliveryID: id, Stage: stage, RoomID: outboxRoom, TurnID: "turn-" + id,
		Content: json.RawMessage(`{"body":"answer"}`), Sources: sources}
}

func TestTheOutboxRules(t *testing.T) {
	t.Run("AFailureIsRecordedOnAKnownStageAndAPermanentOneTakesItOutOfRecovery", func(t *testing.T) {
		m := newMemOutbox()
		if err := journal.FailStage(m, "nope", journal.StageFinal, "gone", true); !errors.Is(err, journal.ErrNoDelivery) {
			t.Fatalf("failing a stage never enqueued: %v, want %v", err, journal.ErrNoDelivery)
		}
		if _, err := journal.EnqueueStage(m, outboxPrincipal, reply("d1", journal.StageFinal, "$q")); err != nil {
			t.Fatal(err)
		}
		if err := journal.FailStage(m, "d1", journal.StageFinal, "timeout", false); err != nil {
			t.Fatal(err)
		}
		if r := m.rows[rowKey("d1", journal.StageFinal)]; r.State != journal.DeliveryQueued || r.LastError != "timeout" {
			t.Fatalf("after a passing failure the row is %v %q, want queued with its reason", r.State, r.LastError)
		}
		if err := journal.FailStage(m, "d1", journal.StageFinal, "forbidden", true); err != nil {
			t.Fatal(err)
		}
		if r := m.rows[rowKey("d1", journal.StageFinal)]; r.State != journal.DeliveryFailed {
			t.Fatalf("after a permanent failure the row is %v, want failed", r.State)
		}
	})
	t.Run("AnAcknowledgementNamesTheRoomItsCommitWakes", func(t *testing.T) {
		m := newMemOutbox()
		if _, err := journal.EnqueueStage(m, outboxPrincipal, reply("d2", journal.StageFinal, "$q")); err != nil {
			t.Fatal(err)
		}
		if _, err := journal.ClaimStage(m, "d2", journal.StageFinal, "DEV"); err != nil {
			t.Fatal(err)
		}
		res, err := journal.AcknowledgeStage(m, "d2", journal.StageFinal, journal.Sent{EventID: "$sent"})
		if err != nil || !res.First || res.RoomID != outboxRoom {
			t.Fatalf("first acknowledgement = %+v, %v; want First in %s", res, err, outboxRoom)
		}
		if res, err = journal.AcknowledgeStage(m, "d2", journal.StageFinal, journal.Sent{EventID: "$sent"}); err != nil || res.First || res.RoomID != "" {
			t.Fatalf("a repeated acknowledgement = %+v, %v; want nothing to wake", res, err)
		}
	})
	t.Run("AnEnqueueSettlesItsSourcesAndAReplayOfAnAttemptedStageIsFrozen", func(t *testing.T) {
		m := newMemOutbox()
		res, err := journal.EnqueueStage(m, outboxPrincipal, reply("d1", journal.StageFinal, "$q"))
		if err != nil || res.Outcome != journal.EnqueueCreated || res.TxnID != journal.TxnID(outboxPrincipal, "d1", journal.StageFinal) {
			t.Fatalf("first enqueue = %+v, %v", res, err)
		}
		if res, err = journal.EnqueueStage(m, outboxPrincipal, reply("d1", journal.StageFinal, "$q")); err != nil || res.Outcome != journal.EnqueueUpdated {
			t.Fatalf("enqueue again before the claim = %+v, %v", res, err)
		}
		if _, err := journal.ClaimStage(m, "d1", journal.StageFinal, "DEV"); err != nil {
			t.Fatal(err)
		}
		if res, err = journal.EnqueueStage(m, outboxPrincipal, reply("d1", journal.StageFinal, "$q")); err != nil || res.Outcome != journal.EnqueueFrozen {
			t.Fatalf("enqueue after the claim = %+v, %v", res, err)
		}
		if len(m.settled) != 3 {
			t.Fatalf("settled %v, want the source with each enqueue", m.settled)
		}
	})
	for _, c := range []struct {
		name    string
		prepare func(m *memOutbox)
		req     journal.EnqueueRequest
		want    error
	}{
		{"AnEndedMembershipRefuses", func(m *memOutbox) { m.departed = true }, reply("d1", journal.StageFinal), journal.ErrMembershipEnded},
		{"ASourceOfAnEarlierEpochRefuses", func(m *memOutbox) { m.epoch = 1 }, reply("d1", journal.StageFinal, "$q"), journal.ErrMembershipEnded},
		{"AnUnknownSourceRefuses", nil, reply("d1", journal.StageFinal, "$nope"), journal.ErrUnknownSource},
		{"ARetiredStageRefusesItsSibling", func(m *memOutbox) {
			_, _ = journal.EnqueueStage(m, outboxPrincipal, reply("d1", journal.StageInitial))
			_ = journal.RetireStage(m, "d1", journal.StageInitial)
		}, reply("d1", journal.StageFinal), journal.ErrDeliveryRetired},
		{"MalformedContentRefuses", nil, journal.EnqueueRequest{DeliveryID: "d1", Stage: journal.StageFinal, RoomID: outboxRoom,
			Content: json.RawMessage(`{"a":1,"a":2}`)}, journal.ErrInvalidArgument},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMemOutbox()
			if c.prepare != nil {
				c.prepare(m)
			}
			if _, err := journal.EnqueueStage(m, outboxPrincipal, c.req); !errors.Is(err, c.want) {
				t.Fatalf("enqueue = %v, want %v", err, c.want)
			}
		})
	}
	t.Run("AFinalEditsItsAcknowledgedPlaceholderAndCompletesTheTurn", func(t *testing.T) {
		m := newMemOutbox()
		mustEnqueue(t, m, reply("d1", journal.StageInitial), reply("d1", journal.StageFinal))
		if _, err := journal.ClaimStage(m, "d1", journal.StageFinal, "DEV"); err != nil {
			t.Fatal(err) // the unsent placeholder is dropped
		}
		if m.rows[rowKey("d1", journal.StageInitial)].State != journal.DeliveryRetired {
			t.Fatalf("placeholder = %v, want retired", m.rows[rowKey("d1", journal.StageInitial)].State)
		}

		m = newMemOutbox()
		mustEnqueue(t, m, reply("d1", journal.StageInitial), reply("d1", journal.StageFinal))
		if _, err := journal.ClaimStage(m, "d1", journal.StageInitial, "DEV"); err != nil {
			t.Fatal(err)
		}
		if _, err := journal.ClaimStage(m, "d1", journal.StageFinal, "DEV"); !errors.Is(err, journal.ErrStageBlocked) {
			t.Fatalf("final while the placeholder's outcome is unknown = %v, want %v", err, journal.ErrStageBlocked)
		}
		if _, err := journal.AcknowledgeStage(m, "d1", journal.StageInitial, journal.Sent{EventID: "$p", ServerTS: 5}); err != nil {
			t.Fatal(err)
		}
		d, err := journal.ClaimStage(m, "d1", journal.StageFinal, "DEV")
		if err != nil || d.ReplacesEventID != "$p" {
			t.Fatalf("final = %+v, %v; want an edit of $p", d, err)
		}
		ack, err := journal.AcknowledgeStage(m, "d1", journal.StageFinal, journal.Sent{EventID: "$f", ServerTS: 6})
		if err != nil || !ack.First || !ack.Projected || m.turns["turn-d1"] != "$f" {
			t.Fatalf("ack = %+v, %v, turn %q", ack, err, m.turns["turn-d1"])
		}
		again, err := journal.AcknowledgeStage(m, "d1", journal.StageFinal, journal.Sent{EventID: "$other", ServerTS: 7})
		if err != nil || again.First || again.EventID != "$f" {
			t.Fatalf("second ack = %+v, %v; want the first's event", again, err)
		}
		if _, err := journal.ClaimStage(m, "d1", journal.StageInitial, "DEV"); !errors.Is(err, journal.ErrNotClaimable) {
			t.Fatalf("claiming the acknowledged placeholder again = %v", err)
		}
	})
	t.Run("APlaceholderNeverShowsOnceItsFinalOwnsTheDelivery", func(t *testing.T) {
		m := newMemOutbox()
		mustEnqueue(t, m, reply("d1", journal.StageFinal))
		if _, err := journal.ClaimStage(m, "d1", journal.StageFinal, "DEV"); err != nil {
			t.Fatal(err)
		}
		mustEnqueue(t, m, reply("d1", journal.StageInitial)) // late: the answer is already out
		if _, err := journal.ClaimStage(m, "d1", journal.StageInitial, "DEV"); !errors.Is(err, journal.ErrPlaceholderSuperseded) {
			t.Fatalf("placeholder after its final = %v, want %v", err, journal.ErrPlaceholderSuperseded)
		}
		if got := m.rows[rowKey("d1", journal.StageInitial)].State; got != journal.DeliveryRetired {
			t.Fatalf("superseded placeholder = %v, want retired", got)
		}
	})
	t.Run("AnAcknowledgementWithoutTheServersTimestampProjectsNothing", func(t *testing.T) {
		m := newMemOutbox()
		mustEnqueue(t, m, reply("d1", journal.StageFinal))
		if _, err := journal.ClaimStage(m, "d1", journal.StageFinal, "DEV"); err != nil {
			t.Fatal(err)
		}
		ack, err := journal.AcknowledgeStage(m, "d1", journal.StageFinal, journal.Sent{EventID: "$f"})
		if err != nil || !ack.First || ack.Projected || len(m.projected) != 0 {
			t.Fatalf("ack = %+v, %v, projected %v", ack, err, m.projected)
		}
	})
	t.Run("AnAnswerAcknowledgedAfterTheFenceIsNotShown", func(t *testing.T) {
		m := newMemOutbox()
		mustEnqueue(t, m, reply("d1", journal.StageFinal))
		if _, err := journal.ClaimStage(m, "d1", journal.StageFinal, "DEV"); err != nil {
			t.Fatal(err)
		}
		m.epoch++
		ack, err := journal.AcknowledgeStage(m, "d1", journal.StageFinal, journal.Sent{EventID: "$f", ServerTS: 9})
		if err != nil || ack.Projected {
			t.Fatalf("ack = %+v, %v; want it not projected", ack, err)
		}
	})
	t.Run("ANewDeviceSendsAnAttemptedRowOnlyAfterAdoptingIt", func(t *testing.T) {
		m := newMemOutbox()
		mustEnqueue(t, m, reply("d1", journal.StageFinal))
		if _, err := journal.ClaimStage(m, "d1", journal.StageFinal, "OLD"); err != nil {
			t.Fatal(err)
		}
		if _, err := journal.ClaimStage(m, "d1", journal.StageFinal, "NEW"); !errors.Is(err, journal.ErrDeviceChanged) {
			t.Fatalf("claim from a new device = %v, want %v", err, journal.ErrDeviceChanged)
		}
		if err := journal.AdoptStageDevice(m, "d1", journal.StageFinal, "NEW"); err != nil {
			t.Fatal(err)
		}
		if d, err := journal.ClaimStage(m, "d1", journal.StageFinal, "NEW"); err != nil || d.DeviceID != "NEW" || d.Attempts != 2 {
			t.Fatalf("claim after adopting = %+v, %v", d, err)
		}
	})
}

func mustEnqueue(t *testing.T, m *memOutbox, reqs ...journal.EnqueueRequest) {
	t.Helper()
	for _, r := range reqs {
		if _, err := journal.EnqueueStage(m, outboxPrincipal, r); err != nil {
			t.Fatalf("enqueue %s/%s: %v", r.DeliveryID, r.Stage, err)
		}
	}
}
