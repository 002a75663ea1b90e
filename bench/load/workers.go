package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/journal"
)

// workPage is how many pending events one read of the backlog takes, as in
// the principal's worker.
const workPage = 64

// pageLimit is a reader's page size.
const pageLimit = 50

// maxPagesPerVisit is the most pages a reader turns in one conversation
// before it picks another.
const maxPagesPerVisit = 5

// turnLoop is a principal's worker: after every commit for the principal
// it offers the pending backlog, in receipt order, to an agent that
// answers at once, and enqueues each answer with its turn record, as
// actors/principal's worker does. It runs until ctx ends.
func (h *harness) turnLoop(ctx context.Context, pl *principalLoad) {
	sub := h.store.Hints().Subscribe(pl.view.Principal().String())
	defer sub.Close()
	for {
		h.passes.Add(1)
		h.offerBacklog(ctx, pl)
		h.passes.Add(-1)
		h.poke()
		select {
		case <-ctx.Done():
			return
		case <-sub.C():
		}
	}
}

// offerBacklog offers every pending event once.
func (h *harness) offerBacklog(ctx context.Context, pl *principalLoad) {
	var after int64
	for {
		page, err := pl.view.Pending(ctx, workPage, after)
		if err != nil {
			h.errs.add(ctx, "pending", err)
			return
		}
		for _, u := range page.Unreadable {
			h.errs.add(ctx, "pending", fmt.Errorf("%s unreadable: %w", u.EventID, u.Err))
		}
		for _, e := range page.Events {
			if ctx.Err() != nil {
				return
			}
			if err := h.offer(ctx, pl, e); err != nil {
				h.errs.add(ctx, "turn", err)
			}
		}
		if !page.More {
			return
		}
		after = page.Next
	}
}

// offer runs one turn the way the principal's worker does: the event's
// thread, the turn record an earlier attempt may have left, then the
// answer enqueued with its turn record and the event settled, in one
// commit.
func (h *harness) offer(ctx context.Context, pl *principalLoad, e journal.PendingEvent) error {
	thread, _, err := pl.view.AdmittedThreadID(ctx, e.RoomID, e.EventID)
	if err != nil {
		return fmt.Errorf("read thread: %w", err)
	}
	id := journal.ReplyDeliveryID(e.EventID)
	rec, answered, err := pl.view.TurnForEvent(ctx, e.EventID)
	if err != nil {
		return fmt.Errorf("read turn record: %w", err)
	}
	var (
		content json.RawMessage
		turn    *journal.TurnRecord
	)
	switch {
	case answered && rec.State == journal.TurnDelivered:
		_, err := pl.view.Settle(ctx, e.EventID)
		return err
	case answered:
		content = rec.Record
	default:
		if content, err = answer(e.EventID, thread); err != nil {
			return err
		}
		turn = &journal.TurnRecord{TurnID: id, RoomID: e.RoomID, State: journal.TurnResultRecorded,
			Sources: []string{e.EventID}, Record: content}
	}
	res, err := pl.view.EnqueueAndSettle(ctx, journal.EnqueueRequest{DeliveryID: id, Stage: journal.StageFinal,
		RoomID: e.RoomID, Thread: thread, TurnID: id, Content: content, Sources: []string{e.EventID}, Turn: turn})
	if err != nil {
		return err
	}
	if res.Outcome == journal.EnqueueCreated {
		h.enqueued.Add(1)
	}
	return nil
}

// answer is the agent's reply to source, related to it as the principal's
// turns relate theirs: in its thread, or as a reply.
func answer(source string, thread *string) (json.RawMessage, error) {
	reply := map[string]any{"event_id": source}
	relates := map[string]any{"m.in_reply_to": reply}
	if thread != nil {
		relates = map[string]any{"rel_type": "m.thread", "event_id": *thread, "is_falling_back": true, "m.in_reply_to": reply}
	}
	return json.Marshal(map[string]any{"msgtype": "m.text", "body": "noted: " + source, "m.relates_to": relates})
}

// ackSender stands in for the homeserver: it accepts every send at once
// and answers with a fresh event ID and the server timestamp, so each
// acknowledgement projects the reply as a real one would.
type ackSender struct{ h *harness }

var _ outbox.Sender = ackSender{}

// Send implements outbox.Sender.
func (s ackSender) Send(context.Context, journal.Delivery, json.RawMessage) (journal.Sent, error) {
	s.h.sends.Add(1)
	return journal.Sent{EventID: eventID(globalRand{}), ServerTS: time.Now().UnixMilli()}, nil
}

// globalRand draws from math/rand/v2's goroutine-safe source.
type globalRand struct{}

