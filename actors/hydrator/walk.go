package hydrator

import (
	"context"
	"encoding/json"
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
	return p.Content.RelatesTo.RelType, p.Content.RelatesTo.EventID
}

func (p peeked) message() bool { return p.Type == "m.room.message" || p.Type == "m.sticker" }

// threadReplyTo reports whether the event is a logical message of root's
// thread.
func (p peeked) threadReplyTo(root string) bool {
	rel, target := p.relation()
	return p.message() && rel == "m.thread" && target == root
}

// roomMessage reports whether the event is a logical message of the room
// itself: not an edit, not in a thread.
func (p peeked) roomMessage() bool {
	rel, _ := p.relation()
	return p.message() && rel != "m.replace" && rel != "m.thread"
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
	in := make([]journal.Inbound, len(chunk))
	for i, raw := range chunk {
		in[i] = journal.Inbound{RoomID: w.room, Provenance: journal.History, Event: raw}
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

// threadWalk walks a thread: its root, then its relations backwards. A
// server that recursed (recursion_depth present) returned the whole tree;
// one that did not (Dendrite) returned the root's direct children only, so
// each reply's own relations (its edits) are walked here, under the same
// window and ceiling. A walk that stops early stops right after a logical
// message with everything newer than it.
func (w *walker) threadWalk(ctx context.Context, root string) error {
	raw, err := w.event(ctx, root)
	if err != nil {
		return err
	}
	w.walk.Events++
	if err := w.emit(ctx, []json.RawMessage{raw}); err != nil {
		return err
	}
	from := ""
	for {
		page, err := w.relations(ctx, root, "", from)
		if err != nil {
			return err
		}
		recursed := page.RecursionDepth != nil
		chunk, boundary, stop := make([]json.RawMessage, 0, len(page.Chunk)), 0, false
		for _, raw := range page.Chunk {
			p := peek(raw)
			reply := p.threadReplyTo(root)
			var group []json.RawMessage
			if reply && !recursed {
				edits, complete, err := w.descendants(ctx, p.EventID)
				if err != nil {
					return err
				}
				if !complete {
					stop = true
					break
				}
				group = edits
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
			return err
		}
		if !stop && (page.NextBatch == "" || len(page.Chunk) == 0) {
			w.walk.Complete = true
			return nil
		}
		if stop {
			// The root's own edits may lie beyond where the walk stopped;
			// the root must not stay at a stale revision.
			return w.edits(ctx, root)
		}
		from = page.NextBatch
	}
}

// descendants walks the relations of one reply of a server that does not
// recurse. complete is false when they do not fit the ceiling beside the
// reply itself.
func (w *walker) descendants(ctx context.Context, id string) (events []json.RawMessage, complete bool, err error) {
	if id == "" {
		return nil, true, nil // malformed: admission records it
	}
	from := ""
	for {
		page, err := w.relations(ctx, id, "", from)
		if err != nil {
			return nil, false, err
		}
		events = append(events, page.Chunk...)
		if !w.fits(1 + len(events)) {
			return nil, false, nil
		}
		if page.NextBatch == "" || len(page.Chunk) == 0 {
			return events, true, nil
		}
		from = page.NextBatch
	}
}

// edits walks the edits of one event and installs them, within the
// ceiling.
func (w *walker) edits(ctx context.Context, id string) error {
	from := ""
	for {
		page, err := w.relations(ctx, id, "m.replace", from)
		if err != nil {
			return err
		}
		n := len(page.Chunk)
		if !w.fits(n) {
			n = max(0, w.d.Ceiling-w.walk.Events)
		}
		w.walk.Events += n
		if err := w.emit(ctx, page.Chunk[:n]); err != nil {
			return err
		}
		if n < len(page.Chunk) || page.NextBatch == "" || len(page.Chunk) == 0 {
			return nil
		}
		from = page.NextBatch
	}
}
