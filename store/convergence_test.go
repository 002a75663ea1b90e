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
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// The defaults, with those of the paths property, keep a plain `go test
// -race` run of both to seconds on two cores over 500 conversations; a soak
// run raises them.
var (
	convergenceN      = flag.Int("convergence.n", 300, "conversations the convergence property test generates")
	convergenceOrders = flag.Int("convergence.orders", 6, "arrival orders each conversation is admitted in")
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
	mix  convMix
	evs  []convEvent
	used map[string]bool
	n    int // bodies are numbered, so every revision reads differently
}

// convMix weighs what a conversation is made of.
type convMix struct {
	// sidecars of every 12 originals, and sidecarEdits of every 8 edits,
	// carry only a sidecar preview.
	sidecars, sidecarEdits int
	// editRedactions of every 10 redactions remove an edit (when there is
	// one yet), one removes any event, and the rest an original.
	editRedactions int
	// editBursts of every 100 steps add a burst of the author's edits of
	// one message.
	editBursts int
}

// convPlainMix is the mix of the arrival order property.
var convPlainMix = convMix{sidecars: 2, sidecarEdits: 1, editRedactions: 5}

func generateConversation(rng *rand.Rand, mix convMix) []convEvent {
	g := &convGen{rng: rng, mix: mix, used: make(map[string]bool)}
	size := 3 + rng.IntN(10)
	g.original(g.pickSender())
	for len(g.evs) < size {
		if g.mix.editBursts > 0 && g.rng.IntN(100) < g.mix.editBursts {
			g.burst()
		} else {
			g.step()
		}
	}
	return g.evs
}

