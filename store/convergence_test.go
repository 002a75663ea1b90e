package store_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// The defaults keep a plain `go test -race` run to seconds on two cores;
// a soak run raises them.
var (
	convergenceN      = flag.Int("convergence.n", 300, "conversations the convergence property test generates")
	convergenceOrders = flag.Int("convergence.orders", 10, "arrival orders each conversation is admitted in")
	convergenceSeed   = flag.Uint64("convergence.seed", 1, "seed the conversations and their arrival orders derive from")
)

// convergenceReported bounds how many diverging conversations are shrunk
// and printed; the rest are only counted.
const convergenceReported = 3

// convergencePage is the page size the conversations are walked with:
// small, so every walk crosses page boundaries and cursors.
const convergencePage = 2

const (
	convRoom  = "!convergence:example.org"
	convAlice = "@alice:example.org"
	convBob   = "@bob:example.org"
	// convSelf is the account of every principal the conversations are
	// admitted for, so its streaming progress edits are transport only.
	convSelf = "@mindroom:example.org"
)

// convSenderName spells a sender as the constant a shrunk case prints, so
// the case pastes back into a test.
func convSenderName(sender string) string {
	switch sender {
	case convAlice:
		return "convAlice"
	case convBob:
		return "convBob"
	case convSelf:
		return "convSelf"
	}
	return fmt.Sprintf("%q", sender)
}

// convSidecarContent is the new content of an edit whose real text lives in
// an attached file: what it shows is only a preview.
func convSidecarContent(preview string) map[string]any {
	return map[string]any{
		"msgtype": "m.text", "body": preview, "url": "mxc://example.org/sidecar",
		journal.LongTextKey: map[string]any{"version": 2, "encoding": "matrix_event_content_json"},
	}
}

// convEvent is one generated event, the builder call that makes it, and
// what later events of the conversation may refer to.
type convEvent struct {
	ev     mx.Ev
	call   string
	id     string
	sender string
	ts     int64
	// original is set for a logical message, edit for an m.replace, and
	// opaque for ciphertext: journaled, never shown.
	original, edit, opaque bool
	// root is the thread a reply is in.
	root string
}

// convGen generates one conversation. Event IDs are two letters from a
// mix of upper and lower case, so ties between equal timestamps are broken
// by byte order both ways; timestamps sit in a narrow window so ties happen.
type convGen struct {
	rng  *rand.Rand
	evs  []convEvent
	used map[string]bool
	n    int // bodies are numbered, so every revision reads differently
}

func generateConversation(rng *rand.Rand) []convEvent {
	g := &convGen{rng: rng, used: make(map[string]bool)}
	size := 3 + rng.IntN(10)
	g.original(g.pickSender())
	for len(g.evs) < size {
		g.step()
	}
	return g.evs
}

func (g *convGen) step() {
	switch r := g.rng.IntN(100); {
	case r < 16:
		g.original(g.pickSender())
	case r < 26:
		g.threadReply()
	case r < 44:
		g.edit(g.pick(func(e convEvent) bool { return e.original }), true)
	case r < 52:
		g.edit(g.pick(func(e convEvent) bool { return e.original }), false)
	case r < 57:
		// An edit of something that never shows: another edit, or
		// ciphertext (which arrives here first when there is none yet).
		target, ok := g.find(func(e convEvent) bool { return e.edit || e.opaque })
		if !ok {
			id, sender, ts := g.newID(), g.pickSender(), 1000+int64(g.rng.IntN(8))
			target = convEvent{ev: mx.Encrypted(id, sender, ts), id: id, sender: sender, ts: ts, opaque: true,
				call: fmt.Sprintf("mx.Encrypted(%q, %s, %d)", id, convSenderName(sender), ts)}
			g.add(target)
		}
		g.edit(target, true)
	case r < 71:
		g.redaction()
	case r < 76:
		target := g.pick(func(e convEvent) bool { return e.original || e.opaque })
		id, sender := g.newID(), g.pickSender()
		g.add(convEvent{ev: mx.Reaction(id, sender, target.ts+1, target.id, "+1"), id: id, sender: sender, ts: target.ts + 1,
			call: fmt.Sprintf("mx.Reaction(%q, %s, %d, %q, %q)", id, convSenderName(sender), target.ts+1, target.id, "+1")})
	case r < 82:
		g.add(g.evs[g.rng.IntN(len(g.evs))]) // the same event delivered again
	case r < 94:
		g.stream()
	default:
		// An edit of a message that never arrives stays held.
		g.edit(convEvent{id: g.newID(), sender: g.pickSender(), ts: 1000 + int64(g.rng.IntN(8))}, true)
	}
}

