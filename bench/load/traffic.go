package main

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// server is the homeserver name every generated ID carries.
const server = "load.local"

// Shape of the traffic.
const (
	// usersPerRoom is the people writing in each room; none is a principal,
	// so what they write is actionable.
	usersPerRoom = 8
	// recentPerRoom is how many of a room's latest messages edits,
	// redactions and thread replies pick their target from.
	recentPerRoom = 32
	// historyChunk bounds one first-sync batch of history.
	historyChunk = 500
)

func agentName(p int) string   { return fmt.Sprintf("agent%02d", p) }
func agentUser(p int) string   { return "@" + agentName(p) + ":" + server }
func roomID(p, r int) string   { return fmt.Sprintf("!p%02dr%02d:%s", p, r, server) }
func personID(r, u int) string { return fmt.Sprintf("@r%02du%d:%s", r, u, server) }

// kind is what one generated event is.
type kind int

// The live mix, in per-mille: mostly messages, some thread replies, edits
// and redactions.
const (
	kindMessage kind = iota
	kindThreadReply
	kindEdit
	kindRedaction
	numKinds
)

var kindNames = [numKinds]string{"messages", "thread replies", "edits", "redactions"}

// kindMix is each kind's share of live events in per-mille.
var kindMix = [numKinds]int{700, 150, 100, 50}

// posted is a message a person wrote that later events may refer to.
type posted struct {
	id, sender string
	// root is the thread root, "" for a room-level message.
	root string
}

// room is one conversation's generator state.
type room struct {
	id     string
	users  []string
	recent []posted // newest last
}

func (r *room) remember(p posted) {
	if len(r.recent) == recentPerRoom {
		copy(r.recent, r.recent[1:])
		r.recent = r.recent[:recentPerRoom-1]
	}
	r.recent = append(r.recent, p)
}

// traffic generates one principal's events. It is used by one goroutine.
type traffic struct {
	rng   *rand.Rand
	rooms []*room
}

func newTraffic(seed uint64, p, rooms int) *traffic {
	t := &traffic{rng: rand.New(rand.NewPCG(seed, uint64(p)))}
	for r := range rooms {
		rm := &room{id: roomID(p, r)}
		for u := range usersPerRoom {
			rm.users = append(rm.users, personID(r, u))
		}
		t.rooms = append(t.rooms, rm)
	}
	return t
}

// eventID returns "$" and 43 base64url characters, the shape of room v4+
// event IDs.
func eventID(rng interface{ Uint64() uint64 }) string {
	var b [32]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	return "$" + base64.RawURLEncoding.EncodeToString(b[:])
}

var words = strings.Fields(`the a to and of in is it you that for on with this be are have not
	was but at can what do if so just we they about like will my get one all out up
	there when an think your know more time would how some me then now work message
	agent room reply thread edit build deploy test review merge fix`)

// body returns 20 to 200 bytes of words.
func (t *traffic) body() string {
	target := 20 + t.rng.IntN(181)
	var sb strings.Builder
	for sb.Len() < target {
		if sb.Len() > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(words[t.rng.IntN(len(words))])
	}
	return sb.String()
}

func (t *traffic) pickKind() kind {
	n := t.rng.IntN(1000)
	for k, share := range kindMix {
		if n < share {
			return kind(k)
		}
		n -= share
	}
	return kindMessage
}

// live returns the next live event of a random room at ts and its kind.
// A kind that needs a target the room does not have yet falls back to a
// message.
func (t *traffic) live(ts int64) (journal.Inbound, kind) {
	rm := t.rooms[t.rng.IntN(len(t.rooms))]
	k := t.pickKind()
	if k != kindMessage && len(rm.recent) == 0 {
		k = kindMessage
	}
	id := eventID(t.rng)
	var ev mx.Ev
	switch k {
	case kindMessage:
		sender := rm.users[t.rng.IntN(len(rm.users))]
		ev = mx.Message(id, sender, ts, t.body())
		rm.remember(posted{id: id, sender: sender})
	case kindThreadReply:
		target := rm.recent[t.rng.IntN(len(rm.recent))]
		root := target.root
		if root == "" {
			root = target.id
		}
		sender := rm.users[t.rng.IntN(len(rm.users))]
		ev = mx.ThreadReply(id, sender, ts, root, t.body())
		rm.remember(posted{id: id, sender: sender, root: root})
	case kindEdit:
		// Only the author's edit counts; a person edits their own message.
		target := rm.recent[t.rng.IntN(len(rm.recent))]
		ev = mx.Edit(id, target.sender, ts, target.id, t.body())
	case kindRedaction:
		i := t.rng.IntN(len(rm.recent))
		target := rm.recent[i]
		ev = mx.Redaction(id, target.sender, ts, target.id)
		rm.recent = append(rm.recent[:i], rm.recent[i+1:]...)
	}
	return ev.In(rm.id, journal.Live), k
}

