package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
)

const (
	// requestTimeout bounds one request of the person's.
	requestTimeout = 30 * time.Second
	// sendAttempts is how often one send is tried; every attempt carries
	// the same transaction ID, so the homeserver keeps one event.
	sendAttempts = 5
	// syncPoll is the long-poll timeout of the person's sync.
	syncPoll = 5 * time.Second
	// syncFilter asks for up to 100 timeline events per sync and nothing
	// the soak does not read.
	syncFilter = `{"room":{"timeline":{"limit":100},"state":{"lazy_load_members":true},` +
		`"ephemeral":{"not_types":["*"]},"account_data":{"not_types":["*"]}},` +
		`"presence":{"not_types":["*"]},"account_data":{"not_types":["*"]}}`
	// recentWindow is how far back a thread root or an edit's target is
	// drawn from.
	recentWindow = 50
	// endType is the event the person sends once the daemon has stopped:
	// seen in the person's sync, it says the homeserver holds everything
	// sent before it. It is the soak's own marker, no message, so it goes
	// in the clear even into an encrypted room.
	endType = "io.mindroomd.soak.end"
	// decryptedKey marks an event the person's device decrypted (read).
	decryptedKey = "io.mindroomd.soak.decrypted"
)

// person is the soak's human in one of her rooms, with one agent, writing
// and reading through her own client. With several agents she has a room
// with each, and one person value per room, sharing the client and the
// device.
type person struct {
	cli  *mautrix.Client
	room id.RoomID
	// agent is the user ID of the agent the room is with.
	agent string
	// txnTag tells the transaction IDs of the person's sends into this
	// room from those into her other rooms: the homeserver keeps one set
	// of transaction IDs for the client's device, whatever the room.
	txnTag string
	txns   int
	// device, in an encrypted room, is the person's own device, with its
	// own keys: it encrypts what the person writes and decrypts what the
	// room holds. cli, the registration's keyless device, still reads
	// the room (the sync, /messages) and sends the end marker. nil in a
	// room in the clear.
	device *e2eeperson.Client
}

// write sends one of the person's messages with content: from the
// person's device, encrypted, in an encrypted room, each of its requests
// tried up to sendAttempts times as it was sent (a send keeps its
// transaction ID and ciphertext, so the homeserver keeps one event); in
// the clear otherwise.
func (p *person) write(ctx context.Context, content map[string]any) (string, error) {
	if p.device == nil {
		return p.send(ctx, event.EventMessage, content)
	}
	return p.device.SendMessage(mautrix.WithMaxRetries(ctx, sendAttempts-1), p.room.String(), content)
}

// read returns raw as the person's device reads it. In an encrypted room
// an event that decrypts reads as its cleartext: the event with the
// decrypted type and content, marked decryptedKey so the checks can tell
// it from one sent in the clear. ok is false for one that does not decrypt
// now, returned as it came. In a room in the clear, and for an event never
// encrypted, raw reads as it is.
func (p *person) read(ctx context.Context, raw json.RawMessage) (plain json.RawMessage, ok bool) {
	if p.device == nil {
		return raw, true
	}
	d := p.device.ReadEvent(ctx, p.room.String(), raw)
	switch {
	case d.Err != nil:
		return raw, false
	case !d.Encrypted:
		return raw, true
	}
	var ev map[string]any
	if err := json.Unmarshal(raw, &ev); err != nil {
		return raw, false
	}
	ev["type"], ev["content"], ev[decryptedKey] = d.Type, d.Content, true
	plain, err := json.Marshal(ev)
	if err != nil {
		return raw, false
	}
	return plain, true
}

