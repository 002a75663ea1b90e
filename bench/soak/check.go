package main

import (
	"encoding/json"
	"strings"

	"github.com/mindroomd/mindroomd/journal"
)

// roomEvent is the part of a room event the checks read.
type roomEvent struct {
	ID     string `json:"event_id"`
	Type   string `json:"type"`
	Sender string `json:"sender"`
	// OriginTS is when the homeserver took the event in, in Unix
	// milliseconds.
	OriginTS int64 `json:"origin_server_ts"`
	Content  struct {
		Body      string `json:"body"`
		RelatesTo *struct {
			RelType   string `json:"rel_type"`
			EventID   string `json:"event_id"`
			InReplyTo *struct {
				EventID string `json:"event_id"`
			} `json:"m.in_reply_to"`
		} `json:"m.relates_to"`
		Delivery *struct {
			DeliveryID string `json:"delivery_id"`
			Stage      string `json:"stage"`
		} `json:"io.mindroomd.delivery"`
	} `json:"content"`
	// Decrypted marks the cleartext of an event the person's device
	// decrypted (person.read).
	Decrypted bool `json:"io.mindroomd.soak.decrypted"`
}

func parseEvent(raw json.RawMessage) (roomEvent, error) {
	var ev roomEvent
	err := json.Unmarshal(raw, &ev)
	return ev, err
}

// isEdit reports an m.replace edit.
func (ev roomEvent) isEdit() bool {
	return ev.Content.RelatesTo != nil && ev.Content.RelatesTo.RelType == "m.replace"
}

// answer is one of the agent's answers as the room shows it.
type answer struct {
	ID   string
	Body string
	// Source is the message it answers: its reply relation's event, else
	// the one its delivery marker names.
	Source string
	// Thread is the thread it was posted in, "" for the room.
	Thread string
	// DeliveryID and Stage are its delivery marker's, "" without one.
	DeliveryID, Stage string
	// TS is when the homeserver took it in, in Unix milliseconds.
	TS int64
}

// answer reads ev as an answer of bot's: a message from bot that is not an
// edit (the echo agent sends no placeholder, so it edits nothing).
func (ev roomEvent) answer(bot string) (answer, bool) {
	if ev.Sender != bot || ev.Type != "m.room.message" || ev.isEdit() {
		return answer{}, false
	}
	a := answer{ID: ev.ID, Body: ev.Content.Body, TS: ev.OriginTS}
	if d := ev.Content.Delivery; d != nil {
		a.DeliveryID, a.Stage = d.DeliveryID, d.Stage
	}
	if r := ev.Content.RelatesTo; r != nil {
		if r.RelType == "m.thread" {
			a.Thread = r.EventID
		}
		if r.InReplyTo != nil {
			a.Source = r.InReplyTo.EventID
		}
	}
	if a.Source == "" {
		a.Source, _ = strings.CutPrefix(a.DeliveryID, journal.ReplyDeliveryID(""))
	}
	return a, true
}

// serverTally is what the homeserver's record of the room says of the
// person's messages and the agent's answers.
type serverTally struct {
	// Originals is how many of the person's messages the room holds.
	Originals int
	// Missing are messages the person sent that the room does not hold:
	// a fault of the soak or the homeserver, not the daemon.
	Missing []string
	// Lost are messages without an answer.
	Lost []sent
	// Duplicated counts answers beyond the first to one message;
	// DuplicateOf lists the answers of each message answered more than
	// once.
	Duplicated  int
	DuplicateOf map[string][]string
	// Stray are answers to no message of the person's.
	Stray []string
	// Unmarked are answers whose delivery marker is not the final stage of
	// their source's reply (journal.ReplyDeliveryID).
	Unmarked []string
	// Misanswered are answers whose text is not the echo of their source.
	Misanswered []string
	// Misplaced are answers outside their source's thread.
	Misplaced []string
	// AgentEdits counts edits the agent sent.
	AgentEdits int
	// Undecrypted are encrypted events the person's device could not
	// decrypt: an answer among them counts as none.
	Undecrypted []string
	// Cleartext are messages sent in the clear into an encrypted room.
	Cleartext []string
	// KeyNotices are the agent's notices to the room that a message has
	// waited too long for its key (journal.KeyNotice).
	KeyNotices []string
	// Answers are the agent's answers, by ID, each once.
	Answers []answer
}