func (g *convGen) add(e convEvent) { g.evs = append(g.evs, e) }

func (g *convGen) body() string {
	g.n++
	return fmt.Sprintf("words %d", g.n)
}

func (g *convGen) newID() string {
	const letters = "ABYZabyz"
	for {
		id := "$" + string(letters[g.rng.IntN(len(letters))]) + string(letters[g.rng.IntN(len(letters))])
		if !g.used[id] {
			g.used[id] = true
			return id
		}
	}
}

func (g *convGen) pickSender() string {
	switch r := g.rng.IntN(10); {
	case r < 5:
		return convAlice
	case r < 8:
		return convBob
	}
	return convSelf
}

// find returns a random earlier event that ok accepts.
func (g *convGen) find(ok func(convEvent) bool) (convEvent, bool) {
	var c []convEvent
	for _, e := range g.evs {
		if ok(e) {
			c = append(c, e)
		}
	}
	if len(c) == 0 {
		return convEvent{}, false
	}
	return c[g.rng.IntN(len(c))], true
}

// pick is find for a kind every conversation has from its first event on.
func (g *convGen) pick(ok func(convEvent) bool) convEvent {
	e, _ := g.find(ok)
	return e
}

func (g *convGen) original(sender string) convEvent {
	id, ts, body := g.newID(), 1000+int64(g.rng.IntN(8)), g.body()
	e := convEvent{id: id, sender: sender, ts: ts, original: true}
	switch g.rng.IntN(12) {
	case 0, 1:
		e.ev = mx.Sidecar(id, sender, ts, body)
		e.call = fmt.Sprintf("mx.Sidecar(%q, %s, %d, %q)", id, convSenderName(sender), ts, body)
	case 2:
		e.ev = mx.Notice(id, sender, ts, body)
		e.call = fmt.Sprintf("mx.Notice(%q, %s, %d, %q)", id, convSenderName(sender), ts, body)
	case 3:
		e.ev = mx.Image(id, sender, ts)
		e.call = fmt.Sprintf("mx.Image(%q, %s, %d)", id, convSenderName(sender), ts)
	default:
		e.ev = mx.Message(id, sender, ts, body)
		e.call = fmt.Sprintf("mx.Message(%q, %s, %d, %q)", id, convSenderName(sender), ts, body)
	}
	g.add(e)
	return e
}

func (g *convGen) threadReply() {
	root := g.pick(func(e convEvent) bool { return e.original })
	id, sender, body := g.newID(), g.pickSender(), g.body()
	ts := root.ts + int64(g.rng.IntN(4))
	g.add(convEvent{ev: mx.ThreadReply(id, sender, ts, root.id, body), id: id, sender: sender, ts: ts, original: true, root: root.id,
		call: fmt.Sprintf("mx.ThreadReply(%q, %s, %d, %q, %q)", id, convSenderName(sender), ts, root.id, body)})
}