// history returns room r's first-sync timeline, the principal's own join
// (whose ID it returns as well) then n messages (one in ten a thread
// reply) from startTS on, a second or two apart.
func (t *traffic) history(p, r, n int, startTS int64) (joinID string, events []journal.Inbound) {
	rm := t.rooms[r]
	ts := startTS
	joinID = eventID(t.rng)
	out := []journal.Inbound{mx.Member(joinID, agentUser(p), ts, "join").In(rm.id, journal.History)}
	for range n {
		ts += 1000 + int64(t.rng.IntN(1000))
		id := eventID(t.rng)
		sender := rm.users[t.rng.IntN(len(rm.users))]
		var ev mx.Ev
		if len(rm.recent) > 0 && t.rng.IntN(10) == 0 {
			target := rm.recent[t.rng.IntN(len(rm.recent))]
			root := target.root
			if root == "" {
				root = target.id
			}
			ev = mx.ThreadReply(id, sender, ts, root, t.body())
			rm.remember(posted{id: id, sender: sender, root: root})
		} else {
			ev = mx.Message(id, sender, ts, t.body())
			rm.remember(posted{id: id, sender: sender})
		}
		out = append(out, ev.In(rm.id, journal.History))
	}
	return joinID, out
}

// admitCounts are the live admission's counters, shared by every sync loop.
type admitCounts struct {
	batches, events, actionable atomic.Int64
	byKind                      [numKinds]atomic.Int64
}

// seedHistory admits principal p's first sync: each room's own join (the
// fence learns it first, as the sync loop's membership pass does) and its
// history, in batches of at most historyChunk events. History is never
// work: it is stored settled.
func (h *harness) seedHistory(ctx context.Context, p int) error {
	pl := h.principals[p]
	startTS := time.Now().Add(-24 * time.Hour).UnixMilli()
	batch := 0
	for r := range h.cfg.rooms {
		joinID, in := pl.traffic.history(p, r, h.cfg.history, startTS)
		if err := pl.view.RecordJoin(ctx, roomID(p, r), joinID); err != nil {
			return fmt.Errorf("record join: %w", err)
		}
		for len(in) > 0 {
			n := min(len(in), historyChunk)
			batch++
			res, err := pl.view.AdmitBatch(ctx, in[:n], fmt.Sprintf("h%02d_%d", p, batch))
			if err != nil {
				return fmt.Errorf("admit history: %w", err)
			}
			for _, a := range res {
				if a.Outcome != journal.Admitted || a.Class != journal.ContextOnly {
					return fmt.Errorf("admit history: %s was %v/%v (%v), want admitted context-only", a.EventID, a.Outcome, a.Class, a.Err)
				}
			}
			h.historyEvents.Add(int64(n))
			in = in[n:]
		}
	}
	return nil
}

// syncLoop is principal p's sync loop. People write at rate events/s, each
// event arriving at the next step of a Poisson process; every syncEvery
// the loop admits, as one AdmitBatch with its next_batch token, whatever
// arrived since the last batch, as a long-polling client's sync response
// would hold it. It stops offering events at end.
func (h *harness) syncLoop(ctx context.Context, p int, end time.Time) {
	pl := h.principals[p]
	rng := pl.traffic.rng
	rate := h.cfg.rate / float64(h.cfg.principals)
	arrival := func(after time.Time) time.Time {
		return after.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
	}
	next := arrival(h.start)
	// Principals' syncs come back at different moments, not in step.
	phase := time.Duration(rng.Int64N(int64(h.cfg.syncEvery)))
	tick := time.NewTimer(phase)
	defer tick.Stop()
	token := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		var (
			batch []journal.Inbound
			kinds []kind
		)
		for !next.After(now) && next.Before(end) {
			in, k := pl.traffic.live(next.UnixMilli())
			batch, kinds = append(batch, in), append(kinds, k)
			next = arrival(next)
		}
		if len(batch) > 0 {
			token++
			h.admit(ctx, pl, batch, kinds, fmt.Sprintf("s%02d_%d", p, token))
		}
		if !next.Before(end) {
			return
		}
		tick.Reset(h.cfg.syncEvery - time.Since(now)%h.cfg.syncEvery)
	}
}

// admit admits one live batch and records its latency and outcome.
func (h *harness) admit(ctx context.Context, pl *principalLoad, batch []journal.Inbound, kinds []kind, token string) {
	start := time.Now()
	res, err := pl.view.AdmitBatch(ctx, batch, token)
	h.admitLatency.add(time.Since(start))
	if err != nil {
		h.errs.add(ctx, "admit batch", err)
		return
	}
	h.admitted.batches.Add(1)
	for i, a := range res {
		if a.Outcome != journal.Admitted {
			h.errs.add(ctx, "admit batch", fmt.Errorf("%s: %v (%v), want admitted", a.EventID, a.Outcome, a.Err))
			continue
		}
		h.admitted.events.Add(1)
		h.admitted.byKind[kinds[i]].Add(1)
		if a.Class == journal.Actionable {
			h.admitted.actionable.Add(1)
		}
	}
}