// whyUndecrypted says, of each of ids among events, who sent it and why
// the person's device cannot decrypt it.
func (p *person) whyUndecrypted(ctx context.Context, events []json.RawMessage, ids []string) []string {
	byID := map[string]json.RawMessage{}
	for _, raw := range events {
		if ev, err := parseEvent(raw); err == nil {
			byID[ev.ID] = raw
		}
	}
	out := make([]string, len(ids))
	for i, eventID := range ids {
		raw := byID[eventID]
		ev, _ := parseEvent(raw)
		why := "the person has no device of her own in a room in the clear"
		if p.device != nil {
			why = fmt.Sprint(p.device.ReadEvent(ctx, p.room.String(), raw).Err)
		}
		out[i] = fmt.Sprintf("%s from %s: %s", eventID, ev.Sender, why)
	}
	return out
}

// readAll is each of events as the person's device reads it.
func (p *person) readAll(ctx context.Context, events []json.RawMessage) []json.RawMessage {
	out := make([]json.RawMessage, len(events))
	for i, raw := range events {
		out[i], _ = p.read(ctx, raw)
	}
	return out
}

// send sends one event, retried under one transaction ID.
func (p *person) send(ctx context.Context, evType event.Type, content any) (string, error) {
	p.txns++
	txn := "soak-" + p.txnTag + strconv.Itoa(p.txns)
	var err error
	for attempt := 1; attempt <= sendAttempts; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		var resp *mautrix.RespSendEvent
		resp, err = p.cli.SendMessageEvent(rctx, p.room, evType, content, mautrix.ReqSendEvent{TransactionID: txn})
		cancel()
		if err == nil {
			return resp.EventID.String(), nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		time.Sleep(time.Duration(attempt) * 200 * time.Millisecond)
	}
	return "", fmt.Errorf("send %s: %w", txn, err)
}

// history is every event of the room the person may see, oldest first: a
// walk of /messages backwards from the newest (Dendrite refuses a forward
// walk without a from token).
func (p *person) history(ctx context.Context) ([]json.RawMessage, error) {
	var all []json.RawMessage
	from := ""
	for {
		query := map[string]string{"dir": "b", "limit": "100"}
		if from != "" {
			query["from"] = from
		}
		var page struct {
			Chunk []json.RawMessage `json:"chunk"`
			End   string            `json:"end"`
		}
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		u := p.cli.BuildURLWithQuery(mautrix.ClientURLPath{"v3", "rooms", p.room.String(), "messages"}, query)
		_, err := p.cli.MakeRequest(rctx, http.MethodGet, u, nil, &page)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("read the room's messages: %w", err)
		}
		all = append(all, page.Chunk...)
		if len(page.Chunk) == 0 || page.End == "" || page.End == from {
			break
		}
		from = page.End
	}
	slices.Reverse(all)
	return all, nil
}

// union is the events of a, then those of b, each event ID once.
func union(a, b []json.RawMessage) []json.RawMessage {
	var out []json.RawMessage
	have := map[string]bool{}
	for _, raw := range slices.Concat(a, b) {
		if ev, err := parseEvent(raw); err == nil && !have[ev.ID] {
			have[ev.ID] = true
			out = append(out, raw)
		}
	}
	return out
}

// sent is one message the person wrote.
type sent struct {
	ID    string
	Index int
	Body  string
	// Root is the thread the message was written in, "" for the room.
	Root string
	// Room is the room it was written in.
	Room id.RoomID
}

// postResult is what the person wrote.
type postResult struct {
	Messages []sent
	Edits    int
	Threaded int
	Took     time.Duration
}