// burst adds two or three edits of one message by its author in a row, as
// a person correcting a message or the agent finishing a long answer would.
func (g *convGen) burst() {
	target := g.pick(func(e convEvent) bool { return e.original })
	for range 2 + g.rng.IntN(2) {
		g.edit(target, true)
	}
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
	switch r := g.rng.IntN(12); {
	case r < g.mix.sidecars:
		e.ev = mx.Sidecar(id, sender, ts, body)
		e.call = fmt.Sprintf("mx.Sidecar(%q, %s, %d, %q)", id, convSenderName(sender), ts, body)
	case r == g.mix.sidecars:
		e.ev = mx.Notice(id, sender, ts, body)
		e.call = fmt.Sprintf("mx.Notice(%q, %s, %d, %q)", id, convSenderName(sender), ts, body)
	case r == g.mix.sidecars+1:
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
	if g.rng.IntN(8) < g.mix.sidecarEdits {
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
	case !ok || r < 10-g.mix.editRedactions:
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

// restrict implements convPlan; emptied batches go.
func (a arrival) restrict(keep []int) convPlan {
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

// simpler implements convPlan: an arrival is as simple as its events.
func (a arrival) simpler() []convPlan { return nil }

// describe implements convPlan.
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

// convPlan is one way a conversation reaches a journal: which events
// arrive by which path, in what order, and what happens in between.
type convPlan interface {
	// deliver hands evs to v as the plan says and renders what v ends up
	// showing. Behaviour the plan finds wrong is rendered as a line
	// starting convViolation, so it is shrunk like a divergence; an error
	// is a failure of the harness itself.
	deliver(ctx context.Context, v journal.PrincipalStore, evs []convEvent) (string, error)
	// restrict keeps the events at the indices keep (ascending),
	// renumbered to their positions in keep.
	restrict(keep []int) convPlan
	// simpler lists plans that each do a little less, for a shrink to try.
	simpler() []convPlan
	// describe spells the plan out with the event IDs of evs.
	describe(evs []convEvent) string
}

// convViolation starts a rendered line that states a broken rule rather
// than what is seen.
const convViolation = "VIOLATION"

// convPlacement is where a journal keeps its visible rows until a reader
// asks: every row in the unmerged tail, or every row merged into the page
// index as it is written. Readers must not be able to tell.
type convPlacement struct {
	name string
	s    *store.Store
}

// convHarness delivers conversations into journals, each plan for a
// principal of its own: principals share nothing, so this is a fresh
// journal per plan at a fraction of the cost, and plans delivered at once
// share the writer's commits. Plans alternate between the two row
// placements, so a placement that reads differently diverges.
type convHarness struct {
	placements [2]convPlacement
	next       atomic.Int64
}

func newConvHarness(t *testing.T) *convHarness {
	// No merge cycle runs on its own: where a row is depends on the plan
	// alone. The tail journal's tail is merged between runs (run), so its
	// readers scan only the rows of the plans being compared.
	quiet := store.Options{StorageDir: t.TempDir(), MaxUnmergedTail: 1 << 30, MergeDelay: time.Hour}
	eager := store.Options{StorageDir: t.TempDir(), MaxUnmergedTail: 1, MergeDelay: time.Hour}
	return &convHarness{placements: [2]convPlacement{
		{"rows in the tail", testsupport.MustOpenWith(t, quiet)},
		{"rows in the page index", testsupport.MustOpenWith(t, eager)},
	}}
}

func (h *convHarness) placement(plan int) convPlacement { return h.placements[plan%len(h.placements)] }

// run delivers evs by every plan, concurrently, and returns what each
// principal ends up seeing.
func (h *convHarness) run(ctx context.Context, evs []convEvent, plans []convPlan) ([]string, error) {
	states := make([]string, len(plans))
	errs := make([]error, len(plans))
	var wg sync.WaitGroup
	for i, p := range plans {
		wg.Go(func() {
			v, err := h.placement(i).s.Principal(ctx, fmt.Sprintf("conv%d", h.next.Add(1)), convSelf)
			if err == nil {
				states[i], err = p.deliver(ctx, v, evs)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("plan %s: %w", plans[i].describe(evs), err)
		}
	}
	if _, err := h.placements[0].s.MergePageTail(ctx); err != nil {
		return nil, err
	}
	return states, nil
}

// deliver implements convPlan: every event arrives live, in the order and
// batches of a.
func (a arrival) deliver(ctx context.Context, v journal.PrincipalStore, evs []convEvent) (string, error) {
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
	view, _, err := observe(ctx, v, threadRoots(evs), nil)
	if err != nil {
		return "", err
	}
	pending, err := pendingTurns(ctx, v)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%spending: %v\n", view, pending), nil
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
// every page of a walk, what each page owes a refetch, and the latest
// visible event. With edits (each edit's target) set, a latest event that
// is a message owing a refetch, or a revision of one, is rendered as that
// message owing it: which bodiless revision it points at is not compared.
// It also returns every message the pages report owing a refetch.
func observe(ctx context.Context, v journal.PrincipalStore, roots []string, edits map[string]string) (string, []string, error) {
	var (
		b       strings.Builder
		allOwed []string
	)
	conversation := func(label string, thread *string) error {
		fmt.Fprintf(&b, "%s:\n", label)
		var owed []string
		defer func() { allOwed = append(allOwed, owed...) }()
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
			owed = append(owed, page.OwedRefetch...)
			b.WriteString("\n")
		}
		id, ok, err := v.LatestVisibleEventID(ctx, convRoom, thread)
		if err != nil {
			return err
		}
		if target, edit := edits[id]; edits != nil && (slices.Contains(owed, id) || edit && slices.Contains(owed, target)) {
			if edit {
				id = target
			}
			fmt.Fprintf(&b, "  latest: %q owing a refetch\n", id)
			return nil
		}
		fmt.Fprintf(&b, "  latest: %q %v\n", id, ok)
		return nil
	}
	if err := conversation("room", nil); err != nil {
		return "", nil, err
	}
	for _, root := range roots {
		if err := conversation("thread "+root, &root); err != nil {
			return "", nil, err
		}
	}
	return b.String(), allOwed, nil
}

// pendingTurns lists the events pending, owed a turn, sorted.
func pendingTurns(ctx context.Context, v journal.PrincipalStore) ([]string, error) {
	pending := []string{}
	for after := int64(0); ; {
		page, err := v.Pending(ctx, 64, after)
		if err != nil {
			return nil, err
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
	return pending, nil
}

// firstFailure is the first plan whose state breaks a rule or differs
// from the first plan's, or -1.
func firstFailure(states []string) int {
	for i, s := range states {
		if s != states[0] || strings.Contains(s, convViolation) {
			return i
		}
	}
	return -1
}

// shrink reduces a failing case to a small one: first to the first plan
// and one that fails (if those two still fail on their own), then, while
// they fail, it drops one event at a time from every plan and tries each
// plan's simpler variants. It reports the smallest case with the first
// plan and the one that fails.
func (h *convHarness) shrink(ctx context.Context, evs []convEvent, plans []convPlan) (string, error) {
	fails := func(evs []convEvent, plans []convPlan) (bool, error) {
		states, err := h.run(ctx, evs, plans)
		return err == nil && firstFailure(states) >= 0, err
	}
	if states, err := h.run(ctx, evs, plans); err != nil {
		return "", err
	} else if k := firstFailure(states); k < 0 {
		return "", fmt.Errorf("the failure did not reproduce")
	} else if k%len(h.placements) == 1 {
		// Two plans keep the failing one on its placement.
		if ok, err := fails(evs, []convPlan{plans[0], plans[k]}); err != nil {
			return "", err
		} else if ok {
			plans = []convPlan{plans[0], plans[k]}
		}
	}
	for changed := true; changed; {
		changed = false
		for i := 0; i < len(evs); {
			keep := slices.Delete(identity(len(evs)), i, i+1)
			sub := make([]convEvent, len(keep))
			for j, idx := range keep {
				sub[j] = evs[idx]
			}
			ps := make([]convPlan, len(plans))
			for j, p := range plans {
				ps[j] = p.restrict(keep)
			}
			ok, err := fails(sub, ps)
			if err != nil {
				return "", err
			}
			if !ok {
				i++
				continue
			}
			evs, plans, changed = sub, ps, true
		}
		for i := range plans {
			for _, p := range plans[i].simpler() {
				ps := slices.Clone(plans)
				ps[i] = p
				ok, err := fails(evs, ps)
				if err != nil {
					return "", err
				}
				if ok {
					plans, changed = ps, true
					break
				}
			}
		}
	}
	states, err := h.run(ctx, evs, plans)
	if err != nil {
		return "", err
	}
	k := firstFailure(states)
	if k < 0 {
		return "", fmt.Errorf("the failure did not reproduce")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "shrunk to %d events:\n", len(evs))
	for _, e := range evs {
		fmt.Fprintf(&b, "\t%s,\n", e.call)
	}
	b.WriteString("as JSON:\n")
	for _, e := range evs {
		fmt.Fprintf(&b, "\t%s\n", e.ev.JSON())
	}
	fmt.Fprintf(&b, "plan A (%s): %s\n%s", h.placement(0).name, plans[0].describe(evs), states[0])
	if k > 0 {
		fmt.Fprintf(&b, "plan B (%s): %s\n%s", h.placement(k).name, plans[k].describe(evs), states[k])
	}
	return b.String(), nil
}

// identity is the indices 0 to n-1.
func identity(n int) []int {
	ix := make([]int, n)
	for i := range ix {
		ix[i] = i
	}
	return ix
}

// TestEveryArrivalOrderOfAConversationConvergesOnOneView admits random small
// conversations (originals and thread replies; author and stranger edits
// at equal and unequal timestamps; edits of edits; redactions of originals
// and of visible, superseded and held edits; reactions; duplicates; the
// agent's own streaming progress and terminal edits) in many orders and
// batch splits, and requires every order to end at the same view: the same
// pages of the room and of each thread, the same refetch debts, the same
// latest visible event and the same pending work, whether the journal keeps
// its rows in the page index's tail or merges each into the index at once.
// A divergence is shrunk to a minimal event list and printed as builder
// calls.
func TestEveryArrivalOrderOfAConversationConvergesOnOneView(t *testing.T) {
	ctx := context.Background()
	h := newConvHarness(t)
	diverged := 0
	for c := range *convergenceN {
		rng := rand.New(rand.NewPCG(*convergenceSeed, uint64(c)))
		evs := generateConversation(rng, convPlainMix)
		arrivals := make([]convPlan, max(*convergenceOrders, 2))
		for i := range arrivals {
			arrivals[i] = randomArrival(rng, len(evs), i == 0)
		}
		states, err := h.run(ctx, evs, arrivals)
		if err != nil {
			t.Fatalf("conversation %d: %v", c, err)
		}
		if firstFailure(states) < 0 {
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
