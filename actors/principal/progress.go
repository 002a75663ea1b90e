package principal

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// progressTimeout bounds one progress edit: the edit is worth less than
// the answer, and a stalled one holds back the newer texts behind it.
const progressTimeout = 5 * time.Second

// errNotShown is a progress edit that was not sent, and so cost nothing
// of the budget: no placeholder to edit yet, or a membership that ended.
var errNotShown = errors.New("progress not shown")

// progress is Turn.Progress for the turn of e, whose delivery is id, and
// the function that ends it, called once Answer returned. Each call hands
// the newest text to the turn's pacer and returns at once. The pacer
// edits the placeholder, once the outbox has it acknowledged (until then
// there is nothing to edit and a text is dropped) and while the
// membership e came under is the room's, straight through the transport.
// The edit is marked in progress in its content and in its new content,
// so the projection drops its sync echo (journal.IsTransportProgress), and
// it carries no delivery marker, so no reconciliation mistakes it for a
// stage of the reply. Its transaction ID is random: an edit is never
// retried as such (after a 429 the newest text is a new edit), and a
// retried turn's edits must not be taken for its earlier attempt's.
func (a *principalActor) progress(ctx context.Context, e journal.PendingEvent, id string) (progress func(context.Context, string), stop func()) {
	log := a.log.With().Str("event_id", e.EventID).Logger()
	var target string // the placeholder's event ID, once acknowledged; the pacer's goroutine alone uses it
	send := func(ctx context.Context, text string) error {
		if target == "" {
			d, err := a.deps.Store.Delivery(ctx, id, journal.StageInitial)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn().Err(err).Msg("Reading the placeholder failed; progress not shown")
				}
				return errNotShown
			}
			if d.State != journal.DeliveryAcknowledged {
				return errNotShown
			}
			target = d.EventID
		}
		// The fence stops the turn's enqueues, not this direct send: a
		// membership that ended (even one rejoined since) is shown nothing.
		if current, err := a.current(ctx, e); err != nil || !current {
			if err != nil && ctx.Err() == nil {
				log.Warn().Err(err).Msg("Reading the membership failed; progress not shown")
			}
			return errNotShown
		}
		content, err := progressContent(target, text)
		if err != nil {
			return err
		}
		sendCtx, cancel := context.WithTimeout(ctx, progressTimeout)
		defer cancel()
		_, err = a.deps.Transport.Send(sendCtx, e.RoomID, progressEventType, "mindroomd-progress-"+uuid.NewString(), content)
		return err
	}
	p := newPacer(ctx, send, a.progressBudget(), a.deps.Now, sleep, log)
	a.loops.Add(1)
	go func() {
		defer a.loops.Done()
		p.run()
	}()
	return func(_ context.Context, text string) { p.offer(text) }, p.stop
}

// progressBudget is the budget the principal's progress edits share.
func (a *principalActor) progressBudget() *bucket {
	a.paceOnce.Do(func() {
		d := a.deps.withTurnDefaults()
		a.pace = newBucket(d.ProgressBurst, d.ProgressRefill, a.deps.Now())
	})
	return a.pace
}

// progressEventType is the type of a progress edit: an edit has the type of
// the message it edits, and a placeholder is a message.
const progressEventType = "m.room.message"

// progressContent is an edit of target showing text as still streaming.
func progressContent(target, text string) (json.RawMessage, error) {
	newContent := map[string]string{"msgtype": "m.text", "body": text, journal.StreamStatusKey: streamStatusStreaming}
	return json.Marshal(map[string]any{
		"msgtype": "m.text", "body": "* " + text, journal.StreamStatusKey: streamStatusStreaming,
		"m.new_content": newContent,
		"m.relates_to":  map[string]string{"rel_type": "m.replace", "event_id": target},
	})
}

// streamStatusStreaming is the stream status of a message whose text is
// still coming.
const streamStatusStreaming = "streaming"

// pacer sends one turn's progress edits: at most one in flight, each
// taking a token of the budget first, and always the newest text (the
// texts that come while an edit is in flight, or while a token is awaited,
// coalesce to the newest). A 429 empties the budget for the server's
// retry_after, after which the newest text goes out. stop ends it at once.
type pacer struct {
	// send makes one edit; errNotShown is an edit skipped, whose token is
	// given back.
	send   func(ctx context.Context, text string) error
	budget *bucket
	now    func() time.Time
	// wait waits d, or until ctx ends, reporting whether d passed.
	wait func(ctx context.Context, d time.Duration) bool
	log  zerolog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{}
	done   chan struct{}

	mu      sync.Mutex
	text    string
	pending bool
	stopped bool
}