// post writes k messages at rate, the i-th at i/rate after the first,
// into the rooms in turn. A share of them go into the thread of a recent
// top-level message of their room, and after a share of them an edit of a
// recent message of their room follows. A send that falls behind the
// schedule goes at once.
func post(ctx context.Context, rooms []*person, o options, rng *rand.Rand, onSent func(sent)) (postResult, error) {
	var res postResult
	interval := time.Duration(float64(time.Second) / o.rate)
	began := time.Now()
	// Each room's messages, and the indexes among them of its top-level
	// ones.
	msgs := make([][]sent, len(rooms))
	roots := make([][]int, len(rooms))
	for i := range o.k {
		if wait := time.Until(began.Add(time.Duration(i) * interval)); wait > 0 {
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(wait):
			}
		}
		r := i % len(rooms)
		p := rooms[r]
		m := sent{Index: i, Body: fmt.Sprintf("soak %d", i), Room: p.room}
		content := map[string]any{"msgtype": "m.text", "body": m.Body}
		if n := len(roots[r]); n > 0 && rng.Float64() < o.threadShare {
			root := msgs[r][roots[r][max(0, n-recentWindow)+rng.IntN(min(n, recentWindow))]]
			m.Root = root.ID
			m.Body = fmt.Sprintf("soak %d, in the thread of %d", i, root.Index)
			content = map[string]any{"msgtype": "m.text", "body": m.Body,
				"m.relates_to": map[string]any{"rel_type": "m.thread", "event_id": root.ID, "is_falling_back": true,
					"m.in_reply_to": map[string]any{"event_id": root.ID}}}
		}
		var err error
		if m.ID, err = p.write(ctx, content); err != nil {
			return res, err
		}
		if m.Root == "" {
			roots[r] = append(roots[r], len(msgs[r]))
		} else {
			res.Threaded++
		}
		msgs[r] = append(msgs[r], m)
		res.Messages = append(res.Messages, m)
		onSent(m)
		if rng.Float64() < o.editShare {
			if err := editRecent(ctx, p, rng, msgs[r]); err != nil {
				return res, err
			}
			res.Edits++
		}
	}
	res.Took = time.Since(began)
	return res, nil
}

// editRecent edits one of the last messages, at random, which may be the
// one just sent or one already answered.
func editRecent(ctx context.Context, p *person, rng *rand.Rand, msgs []sent) error {
	n := min(len(msgs), recentWindow)
	target := msgs[len(msgs)-n+rng.IntN(n)]
	body := target.Body + " (edited)"
	_, err := p.write(ctx, map[string]any{
		"msgtype": "m.text", "body": "* " + body,
		"m.new_content": map[string]any{"msgtype": "m.text", "body": body},
		"m.relates_to":  map[string]any{"rel_type": "m.replace", "event_id": target.ID},
	})
	return err
}

// observer follows the person's rooms through her own sync and notes when
// each message's first answer from its room's agent appears, so the soak
// knows when the daemon has drained without reading the journal. In an
// encrypted room it notes each event once the person's device has read
// it: an answer counts once it has decrypted.
type observer struct {
	// cli and device are the person's, which every room shares: one sync
	// follows them all.
	cli    *mautrix.Client
	device *e2eeperson.Client
	rooms  map[id.RoomID]*person

	mu   sync.Mutex
	seen map[string]bool
	// events are each room's events in the order the person read them.
	events map[id.RoomID][]json.RawMessage
	// sealed are the events seen that the person's device could not
	// decrypt yet, by ID, as they came; reopen tries them again.
	sealed  map[string]sealedEvent
	answers map[string]time.Time
	gaps    int
	// deviceErr is why the person's device stopped syncing: no key comes
	// after it.
	deviceErr error
}

// sealedEvent is an event the person's device could not decrypt yet, and
// the room it came in: a synced event does not name its room.
type sealedEvent struct {
	p   *person
	raw json.RawMessage
}

func newObserver(rooms []*person) *observer {
	o := &observer{cli: rooms[0].cli, device: rooms[0].device, rooms: map[id.RoomID]*person{}, seen: map[string]bool{},
		events: map[id.RoomID][]json.RawMessage{}, sealed: map[string]sealedEvent{}, answers: map[string]time.Time{}}
	for _, p := range rooms {
		o.rooms[p.room] = p
	}
	return o
}

