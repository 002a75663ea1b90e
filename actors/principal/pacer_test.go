package principal

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/matrix"
)

// pacerDeadline bounds each wait of the pacer tests on the pacer.
const pacerDeadline = 10 * time.Second

// edit is one send the pacer made: its text, its context, and where the
// test answers it.
type edit struct {
	text   string
	ctx    context.Context
	answer chan error
}

// pacerRig is a pacer whose sends and waits the test holds and answers,
// and whose clock moves only by the waits it makes.
type pacerRig struct {
	t     *testing.T
	p     *pacer
	edits chan edit
	// waits hears of each wait the pacer makes; the test releases it by
	// sending on resume, and the clock moves by the wait.
	waits  chan time.Duration
	resume chan struct{}

	mu    sync.Mutex
	clock time.Time
}

func newPacerRig(t *testing.T, burst int, refill time.Duration) *pacerRig {
	t.Helper()
	r := &pacerRig{t: t, edits: make(chan edit), waits: make(chan time.Duration), resume: make(chan struct{}),
		clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	send := func(ctx context.Context, text string) error {
		e := edit{text: text, ctx: ctx, answer: make(chan error)}
		r.edits <- e
		// Answered by the test alone, whatever ctx says: a send that
		// ignores its context must not hold up stop either.
		return <-e.answer
	}
	wait := func(ctx context.Context, d time.Duration) bool {
		select {
		case r.waits <- d:
		case <-ctx.Done():
			return false
		}
		select {
		case <-r.resume:
			r.mu.Lock()
			r.clock = r.clock.Add(d)
			r.mu.Unlock()
			return true
		case <-ctx.Done():
			return false
		}
	}
	r.p = newPacer(context.Background(), send, newBucket(burst, refill, r.now()), r.now, wait, zerolog.Nop())
	go r.p.run()
	t.Cleanup(func() {
		r.p.stop()
		// Answer whatever send is still held, then wait for the end.
		for {
			select {
			case e := <-r.edits:
				close(e.answer)
			case <-r.p.done:
				return
			}
		}
	})
	return r
}

func (r *pacerRig) now() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.clock
}

// nextEdit waits for the pacer's next send.
func (r *pacerRig) nextEdit() edit {
	r.t.Helper()
	select {
	case e := <-r.edits:
		return e
	case d := <-r.waits:
		r.t.Fatalf("the pacer waits %s, want a send", d)
	case <-time.After(pacerDeadline):
		r.t.Fatal("the pacer never sent")
	}
	return edit{}
}

// nextWait waits for the pacer's next wait.
func (r *pacerRig) nextWait() time.Duration {
	r.t.Helper()
	select {
	case d := <-r.waits:
		return d
	case e := <-r.edits:
		r.t.Fatalf("the pacer sent %q, want a wait", e.text)
	case <-time.After(pacerDeadline):
		r.t.Fatal("the pacer never waited")
	}
	return 0
}

// quiet fails if the pacer sends or waits once it has settled: its
// goroutine ended, or it is idle with nothing pending.
func (r *pacerRig) quiet() {
	r.t.Helper()
	r.p.stop()
	select {
	case <-r.p.done:
	case e := <-r.edits:
		r.t.Fatalf("the pacer sent %q, want nothing more", e.text)
	case d := <-r.waits:
		r.t.Fatalf("the pacer waits %s, want nothing more", d)
	case <-time.After(pacerDeadline):
		r.t.Fatal("the pacer never ended")
	}
}

func TestThePacerCoalescesTheTextsOfferedDuringAnEditToTheNewest(t *testing.T) {
	r := newPacerRig(t, DefaultProgressBurst, DefaultProgressRefill)
	r.p.offer("The")
	first := r.nextEdit()
	// In flight: these return at once, and only the newest is kept.
	r.p.offer("The answer")
	r.p.offer("The answer is")
	r.p.offer("The answer is 42")
	first.answer <- nil
	if e := r.nextEdit(); e.text != "The answer is 42" {
		t.Fatalf("second edit %q, want the newest text", e.text)
	} else {
		e.answer <- nil
	}
	if first.text != "The" {
		t.Fatalf("first edit %q, want The", first.text)
	}
	r.quiet()
}