// newPacer returns a pacer bound to ctx (the turn's): run starts it.
func newPacer(ctx context.Context, send func(context.Context, string) error, budget *bucket, now func() time.Time,
	wait func(context.Context, time.Duration) bool, log zerolog.Logger) *pacer {
	p := &pacer{send: send, budget: budget, now: now, wait: wait, log: log,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(ctx)
	return p
}

// offer makes text the newest, to be sent when the pace allows. It never
// blocks; after stop it does nothing.
func (p *pacer) offer(text string) {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.text, p.pending = text, true
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// stop ends the pacer without waiting for it: a pending text is dropped,
// an edit in flight is cancelled, and no edit starts after it. The final
// answer, which follows, is never held up by progress.
func (p *pacer) stop() {
	p.mu.Lock()
	p.stopped, p.pending, p.text = true, false, ""
	p.mu.Unlock()
	p.cancel()
}

// next takes the newest text, unless there is none or the pacer stopped.
func (p *pacer) next() (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || !p.pending {
		return "", false
	}
	p.pending = false
	return p.text, true
}

// again makes text pending again, unless a newer one came meanwhile.
func (p *pacer) again(text string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped && !p.pending {
		p.text, p.pending = text, true
	}
}

// hasPending reports whether a text waits to be sent.
func (p *pacer) hasPending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending && !p.stopped
}

// run sends the texts offered until stop, or the turn's context, ends it.
func (p *pacer) run() {
	defer close(p.done)
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		}
		for p.hasPending() {
			// The token first, the text after: what comes while the token
			// is awaited is the text sent.
			for d := p.budget.take(p.now()); d > 0; d = p.budget.take(p.now()) {
				if !p.wait(p.ctx, d) {
					return
				}
			}
			text, ok := p.next()
			if !ok {
				p.budget.give()
				continue
			}
			err := p.send(p.ctx, text)
			var refused *matrix.HTTPError
			switch {
			case err == nil:
			case errors.Is(err, errNotShown):
				p.budget.give()
			case p.ctx.Err() != nil:
				// Stopped with the edit in flight: the answer is here.
			case errors.As(err, &refused) && refused.Status == http.StatusTooManyRequests:
				after := refused.RetryAfter
				if after <= 0 {
					after = p.budget.refill
				}
				p.budget.exhaust(p.now().Add(after))
				p.again(text)
				p.log.Debug().Dur("retry_after", after).Msg("Progress edit rate-limited; the newest text follows the wait")
			default:
				p.log.Warn().Err(err).Msg("Progress edit failed; ignored")
			}
		}
	}
}

// bucket is a token bucket: burst tokens at most, one more every refill.
// It is safe for concurrent use: a stopped turn's pacer may still be
// returning when the next turn's starts.
type bucket struct {
	burst  int
	refill time.Duration

	mu     sync.Mutex
	tokens int
	// at is when tokens was last brought up to date, in whole refills.
	at time.Time
}

// newBucket returns a full bucket.
func newBucket(burst int, refill time.Duration, now time.Time) *bucket {
	return &bucket{burst: burst, refill: refill, tokens: burst, at: now}
}

// take takes a token at now, or returns how long until one is due.
func (b *bucket) take(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens >= b.burst {
		// Full: the refill starts with the first token taken.
		b.at = now
	} else if n := now.Sub(b.at) / b.refill; n > 0 {
		b.tokens = min(b.burst, b.tokens+int(n))
		b.at = b.at.Add(n * b.refill)
	}
	if b.tokens > 0 {
		b.tokens--
		return 0
	}
	return b.at.Add(b.refill).Sub(now)
}

// give returns a token taken for an edit that was not sent.
func (b *bucket) give() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.burst, b.tokens+1)
}

// exhaust empties the bucket until until, when one token is due: the
// server asked for a wait, whatever the bucket made of its limit.
func (b *bucket) exhaust(until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens, b.at = 0, until.Add(-b.refill)
}