// reopen tries the sealed events again after each sync of the person's
// device, which is what brings their keys, until ctx ends or the device
// stops syncing. An event that decrypts is noted as read then.
func (o *observer) reopen(ctx context.Context) {
	for {
		next, err := o.device.Synced()
		o.mu.Lock()
		o.deviceErr = err
		for id, s := range o.sealed {
			if plain, ok := s.p.read(ctx, s.raw); ok {
				delete(o.sealed, id)
				o.note(s.p, plain, time.Now())
			}
		}
		o.mu.Unlock()
		if err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-next:
		}
	}
}

// deviceFailure is why the person's device stopped syncing, nil while it
// syncs.
func (o *observer) deviceFailure() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.deviceErr
}

// run syncs from since until ctx ends. A limited timeline (more events
// than the filter lets through) is filled by a walk of the whole room.
func (o *observer) run(ctx context.Context, since string) {
	for ctx.Err() == nil {
		limited, next, err := o.syncOnce(ctx, since)
		for _, p := range limited {
			if err != nil {
				break
			}
			o.mu.Lock()
			o.gaps++
			o.mu.Unlock()
			var all []json.RawMessage
			if all, err = p.history(ctx); err == nil {
				o.take(ctx, p, all, time.Now())
			}
		}
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
			continue
		}
		since = next
	}
}

// syncOnce syncs once from since, notes what the person's rooms show, and
// returns the rooms whose timeline was limited.
func (o *observer) syncOnce(ctx context.Context, since string) (limited []*person, next string, err error) {
	rctx, cancel := context.WithTimeout(ctx, syncPoll+requestTimeout)
	defer cancel()
	resp, err := dendrite.SyncTimelines(rctx, o.cli, syncFilter, since, syncPoll)
	if err != nil {
		return nil, "", err
	}
	for room, joined := range resp.Rooms.Join {
		p, ok := o.rooms[id.RoomID(room)]
		if !ok {
			continue
		}
		o.take(ctx, p, joined.Timeline.Events, time.Now())
		// The first sync's timeline is the newest events only: the
		// earlier ones are the room's creation, before any message.
		if joined.Timeline.Limited && since != "" {
			limited = append(limited, p)
		}
	}
	return limited, resp.NextBatch, nil
}

// take notes p's room's events, seen at at, each as the person's device
// reads it; one it cannot decrypt yet waits in sealed.
func (o *observer) take(ctx context.Context, p *person, events []json.RawMessage, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, raw := range events {
		ev, err := parseEvent(raw)
		if err != nil || o.seen[ev.ID] {
			continue
		}
		o.seen[ev.ID] = true
		if plain, ok := p.read(ctx, raw); ok {
			o.note(p, plain, at)
		} else {
			o.sealed[ev.ID] = sealedEvent{p: p, raw: raw}
		}
	}
}

// note records an event of p's room as read at at; o.mu must be held.
func (o *observer) note(p *person, raw json.RawMessage, at time.Time) {
	o.events[p.room] = append(o.events[p.room], raw)
	ev, err := parseEvent(raw)
	if err != nil {
		return
	}
	if r, ok := ev.answer(p.agent); ok && r.Source != "" {
		if _, done := o.answers[r.Source]; !done {
			o.answers[r.Source] = at
		}
	}
}

// record is, by room, every event of it the person has seen: those read,
// then those still sealed, as they came.
func (o *observer) record() map[id.RoomID][]json.RawMessage {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[id.RoomID][]json.RawMessage{}
	for room, events := range o.events {
		out[room] = slices.Clone(events)
	}
	for _, s := range o.sealed {
		out[s.p.room] = append(out[s.p.room], s.raw)
	}
	return out
}

// saw reports whether the person's sync has shown eventID.
func (o *observer) saw(eventID string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seen[eventID]
}

// progress reports how many of ids have an answer, and when the last of
// those first answers was seen.
func (o *observer) progress(ids []string) (answered int, last time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, id := range ids {
		if at, ok := o.answers[id]; ok {
			answered++
			if at.After(last) {
				last = at
			}
		}
	}
	return answered, last
}
