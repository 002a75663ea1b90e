// Package hint carries the writer's after-commit wake-ups to subscribers.
//
// A hint is never the payload: it says only that something committed for a
// principal in a room at a position, and the subscriber re-reads from its own
// cursor. Subscriptions coalesce, so a slow subscriber costs the writer
// nothing and a lost hint only delays.
package hint

import "sync"

// Hint says that a commit touched a principal's room.
type Hint struct {
	// Principal is the principal's readable form (agent@@user:server).
	Principal string
	// Room is the room ID, or "" when the commit was not about one room.
	Room string
	// Position is the newest journal position the commit wrote for it.
	Position int64
}

// ForRooms is one hint per room of principal, at the newest position a
// commit wrote there.
func ForRooms(principal string, newest map[string]int64) []Hint {
	hints := make([]Hint, 0, len(newest))
	for room, pos := range newest {
		hints = append(hints, Hint{Principal: principal, Room: room, Position: pos})
	}
	return hints
}

// Bus fans hints out to subscriptions. The zero value is ready to use.
type Bus struct {
	mu   sync.Mutex
	subs map[*Subscription]struct{}
}

// Subscription receives a coalesced wake-up whenever a matching hint is
// published.
type Subscription struct {
	bus       *Bus
	principal string
	c         chan struct{}
	// rooms, for a subscription that asked for them, gathers the rooms of
	// the hints published since the last Rooms; guarded by the bus's lock.
	rooms map[string]struct{}
	// lost is set when hints may have been lost: any room may have changed.
	lost bool
}

// Subscribe registers interest in one principal's hints ("" for all).
func (b *Bus) Subscribe(principal string) *Subscription {
	s := &Subscription{bus: b, principal: principal, c: make(chan struct{}, 1)}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.subs == nil {
		b.subs = make(map[*Subscription]struct{})
	}
	b.subs[s] = struct{}{}
	return s
}

// SubscribeRooms is Subscribe that also gathers the rooms the matching
// hints name, for a subscriber that re-reads only the rooms that changed.
// The set holds each room once, so it is bounded by the principal's rooms.
func (b *Bus) SubscribeRooms(principal string) *Subscription {
	s := b.Subscribe(principal)
	b.mu.Lock()
	defer b.mu.Unlock()
	s.rooms = make(map[string]struct{})
	return s
}

// Publish wakes every subscription a hint matches. It never blocks: a
// subscription already holding an unread wake-up absorbs the new one.
func (b *Bus) Publish(hints []Hint) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		for _, h := range hints {
			if s.principal != "" && s.principal != h.Principal {
				continue
			}
			select {
			case s.c <- struct{}{}:
			default:
			}
			if s.rooms == nil {
				break
			}
			if h.Room != "" {
				s.rooms[h.Room] = struct{}{}
			}
		}
	}
}

// WakeAll wakes every subscription, whatever its principal: for when hints
// may have been lost (a notification channel reconnected), so each
// subscriber re-reads from its own cursor.
func (b *Bus) WakeAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		select {
		case s.c <- struct{}{}:
		default:
		}
		if s.rooms != nil {
			s.lost = true
		}
	}
}

// C is signalled after a commit that may concern the subscriber.
func (s *Subscription) C() <-chan struct{} { return s.c }

// Rooms takes the rooms gathered since the last call, in no order; nil
// for a subscription made by Subscribe. all is true when hints may have
// been lost since (WakeAll): any room may have changed.
func (s *Subscription) Rooms() (rooms []string, all bool) {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	all, s.lost = s.lost, false
	if len(s.rooms) == 0 {
		return nil, all
	}
	rooms = make([]string, 0, len(s.rooms))
	for r := range s.rooms {
		rooms = append(rooms, r)
		delete(s.rooms, r)
	}
	return rooms, all
}

// Close removes the subscription.
func (s *Subscription) Close() {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	delete(s.bus.subs, s)
}