// edit replaces target, by its author or by a stranger, at a timestamp
// just before, equal to or after the target's.
func (g *convGen) edit(target convEvent, byAuthor bool) {
	sender := target.sender
	if !byAuthor {
		for sender == target.sender {
			sender = g.pickSender()
		}
	}
	id, body := g.newID(), g.body()
	ts := target.ts - 1 + int64(g.rng.IntN(5))
	e := convEvent{id: id, sender: sender, ts: ts, edit: true}
	if g.rng.IntN(8) == 0 {
		e.ev = mx.EditContent(id, sender, ts, target.id, convSidecarContent(body))
		e.call = fmt.Sprintf("mx.EditContent(%q, %s, %d, %q, convSidecarContent(%q))", id, convSenderName(sender), ts, target.id, body)
	} else {
		e.ev = mx.Edit(id, sender, ts, target.id, body)
		e.call = fmt.Sprintf("mx.Edit(%q, %s, %d, %q, %q)", id, convSenderName(sender), ts, target.id, body)
	}
	g.add(e)
}

// stream adds the agent's own streaming progress edit of one of its
// messages, or the terminal edit that ends the stream.
func (g *convGen) stream() {
	target, ok := g.find(func(e convEvent) bool { return e.original && e.sender == convSelf })
	if !ok {
		target = g.original(convSelf)
	}
	status := []string{"streaming", "pending", "streaming", "completed"}[g.rng.IntN(4)]
	id, body := g.newID(), g.body()
	ts := target.ts + int64(g.rng.IntN(5))
	g.add(convEvent{ev: mx.StreamEdit(id, convSelf, ts, target.id, body, status), id: id, sender: convSelf, ts: ts, edit: true,
		call: fmt.Sprintf("mx.StreamEdit(%q, convSelf, %d, %q, %q, %q)", id, ts, target.id, body, status)})
}

// redaction removes an earlier original or edit (the revision on screen or
// not), or now and then any other event: a reaction, ciphertext or another
// redaction.
func (g *convGen) redaction() {
	target, ok := g.find(func(e convEvent) bool { return e.edit })
	switch r := g.rng.IntN(10); {
	case r == 0:
		target = g.pick(func(e convEvent) bool { return true })
	case !ok || r < 5:
		target = g.pick(func(e convEvent) bool { return e.original })
	}
	id, sender := g.newID(), g.pickSender()
	ts := int64(1010 + g.rng.IntN(5))
	g.add(convEvent{ev: mx.Redaction(id, sender, ts, target.id), id: id, sender: sender, ts: ts,
		call: fmt.Sprintf("mx.Redaction(%q, %s, %d, %q)", id, convSenderName(sender), ts, target.id)})
}

// arrival is one order a conversation reaches the journal in: sync
// batches of indices into the conversation.
type arrival [][]int

// randomArrival shuffles the conversation unless inOrder, and splits it
// into batches of one event each, one batch, or batches of random sizes.
func randomArrival(rng *rand.Rand, n int, inOrder bool) arrival {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	if !inOrder {
		rng.Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
	}
	mode := rng.IntN(3)
	var a arrival
	for i, idx := range order {
		if i == 0 || mode == 0 || (mode == 2 && rng.IntN(2) == 0) {
			a = append(a, nil)
		}
		a[len(a)-1] = append(a[len(a)-1], idx)
	}
	return a
}

// restrict keeps the events of a at the indices keep (ascending), renumbered
// to their positions in keep; emptied batches go.
func (a arrival) restrict(keep []int) arrival {
	at := make(map[int]int, len(keep))
	for i, k := range keep {
		at[k] = i
	}
	var out arrival
	for _, b := range a {
		var nb []int
		for _, idx := range b {
			if i, ok := at[idx]; ok {
				nb = append(nb, i)
			}
		}
		if nb != nil {
			out = append(out, nb)
		}
	}
	return out
}

func (a arrival) describe(evs []convEvent) string {
	var b strings.Builder
	for _, batch := range a {
		b.WriteString("[")
		for i, idx := range batch {
			if i > 0 {
				b.WriteString(" ")
			}
			b.WriteString(evs[idx].id)
		}
		b.WriteString("] ")
	}
	return strings.TrimSpace(b.String())
}