func (globalRand) Uint64() uint64 { return rand.Uint64() }

// observe counts acknowledgements (outbox.Deps.Observe).
func (h *harness) observe(p outbox.Point, _ journal.Delivery) {
	if p != outbox.Acknowledged {
		return
	}
	h.lastAck.Store(time.Now().UnixNano())
	h.acked.Add(1)
	h.poke()
}

// reader pages conversations until ctx ends: a random principal's random
// room from its newest page back, one to maxPagesPerVisit pages of
// pageLimit through the cursors, pausing after every page. Each page is
// checked: oldest first, and every message older than the cursor it was
// read below.
func (h *harness) reader(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		p := rng.IntN(len(h.principals))
		view := h.principals[p].view
		req := journal.ReadRequest{RoomID: roomID(p, rng.IntN(h.cfg.rooms)), Limit: pageLimit}
		for range 1 + rng.IntN(maxPagesPerVisit) {
			page, ok := h.readPage(ctx, view, req)
			if !pause(ctx, h.cfg.readPause) || !ok || page.NextCursor == nil {
				break
			}
			req.Before = page.NextCursor
		}
	}
}

// readPage reads and checks one page; ok is false when the read failed.
func (h *harness) readPage(ctx context.Context, view journal.ConversationReader, req journal.ReadRequest) (page journal.Page, ok bool) {
	start := time.Now()
	page, err := view.Read(ctx, req)
	if err != nil {
		h.errs.add(ctx, "read", err)
		return page, false
	}
	h.readLatency.add(time.Since(start))
	h.pages.Add(1)
	h.pageRows.Add(int64(len(page.Messages)))
	h.owed.Add(int64(len(page.OwedRefetch)))
	if err := checkPage(page, req.Before); err != nil {
		h.errs.add(ctx, "read order", fmt.Errorf("%s: %w", req.RoomID, err))
		h.disorder.Add(1)
	}
	return page, true
}

// exporter walks whole conversations until ctx ends, as the export route
// does (journal.PlanExport, then Pages), pausing between exports. Each
// export is checked to be oldest first throughout.
func (h *harness) exporter(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		p := rng.IntN(len(h.principals))
		view := h.principals[p].view
		room := roomID(p, rng.IntN(h.cfg.rooms))
		start := time.Now()
		n, pages, err := h.export(ctx, view, room)
		if err != nil {
			h.errs.add(ctx, "export", fmt.Errorf("%s: %w", room, err))
		} else {
			h.exportLatency.add(time.Since(start))
			h.exports.Add(1)
			h.exportPages.Add(int64(pages))
			h.exportRows.Add(int64(n))
		}
		if !pause(ctx, h.cfg.exportPause) {
			return
		}
	}
}

// export walks one conversation oldest first and returns its messages and
// pages. A message not newer than the one before it is an error.
func (h *harness) export(ctx context.Context, r journal.ConversationReader, room string) (n, pages int, err error) {
	plan, err := journal.PlanExport(ctx, r, room, nil, journal.DefaultExportPage, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("plan: %w", err)
	}
	var prev *journal.Message
	for page, err := range plan.Pages(ctx, r, room, nil, journal.DefaultExportPage) {
		if err != nil {
			return n, pages, err
		}
		pages++
		for i := range page.Messages {
			m := &page.Messages[i]
			if prev != nil && !older(*prev, m.CreatedTS, m.EventID) {
				h.exportDisorder.Add(1)
				return n, pages, fmt.Errorf("page %d: %s (%d) does not follow %s (%d)", pages, m.EventID, m.CreatedTS, prev.EventID, prev.CreatedTS)
			}
			prev = m
			n++
		}
	}
	return n, pages, nil
}

// older reports whether m sorts strictly before (ts, id) in page order.
func older(m journal.Message, ts int64, id string) bool {
	return m.CreatedTS < ts || (m.CreatedTS == ts && m.EventID < id)
}

// checkPage checks one page's order: oldest first, and below before.
func checkPage(page journal.Page, before *journal.Cursor) error {
	for i := 1; i < len(page.Messages); i++ {
		if m := page.Messages[i]; !older(page.Messages[i-1], m.CreatedTS, m.EventID) {
			return fmt.Errorf("%s out of order at %d", m.EventID, i)
		}
	}
	if before != nil && len(page.Messages) > 0 {
		if last := page.Messages[len(page.Messages)-1]; !older(last, before.CreatedTS, before.EventID) {
			return fmt.Errorf("%s is not older than the cursor %s", last.EventID, before.EventID)
		}
	}
	return nil
}

// pause waits d, or less if ctx ends; it reports whether ctx is still live.
func pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