// tallyRoom matches every answer of bot's in events (the room's history,
// an event listed twice counted once, each as the person's device reads
// it) to the message it answers among msgs. In an encrypted room every
// message must have come encrypted.
func tallyRoom(events []json.RawMessage, bot string, msgs []sent, encrypted bool) serverTally {
	var t serverTally
	bySource := map[string]sent{}
	for _, m := range msgs {
		bySource[m.ID] = m
	}
	onServer := map[string]bool{}
	answersOf := map[string][]string{}
	// A walk of /messages on Dendrite can return one event twice; it is
	// one event.
	counted := map[string]bool{}
	for _, raw := range events {
		ev, err := parseEvent(raw)
		if err != nil || counted[ev.ID] {
			continue
		}
		counted[ev.ID] = true
		switch {
		case ev.Type == "m.room.encrypted":
			t.Undecrypted = append(t.Undecrypted, ev.ID)
		case encrypted && ev.Type == "m.room.message" && !ev.Decrypted:
			t.Cleartext = append(t.Cleartext, ev.ID)
		}
		if _, ok := bySource[ev.ID]; ok {
			onServer[ev.ID] = true
			continue
		}
		if ev.Sender == bot && ev.Type == "m.room.message" && ev.isEdit() {
			t.AgentEdits++
			continue
		}
		a, ok := ev.answer(bot)
		if !ok {
			continue
		}
		if strings.HasPrefix(a.DeliveryID, journal.KeyNotice("", "").DeliveryID) {
			t.KeyNotices = append(t.KeyNotices, a.ID)
			continue
		}
		t.Answers = append(t.Answers, a)
		src, known := bySource[a.Source]
		if !known {
			t.Stray = append(t.Stray, a.ID)
			continue
		}
		answersOf[a.Source] = append(answersOf[a.Source], a.ID)
		if a.DeliveryID != journal.ReplyDeliveryID(src.ID) || a.Stage != journal.StageFinal.String() {
			t.Unmarked = append(t.Unmarked, a.ID)
		}
		if a.Body != "echo: "+src.Body {
			t.Misanswered = append(t.Misanswered, a.ID)
		}
		if a.Thread != src.Root {
			t.Misplaced = append(t.Misplaced, a.ID)
		}
	}
	t.DuplicateOf = map[string][]string{}
	for _, m := range msgs {
		if !onServer[m.ID] {
			t.Missing = append(t.Missing, m.ID)
			continue
		}
		t.Originals++
		switch n := len(answersOf[m.ID]); {
		case n == 0:
			t.Lost = append(t.Lost, m)
		case n > 1:
			t.Duplicated += n - 1
			t.DuplicateOf[m.ID] = answersOf[m.ID]
		}
	}
	return t
}

// roomRecord is one room of the soak's as the checks read it: the agent
// it is with, the person's messages in it, and its events as the person's
// device reads them.
type roomRecord struct {
	bot    string
	msgs   []sent
	events []json.RawMessage
}

// tallyRooms is tallyRoom of each room, each room's answers matched only
// to its own messages (an answer in another room than its message's
// answers nothing), added up; byRoom are the rooms' own tallies, in order.
func tallyRooms(rooms []roomRecord, encrypted bool) (total serverTally, byRoom []serverTally) {
	total.DuplicateOf = map[string][]string{}
	for _, r := range rooms {
		t := tallyRoom(r.events, r.bot, r.msgs, encrypted)
		byRoom = append(byRoom, t)
		total.add(t)
	}
	return total, byRoom
}

// add adds u's counts and lists to t's.
func (t *serverTally) add(u serverTally) {
	t.Originals += u.Originals
	t.Missing = append(t.Missing, u.Missing...)
	t.Lost = append(t.Lost, u.Lost...)
	t.Duplicated += u.Duplicated
	for src, answers := range u.DuplicateOf {
		t.DuplicateOf[src] = append(t.DuplicateOf[src], answers...)
	}
	t.Stray = append(t.Stray, u.Stray...)
	t.Unmarked = append(t.Unmarked, u.Unmarked...)
	t.Misanswered = append(t.Misanswered, u.Misanswered...)
	t.Misplaced = append(t.Misplaced, u.Misplaced...)
	t.AgentEdits += u.AgentEdits
	t.Undecrypted = append(t.Undecrypted, u.Undecrypted...)
	t.Cleartext = append(t.Cleartext, u.Cleartext...)
	t.KeyNotices = append(t.KeyNotices, u.KeyNotices...)
	t.Answers = append(t.Answers, u.Answers...)
}
