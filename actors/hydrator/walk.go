package hydrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// peeked is what a walk reads of an event to decide where to stop: its
// type and relation. The journal parses the event in full when it installs
// it.
type peeked struct {
	EventID string `json:"event_id"`
	Type    string `json:"type"`
	Content struct {
		RelatesTo *struct {
			RelType string `json:"rel_type"`
			EventID string `json:"event_id"`
		} `json:"m.relates_to"`
	} `json:"content"`
}

// peek reads an event's type and relation; an event it cannot read is
// treated as no message at all, and admission records it as malformed.
func peek(raw json.RawMessage) peeked {
	var p peeked
	_ = json.Unmarshal(raw, &p)
	return p
}

func (p peeked) relation() (relType, target string) {
	if p.Content.RelatesTo == nil {
		return "", ""
	}
	return journal.RelType(p.Content.RelatesTo.RelType), p.Content.RelatesTo.EventID
}

// message reports whether the event is a message. An encrypted event
// counts as one: what it hides is almost always a message, and its
// relation (a thread, an edit) stays in the clear for the walk to read.
func (p peeked) message() bool {
	return p.Type == "m.room.message" || p.Type == "m.sticker" || p.Type == "m.room.encrypted"
}

// threadReplyTo reports whether the event is a logical message of root's
// thread.
func (p peeked) threadReplyTo(root string) bool {
	rel, target := p.relation()
	return p.message() && rel == journal.RelThread && target == root
}

// roomMessage reports whether the event is a logical message of the room
// itself: not an edit, not in a thread.
func (p peeked) roomMessage() bool {
	rel, _ := p.relation()
	return p.message() && rel != "m.replace" && rel != journal.RelThread
}

// walker is one walk of one conversation. The caller's goroutine fetches;
// a second goroutine installs the chunks it hands over, so no request
// waits for a commit. Each side keeps its own counts until both are done.
type walker struct {
	d      *Deps
	room   string
	epoch  int64
	walk   Walk // the fetching side's counts
	chunks chan []journal.Inbound
	done   chan error
	cancel context.CancelFunc

	installed, installs int // the installing side's counts

	// held gathers the chunks of a thread walk instead of handing them
	// over, while holding is set (threadWalk).
	holding bool
	held    [][]json.RawMessage
}

// pipelineDepth is how many fetched chunks may wait for their install.
const pipelineDepth = 4