// convHarness admits conversations into one store, each arrival for a
// principal of its own: principals share nothing, so this is a fresh
// journal per arrival at a fraction of the cost, and arrivals admitted at
// once share the writer's commits.
type convHarness struct {
	s    journal.Store
	next atomic.Int64
}

// run admits evs in every arrival, concurrently, and returns what each
// principal ends up seeing.
func (h *convHarness) run(ctx context.Context, evs []convEvent, arrivals []arrival) ([]string, error) {
	states := make([]string, len(arrivals))
	errs := make([]error, len(arrivals))
	var wg sync.WaitGroup
	for i, a := range arrivals {
		wg.Go(func() { states[i], errs[i] = h.runOne(ctx, evs, a) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("arrival %s: %w", arrivals[i].describe(evs), err)
		}
	}
	return states, nil
}

func (h *convHarness) runOne(ctx context.Context, evs []convEvent, a arrival) (string, error) {
	v, err := h.s.Principal(ctx, fmt.Sprintf("conv%d", h.next.Add(1)), convSelf)
	if err != nil {
		return "", err
	}
	seen := make(map[string]bool)
	for bi, batch := range a {
		in := make([]journal.Inbound, len(batch))
		for i, idx := range batch {
			in[i] = evs[idx].ev.In(convRoom, journal.Live)
		}
		token := fmt.Sprintf("batch-%d", bi)
		res, err := v.AdmitBatch(ctx, in, token)
		if err != nil {
			return "", err
		}
		for i, r := range res {
			id := evs[batch[i]].id
			want := journal.Admitted
			if seen[id] {
				want = journal.Duplicate
			}
			seen[id] = true
			if r.Outcome != want || r.EventID != id {
				return "", fmt.Errorf("%s: %s (%v), want %s", id, r.Outcome, r.Err, want)
			}
		}
		if got, err := v.SyncToken(ctx); err != nil || got != token {
			return "", fmt.Errorf("sync token %q, %v; want %q", got, err, token)
		}
	}
	return observe(ctx, v, threadRoots(evs))
}

func threadRoots(evs []convEvent) []string {
	var roots []string
	for _, e := range evs {
		if e.root != "" && !slices.Contains(roots, e.root) {
			roots = append(roots, e.root)
		}
	}
	slices.Sort(roots)
	return roots
}

// observe renders everything a reader can see of the room and each thread:
// every page of a walk, what each page owes a refetch, the latest visible
// event, and which events are still owed a turn.
func observe(ctx context.Context, v journal.PrincipalStore, roots []string) (string, error) {
	var b strings.Builder
	conversation := func(label string, thread *string) error {
		fmt.Fprintf(&b, "%s:\n", label)
		for page, err := range journal.Export(ctx, v, convRoom, thread, convergencePage) {
			if err != nil {
				return err
			}
			b.WriteString("  page:")
			for _, m := range page.Messages {
				th := ""
				if m.Thread != nil {
					th = " in " + *m.Thread
				}
				fmt.Fprintf(&b, " %s{%s@%d by %s at %d%s %s}", m.EventID, m.RevisionID, m.RevisionTS,
					convSenderName(m.Sender), m.CreatedTS, th, m.Content)
			}
			if len(page.OwedRefetch) > 0 {
				fmt.Fprintf(&b, " owed %v", page.OwedRefetch)
			}
			b.WriteString("\n")
		}
		id, ok, err := v.LatestVisibleEventID(ctx, convRoom, thread)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "  latest: %q %v\n", id, ok)
		return nil
	}
	if err := conversation("room", nil); err != nil {
		return "", err
	}
	for _, root := range roots {
		if err := conversation("thread "+root, &root); err != nil {
			return "", err
		}
	}
	var pending []string
	for after := int64(0); ; {
		page, err := v.Pending(ctx, 64, after)
		if err != nil {
			return "", err
		}
		for _, e := range page.Events {
			pending = append(pending, e.EventID)
		}
		if !page.More {
			break
		}
		after = page.Next
	}
	slices.Sort(pending)
	fmt.Fprintf(&b, "pending: %v\n", pending)
	return b.String(), nil
}