func TestThePacerSpendsItsBurstThenSendsOneEditPerRefill(t *testing.T) {
	r := newPacerRig(t, 2, 5*time.Second)
	var sent []string
	for _, text := range []string{"one", "two"} {
		r.p.offer(text)
		e := r.nextEdit()
		sent = append(sent, e.text)
		e.answer <- nil
	}
	// The burst is spent: the third waits for a token, and what comes
	// meanwhile is what it sends.
	r.p.offer("three")
	if d := r.nextWait(); d != 5*time.Second {
		t.Fatalf("the pacer waits %s, want a refill of 5s", d)
	}
	r.p.offer("three and four")
	r.resume <- struct{}{}
	e := r.nextEdit()
	sent = append(sent, e.text)
	e.answer <- nil
	if want := []string{"one", "two", "three and four"}; !slices.Equal(sent, want) {
		t.Fatalf("edits %q, want %q", sent, want)
	}
	r.quiet()
}

func TestThePacerWaitsOutA429sRetryAfterThenSendsTheNewestText(t *testing.T) {
	r := newPacerRig(t, DefaultProgressBurst, DefaultProgressRefill)
	r.p.offer("The")
	r.nextEdit().answer <- &matrix.HTTPError{Status: 429, ErrCode: "M_LIMIT_EXCEEDED", RetryAfter: 3 * time.Second}
	// The server's wait, though the budget had tokens left; the refused
	// text is sent again after it when nothing newer came.
	if d := r.nextWait(); d != 3*time.Second {
		t.Fatalf("after a 429 the pacer waits %s, want the server's 3s", d)
	}
	r.resume <- struct{}{}
	again := r.nextEdit()
	if again.text != "The" {
		t.Fatalf("after the wait the pacer sent %q, want the refused text again", again.text)
	}
	again.answer <- &matrix.HTTPError{Status: 429, RetryAfter: 2 * time.Second}
	if d := r.nextWait(); d != 2*time.Second {
		t.Fatalf("after a second 429 the pacer waits %s, want 2s", d)
	}
	// A newer text during the wait is the one sent after it.
	r.p.offer("The answer")
	r.resume <- struct{}{}
	if e := r.nextEdit(); e.text != "The answer" {
		t.Fatalf("after the wait the pacer sent %q, want the newest text", e.text)
	} else {
		e.answer <- nil
	}
	r.quiet()
}

// Answer returned: a pending text is dropped, the edit in flight is
// cancelled, and nothing is sent after, all without waiting for that edit.
func TestThePacerStopsAtOnceAndSendsNothingAfterTheAnswer(t *testing.T) {
	r := newPacerRig(t, DefaultProgressBurst, DefaultProgressRefill)
	r.p.offer("The")
	inFlight := r.nextEdit()
	r.p.offer("The answer") // pending behind it
	stopped := make(chan struct{})
	go func() {
		r.p.stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(pacerDeadline):
		t.Fatal("stop waited for the edit in flight")
	}
	if inFlight.ctx.Err() == nil {
		t.Fatal("the edit in flight was not cancelled")
	}
	r.p.offer("The answer is 42") // after Answer returned: dropped
	inFlight.answer <- context.Canceled
	select {
	case <-r.p.done:
	case e := <-r.edits:
		t.Fatalf("the pacer sent %q after it was stopped", e.text)
	case d := <-r.waits:
		t.Fatalf("the pacer waits %s after it was stopped", d)
	case <-time.After(pacerDeadline):
		t.Fatal("the pacer never ended")
	}
}

// An edit not shown (no placeholder yet) costs no token.
func TestAnEditNotShownCostsNothingOfTheBudget(t *testing.T) {
	r := newPacerRig(t, 1, time.Hour)
	r.p.offer("too early")
	r.nextEdit().answer <- errNotShown
	r.p.offer("shown")
	if e := r.nextEdit(); e.text != "shown" {
		t.Fatalf("edit %q, want shown without a wait", e.text)
	} else {
		e.answer <- nil
	}
	r.quiet()
}

func TestTheBudgetRefillsOneTokenPerRefillUpToItsBurst(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := newBucket(2, 5*time.Second, start)
	at := func(d time.Duration) time.Time { return start.Add(d) }
	for i, step := range []struct {
		at   time.Duration
		want time.Duration
	}{
		{0, 0}, {0, 0}, // the burst
		{time.Second, 4 * time.Second}, // one due 5s after the first was taken
		{5 * time.Second, 0},
		{6 * time.Second, 4 * time.Second},
		{time.Minute, 0}, {time.Minute, 0}, // full again, no more than the burst
		{time.Minute, 5 * time.Second},
	} {
		if got := b.take(at(step.at)); got != step.want {
			t.Fatalf("take %d at %s = %s, want %s", i, step.at, got, step.want)
		}
	}
}