// run walks one conversation with fetch and, if every chunk was
// installed, publishes its coverage marker under the epoch the walk began
// in.
func (d *Deps) run(ctx context.Context, w Walk, thread *string, fetch func(context.Context, *walker) error) (Walk, error) {
	start := d.Now()
	epoch, departed, err := d.Store.RoomEpoch(ctx, w.RoomID)
	if err != nil {
		return w, fmt.Errorf("hydrate %s: %w", w.RoomID, err)
	}
	if departed {
		return w, fmt.Errorf("hydrate %s: %w: the agent is not in the room", w.RoomID, journal.ErrMembershipEnded)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wk := &walker{d: d, room: w.RoomID, epoch: epoch, walk: w, cancel: cancel,
		chunks: make(chan []journal.Inbound, pipelineDepth), done: make(chan error, 1)}
	go func() { wk.done <- wk.install(ctx) }()
	fetchErr := fetch(ctx, wk)
	close(wk.chunks)
	installErr := <-wk.done
	out := wk.walk
	out.Installed, out.Chunks = wk.installed, wk.installs
	switch {
	case installErr != nil:
		// The fetch saw only the cancellation the install caused.
		err = installErr
	case fetchErr != nil:
		err = fetchErr
	default:
		err = d.Store.MarkCovered(ctx, w.RoomID, thread, epoch)
	}
	out.Took = d.Now().Sub(start)
	if err != nil {
		return out, fmt.Errorf("hydrate %s: %w", w.RoomID, err)
	}
	return out, nil
}

// install installs chunks in order until the fetching side is done or an
// install fails.
func (w *walker) install(ctx context.Context) error {
	for chunk := range w.chunks {
		if _, err := w.d.Store.InstallHistory(ctx, w.room, w.epoch, chunk); err != nil {
			w.cancel()
			return fmt.Errorf("install history: %w", err)
		}
		w.installed += len(chunk)
		w.installs++
	}
	return nil
}

// emit hands a chunk to the installing side.
func (w *walker) emit(ctx context.Context, chunk []json.RawMessage) error {
	if len(chunk) == 0 {
		return nil
	}
	if w.holding {
		w.held = append(w.held, chunk)
		return nil
	}
	in := make([]journal.Inbound, len(chunk))
	for i, raw := range chunk {
		in[i] = w.d.history(ctx, w.room, raw)
	}
	select {
	case w.chunks <- in:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fits reports whether n more events stay within the ceiling.
func (w *walker) fits(n int) bool { return w.walk.Events+n <= w.d.Ceiling }

func (w *walker) event(ctx context.Context, id string) (json.RawMessage, error) {
	w.walk.Requests++
	return w.d.Transport.Event(ctx, w.room, id)
}

func (w *walker) relations(ctx context.Context, id, relType, from string) (matrix.RelationsPage, error) {
	w.walk.Requests++
	return w.d.Transport.Relations(ctx, w.room, id, relType, from, w.d.RelationsPageSize)
}

// roomWalk walks a room backwards from its newest event until the window of
// logical messages is full, the ceiling of raw events is reached, or the
// room's beginning. A walk that stops early stops right after a logical
// message, so everything newer than it (its edits above all) is installed
// with it and nothing older that targets what the walk never reaches is.
//
// It starts where the principal's sync stands (a sync token is a
// pagination token too): what the sync has yet to bring, it brings as live
// work. Fetched first as history, such a message would be known already
// when the sync brought it, and owed nothing.
func (w *walker) roomWalk(ctx context.Context) error {
	from, err := w.d.Store.SyncToken(ctx)
	if err != nil {
		return err
	}
	for {
		w.walk.Requests++
		page, err := w.d.Transport.Messages(ctx, w.room, from, matrix.Backward, w.d.PageSize)
		if err != nil {
			return err
		}
		chunk, boundary, stop := make([]json.RawMessage, 0, len(page.Chunk)), 0, false
		for _, raw := range page.Chunk {
			if !w.fits(1) {
				stop = true
				break
			}
			chunk = append(chunk, raw)
			w.walk.Events++
			if peek(raw).roomMessage() {
				w.walk.Messages++
				boundary = len(chunk)
				if w.walk.Messages >= w.d.Window {
					stop = true
					break
				}
			}
		}
		if !stop {
			boundary = len(chunk)
		}
		if err := w.emit(ctx, chunk[:boundary]); err != nil {
			return err
		}
		if stop {
			return nil
		}
		if page.End == "" || len(page.Chunk) == 0 {
			w.walk.Complete = true
			return nil
		}
		from = page.End
	}
}

// threadWalk walks a thread: its root, then its replies backwards, each
// with its own relations, then the root's edits.
//
// The walk asks for the replies by type: a server that does not recurse
// need not order an unfiltered walk across relation types. Dendrite
// collates each type's rows of a page separately and trims the one past
// the page from whichever type came last, so an unfiltered page can drop
// an event (the root's newest edit, say) and point next_batch past others.
// A server that answers with recursion_depth recurses and orders its pages
// as /messages does; the walk then starts again without a filter and takes
// the whole tree page by page. A walk that stops early stops right after a
// logical message with everything newer than it.
//
// It stands where the principal's sync stands, as a room walk does: what
// the sync has yet to bring (a reply, an edit, a reaction), it brings as
// live work, and installed first as history it would be owed nothing.
// Relations are not paged by sync tokens, so the walk holds what it
// fetched, lists the room's events after the sync's token once it has
// fetched everything (so the list covers whatever was sent meanwhile), and
// installs what it fetched without them.
func (w *walker) threadWalk(ctx context.Context, root string) error {
	w.holding = true
	err := w.fetchThread(ctx, root)
	w.holding = false
	if err != nil {
		return err
	}
	unsynced, err := w.unsynced(ctx)
	if err != nil {
		return err
	}
	for _, chunk := range w.held {
		kept := chunk[:0]
		for _, raw := range chunk {
			if !unsynced[peek(raw).EventID] {
				kept = append(kept, raw)
			}
		}
		if err := w.emit(ctx, kept); err != nil {
			return err
		}
	}
	return nil
}

// ErrSyncBehind fails a thread walk when more events than the ceiling lie
// after where the principal's sync stands: the walk cannot tell which of
// them the sync has yet to bring, and the sync catches up soon.
var ErrSyncBehind = errors.New("the sync is too far behind the room to bound a thread walk")

// unsynced lists the IDs of the room's events after the principal's sync
// token, forward from it. Before the first sync there are none: that sync
// is history itself.
func (w *walker) unsynced(ctx context.Context) (map[string]bool, error) {
	from, err := w.d.Store.SyncToken(ctx)
	if err != nil || from == "" {
		return nil, err
	}
	ids := map[string]bool{}
	for {
		w.walk.Requests++
		page, err := w.d.Transport.Messages(ctx, w.room, from, matrix.Forward, w.d.PageSize)
		if err != nil {
			return nil, err
		}
		for _, raw := range page.Chunk {
			ids[peek(raw).EventID] = true
		}
		if len(page.Chunk) == 0 || page.End == "" || page.End == from {
			return ids, nil
		}
		if len(ids) > w.d.Ceiling {
			return nil, fmt.Errorf("%w: more than %d events", ErrSyncBehind, w.d.Ceiling)
		}
		from = page.End
	}
}

// fetchThread fetches a thread walk's events (threadWalk).
func (w *walker) fetchThread(ctx context.Context, root string) error {
	raw, err := w.event(ctx, root)
	if err != nil {
		return err
	}
	w.walk.Events++
	if err := w.emit(ctx, []json.RawMessage{raw}); err != nil {
		return err
	}
	page, err := w.relations(ctx, root, "m.thread", "")
	if err != nil {
		return err
	}
	recursed := page.RecursionDepth != nil
	if recursed {
		if page, err = w.relations(ctx, root, "", ""); err != nil {
			return err
		}
	}
	stopped, err := w.replies(ctx, root, page, recursed)
	if err != nil {
		return err
	}
	if recursed && !stopped {
		return nil // the tree held the root's edits
	}
	// The root's edits lie outside a walk of its replies, or beyond where
	// the walk stopped; the root must not stay at a stale revision.
	return w.edits(ctx, root)
}

// replies walks the pages of root's relations from the first one, and
// reports whether the walk stopped early at the window or the ceiling.
func (w *walker) replies(ctx context.Context, root string, page matrix.RelationsPage, recursed bool) (stopped bool, err error) {
	relType := "m.thread"
	if recursed {
		relType = ""
	}
	for {
		chunk, boundary, stop := make([]json.RawMessage, 0, len(page.Chunk)), 0, false
		for _, raw := range page.Chunk {
			p := peek(raw)
			reply := p.threadReplyTo(root)
			var group []json.RawMessage
			if reply && !recursed {
				related, complete, err := w.descendants(ctx, p.EventID)
				if err != nil {
					return false, err
				}
				if !complete {
					stop = true
					break
				}
				group = related
			}
			if !w.fits(1 + len(group)) {
				stop = true
				break
			}
			chunk = append(append(chunk, raw), group...)
			w.walk.Events += 1 + len(group)
			if _, target := p.relation(); reply || target == root {
				boundary = len(chunk)
			}
			if reply {
				w.walk.Messages++
				if w.walk.Messages >= w.d.Window {
					stop = true
					break
				}
			}
		}
		if !stop {
			boundary = len(chunk)
		}
		if err := w.emit(ctx, chunk[:boundary]); err != nil {
			return false, err
		}
		if stop {
			return true, nil
		}
		if page.NextBatch == "" || len(page.Chunk) == 0 {
			w.walk.Complete = true
			return false, nil
		}
		if page, err = w.relations(ctx, root, relType, page.NextBatch); err != nil {
			return false, err
		}
	}
}

// replyRelations are the relation types of a reply the journal projects.
var replyRelations = [...]string{"m.replace", "m.annotation"}

// descendants fetches the relations of one reply of a server that does
// not recurse. complete is false when they do not fit the ceiling beside
// the reply itself.
func (w *walker) descendants(ctx context.Context, id string) (events []json.RawMessage, complete bool, err error) {
	if id == "" {
		return nil, true, nil // malformed: admission records it
	}
	budget := w.d.Ceiling - w.walk.Events - 1
	page, err := w.relations(ctx, id, "", "")
	if err != nil {
		return nil, false, err
	}
	if page.NextBatch == "" {
		return page.Chunk, len(page.Chunk) <= budget, nil
	}
	// More than a page, which an unfiltered walk of such a server may
	// not keep in order: each type on its own.
	for _, relType := range replyRelations {
		if events, complete, err = w.collect(ctx, id, relType, events, budget); err != nil || !complete {
			return nil, false, err
		}
	}
	return events, true, nil
}

// edits fetches the edits of one event, newest first, and installs as
// many as fit the ceiling.
func (w *walker) edits(ctx context.Context, id string) error {
	events, _, err := w.collect(ctx, id, "m.replace", nil, w.d.Ceiling-w.walk.Events)
	if err != nil {
		return err
	}
	w.walk.Events += len(events)
	return w.emit(ctx, events)
}

// collect appends id's relations of relType to events, page by page, up to
// budget events in all; complete is false when the budget cut them short,
// and then events holds the budget's worth.
func (w *walker) collect(ctx context.Context, id, relType string, events []json.RawMessage, budget int) (_ []json.RawMessage, complete bool, err error) {
	from := ""
	for {
		page, err := w.relations(ctx, id, relType, from)
		if err != nil {
			return nil, false, err
		}
		if len(events)+len(page.Chunk) > budget {
			return append(events, page.Chunk[:max(0, budget-len(events))]...), false, nil
		}
		events = append(events, page.Chunk...)
		if page.NextBatch == "" || len(page.Chunk) == 0 {
			return events, true, nil
		}
		from = page.NextBatch
	}
}