// firstDivergence is the first arrival whose state differs from the
// first arrival's, or -1.
func firstDivergence(states []string) int {
	for i, s := range states {
		if s != states[0] {
			return i
		}
	}
	return -1
}

// shrink drops one event at a time while some arrival still diverges
// (every arrival is restricted to the events left), then reports the
// smallest case with the two arrivals that disagree.
func (h *convHarness) shrink(ctx context.Context, evs []convEvent, arrivals []arrival) (string, error) {
	keep := make([]int, len(evs))
	for i := range keep {
		keep[i] = i
	}
	try := func(keep []int) (sub []convEvent, as []arrival, states []string, k int, err error) {
		for _, i := range keep {
			sub = append(sub, evs[i])
		}
		for _, a := range arrivals {
			as = append(as, a.restrict(keep))
		}
		if states, err = h.run(ctx, sub, as); err != nil {
			return nil, nil, nil, -1, err
		}
		return sub, as, states, firstDivergence(states), nil
	}
	for dropped := true; dropped; {
		dropped = false
		for i := 0; i < len(keep); {
			cand := slices.Delete(slices.Clone(keep), i, i+1)
			_, _, _, k, err := try(cand)
			if err != nil {
				return "", err
			}
			if k < 0 {
				i++
				continue
			}
			keep, dropped = cand, true
		}
	}
	sub, as, states, k, err := try(keep)
	if err != nil {
		return "", err
	}
	if k < 0 {
		return "", fmt.Errorf("the divergence did not reproduce")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "shrunk to %d events:\n", len(sub))
	for _, e := range sub {
		fmt.Fprintf(&b, "\t%s,\n", e.call)
	}
	b.WriteString("as JSON:\n")
	for _, e := range sub {
		fmt.Fprintf(&b, "\t%s\n", e.ev.JSON())
	}
	fmt.Fprintf(&b, "arrival A: %s\n%s", as[0].describe(sub), states[0])
	fmt.Fprintf(&b, "arrival B: %s\n%s", as[k].describe(sub), states[k])
	return b.String(), nil
}

// TestEveryArrivalOrderOfAConversationConvergesOnOneView admits random small
// conversations (originals and thread replies; author and stranger edits
// at equal and unequal timestamps; edits of edits; redactions of originals
// and of visible, superseded and held edits; reactions; duplicates; the
// agent's own streaming progress and terminal edits) in many orders and
// batch splits, and requires every order to end at the same view: the same
// pages of the room and of each thread, the same refetch debts, the same
// latest visible event and the same pending work. A divergence is shrunk to
// a minimal event list and printed as builder calls.
func TestEveryArrivalOrderOfAConversationConvergesOnOneView(t *testing.T) {
	ctx := context.Background()
	s, _ := testsupport.MustOpen(t)
	h := &convHarness{s: s}
	diverged := 0
	for c := range *convergenceN {
		rng := rand.New(rand.NewPCG(*convergenceSeed, uint64(c)))
		evs := generateConversation(rng)
		arrivals := make([]arrival, max(*convergenceOrders, 2))
		for i := range arrivals {
			arrivals[i] = randomArrival(rng, len(evs), i == 0)
		}
		states, err := h.run(ctx, evs, arrivals)
		if err != nil {
			t.Fatalf("conversation %d: %v", c, err)
		}
		if firstDivergence(states) < 0 {
			continue
		}
		diverged++
		if diverged > convergenceReported {
			continue
		}
		report, err := h.shrink(ctx, evs, arrivals)
		if err != nil {
			t.Fatalf("conversation %d: shrink: %v", c, err)
		}
		t.Errorf("conversation %d (seed %d) ends differently by arrival order; %s", c, *convergenceSeed, report)
	}
	if diverged > 0 {
		t.Errorf("%d of %d conversations ended differently by arrival order (seed %d)", diverged, *convergenceN, *convergenceSeed)
	}
}
