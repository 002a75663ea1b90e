// Package outbox is the delivery actor of one principal: it claims outbox
// rows (committing attempted=1 before any network I/O), sends them through
// the Sender port with their frozen transaction IDs, and acknowledges them.
// It retries with backoff, honours 429 retry_after, records permanent
// failures, and recovers unacknowledged rows on start. A row first attempted
// from another device is reconciled before it is sent again: the homeserver
// deduplicates per device, so a blind resend could show the reply twice. Each principal has
// its own actor, so one principal's slow or failing sends never delay
// another's.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// Defaults for Deps.
const (
	DefaultBackoffBase = 500 * time.Millisecond
	DefaultBackoffMax  = 5 * time.Minute
	DefaultScanLimit   = 100
	// DefaultSettleDelay is Deps.SettleDelay's default: a cut-off send
	// Dendrite accepted shows in the room within about a second.
	DefaultSettleDelay = 5 * time.Second
	// sendTimeout bounds one send so a hung connection cannot hold the
	// principal's deliveries forever.
	sendTimeout = 60 * time.Second
)

// Point names a step of a delivery, for observers such as crash tests.
type Point string

// Points a delivery passes.
const (
	// Claimed: attempted=1 is committed; nothing sent yet.
	Claimed Point = "claimed"
	// Accepted: the homeserver returned an event ID; not yet acknowledged.
	Accepted Point = "accepted"
	// Acknowledged: the acknowledgement is committed.
	Acknowledged Point = "acknowledged"
	// Adopted: reconciliation found no copy of a row attempted from another
	// device, and the row now belongs to this device.
	Adopted Point = "adopted"
)

// Deps are the actor's collaborators.
type Deps struct {
	// Outbox is the principal-bound delivery view.
	Outbox journal.Outbox
	Sender Sender
	// Reconciler searches the room for a row attempted from another device
	// before it is sent again. Without one such a row is never resent.
	Reconciler Reconciler
	// DeviceID is the sending device, recorded at claim: the homeserver
	// deduplicates transaction IDs per device.
	DeviceID string
	// Hints, when set, wakes the actor after commits for its principal. The
	// actor owns it and closes it when it stops, so a stopped actor leaves
	// nothing on the bus.
	Hints *hint.Subscription
	Now   func() time.Time
	Log   zerolog.Logger
	// BackoffBase and BackoffMax bound the exponential backoff with jitter.
	BackoffBase, BackoffMax time.Duration
	// ScanLimit is the recovery scan's page size.
	ScanLimit int
	// SettleDelay is how long after a first search that found nothing an
	// attempted row is searched for again before it is sent again
	// (default DefaultSettleDelay): a send cut off by a crash may still be
	// landing, and a homeserver may store it without keeping its
	// transaction ID, so an early resend would show the reply twice.
	SettleDelay time.Duration
	// Observe, when set, is called at each Point. Crash tests kill the
	// process there; production leaves it nil.
	Observe func(Point, journal.Delivery)
}

// Props returns the actor's props. A failure stops it rather than silently
// restarting it.
func Props(d Deps) *actor.Props {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.BackoffBase <= 0 {
		d.BackoffBase = DefaultBackoffBase
	}
	if d.BackoffMax <= 0 {
		d.BackoffMax = DefaultBackoffMax
	}
	if d.ScanLimit <= 0 {
		d.ScanLimit = DefaultScanLimit
	}
	if d.SettleDelay <= 0 {
		d.SettleDelay = DefaultSettleDelay
	}
	return actor.PropsFromProducer(func() actor.Actor {
		return &outboxActor{deps: d, backoff: make(map[key]backoff), mine: make(map[key]uint64), missed: make(map[key]bool)}
	}, actor.WithGuardian(actors.StopOnFailure()), actor.WithSupervisor(actors.StopOnFailure()))
}

type key struct {
	delivery string
	stage    journal.Stage
}

type backoff struct {
	failures int
	until    time.Time
}

type outboxActor struct {
	deps    Deps
	backoff map[key]backoff
	// mine are the rows this run may send again without searching the room
	// first: those it claimed itself, or found missing from the room, each
	// with the sender's session then. A row of an earlier session is
	// searched for like an earlier run's: the server may have forgotten its
	// transaction ID with the old token.
	mine map[key]uint64
	// tokenRefused is set once a send refused for its access token was
	// logged, until a send goes through.
	tokenRefused bool
	// missed are the rows a first search did not find: the next search,
	// after SettleDelay, decides.
	missed   map[key]bool
	inFlight bool
	timer    *time.Timer
	ctx      context.Context
	cancel   context.CancelFunc
	stopHint chan struct{}
}

// Receive implements actor.Actor.
func (a *outboxActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.ctx, a.cancel = context.WithCancel(context.Background())
		a.forwardHints(ctx)
		a.pump(ctx) // recover what an earlier run left unacknowledged
	case *DeliverPending, *retryDue:
		a.pump(ctx)
	case *sent:
		a.inFlight = false
		a.finish(m)
		a.pump(ctx)
	case *reconciled:
		a.inFlight = false
		a.settleReconciled(m)
		a.pump(ctx)
	case *trackedRows:
		ctx.Respond(a.tracked())
	case *actor.Stopping:
		a.cancel()
		if a.timer != nil {
			a.timer.Stop()
		}
		if a.stopHint != nil {
			close(a.stopHint)
			a.deps.Hints.Close()
		}
	}
}

// forwardHints turns commit hints into DeliverPending messages.
func (a *outboxActor) forwardHints(ctx actor.Context) {
	if a.deps.Hints == nil {
		return
	}
	a.stopHint = make(chan struct{})
	self, root, c, stop := ctx.Self(), ctx.ActorSystem().Root, a.deps.Hints.C(), a.stopHint
	go func() {
		for {
			select {
			case <-c:
				root.Send(self, &DeliverPending{})
			case <-stop:
				return
			}
		}
	}()
}

// pump starts the next due send, if none is in flight.
func (a *outboxActor) pump(ctx actor.Context) {
	if a.inFlight {
		return // the send's completion pumps again
	}
	now := a.deps.Now()
	var (
		after     *journal.DeliveryCursor
		nextRetry time.Time
		// owed are the rows a whole scan finds, when the actor holds state
		// for any: what it holds for any other row is let go.
		owed map[key]struct{}
	)
	if len(a.backoff)+len(a.mine)+len(a.missed) > 0 {
		owed = make(map[key]struct{})
	}
	for {
		rows, err := a.deps.Outbox.Unacknowledged(a.ctx, a.deps.ScanLimit, after)
		if err != nil {
			a.deps.Log.Error().Err(err).Msg("Outbox scan failed")
			a.schedule(ctx, now.Add(a.deps.BackoffBase))
			return
		}
		for _, d := range rows {
			k := key{d.DeliveryID, d.Stage}
			if owed != nil {
				owed[k] = struct{}{}
			}
			if b, ok := a.backoff[k]; ok && b.until.After(now) {
				if nextRetry.IsZero() || b.until.Before(nextRetry) {
					nextRetry = b.until
				}
				continue
			}
			if a.start(ctx, d) {
				return
			}
			// A failed claim puts the row in backoff: wake for it, or it
			// would wait for an unrelated commit's hint.
			if b, ok := a.backoff[k]; ok && b.until.After(now) && (nextRetry.IsZero() || b.until.Before(nextRetry)) {
				nextRetry = b.until
			}
		}
		if len(rows) < a.deps.ScanLimit {
			break
		}
		last := rows[len(rows)-1]
		after = &journal.DeliveryCursor{CreatedMS: last.CreatedMS, Position: last.Position}
	}
	if owed != nil {
		// Finished elsewhere (retired by a departure, acknowledged by
		// another sender) or by a path that did not forget it.
		a.prune(owed)
	}
	if !nextRetry.IsZero() {
		a.schedule(ctx, nextRetry)
	}
}

// start claims one row and sends it in the background. It reports whether a
// send started; a row that cannot be claimed now is skipped so it never
// blocks the rows behind it.
func (a *outboxActor) start(ctx actor.Context, row journal.Delivery) bool {
	k := key{row.DeliveryID, row.Stage}
	if row.State == journal.DeliveryAttempted && !a.isMine(k) {
		// Sent by an earlier run, with an unknown outcome. From another
		// device it must be looked for before it is sent again. From this
		// one, the server's deduplication may also have forgotten the
		// transaction (some homeservers keep it per access token, in
		// memory), so it is looked for whenever a Reconciler can.
		if (row.DeviceID != "" && row.DeviceID != a.deps.DeviceID) || a.deps.Reconciler != nil {
			return a.reconcile(ctx, row)
		}
	}
	d, err := a.deps.Outbox.Claim(a.ctx, row.DeliveryID, row.Stage, a.deps.DeviceID)
	switch {
	case errors.Is(err, journal.ErrStageBlocked):
		return false
	case errors.Is(err, journal.ErrNotClaimable):
		// Finished since the scan read it (retired, or acknowledged by
		// another sender): nothing of it is owed any more.
		a.forget(k)
		return false
	case errors.Is(err, journal.ErrDeviceChanged):
		// The scan's copy was older than the row; the next scan reconciles.
		delete(a.mine, k)
		a.delay(k, 0)
		return false
	case err != nil:
		a.deps.Log.Error().Err(err).Str("delivery_id", row.DeliveryID).Msg("Claim failed")
		a.delay(k, 0)
		return false
	}
	a.mine[k] = a.session()
	a.observe(Claimed, d)
	content, err := journal.WireContent(d)
	if err != nil {
		// A frozen payload that cannot be read will never send.
		a.finish(&sent{delivery: d, err: &journal.SendError{Status: 400, Err: err}})
		return false
	}
	a.inFlight = true
	self, root, sender, parent := ctx.Self(), ctx.ActorSystem().Root, a.deps.Sender, a.ctx
	go func() {
		sctx, cancel := context.WithTimeout(parent, sendTimeout)
		defer cancel()
		record, err := sender.Send(sctx, d, content)
		root.Send(self, &sent{delivery: d, record: record, err: err})
	}()
	return true
}

// reconcile searches the room for row, attempted from another device, in
// the background. It reports whether the search started.
func (a *outboxActor) reconcile(ctx actor.Context, row journal.Delivery) bool {
	k := key{row.DeliveryID, row.Stage}
	if a.deps.Reconciler == nil {
		a.deps.Log.Warn().Str("delivery_id", row.DeliveryID).Stringer("stage", row.Stage).
			Str("sent_from", row.DeviceID).Str("device_id", a.deps.DeviceID).
			Msg("Delivery was attempted from another device; it is not sent again without a reconciler")
		a.delay(k, 0)
		return false
	}
	a.inFlight = true
	self, root, rec, parent := ctx.Self(), ctx.ActorSystem().Root, a.deps.Reconciler, a.ctx
	go func() {
		sctx, cancel := context.WithTimeout(parent, sendTimeout)
		defer cancel()
		search, err := rec.Find(sctx, row)
		root.Send(self, &reconciled{delivery: row, search: search, err: err})
	}()
	return true
}

// settleReconciled acts on a search's outcome: a copy found in the room
// acknowledges the row, and so does one a person redacted since
// (journal.RedactedCopy); none found hands the row to this device, whose
// next claim sends it.
func (a *outboxActor) settleReconciled(m *reconciled) {
	d, k := m.delivery, key{m.delivery.DeliveryID, m.delivery.Stage}
	log := a.deps.Log.With().Str("delivery_id", d.DeliveryID).Stringer("stage", d.Stage).Logger()
	switch {
	case m.err != nil:
		log.Warn().Err(m.err).Msg("Reconciling a delivery attempted from another device failed")
		a.delay(k, 0)
		return
	case m.search.Found:
		a.acknowledgeCopy(d, m.search.Copy, log)
		return
	case !a.missed[k]:
		// Not there yet is not never sent: a send cut off by the crash may
		// still be landing. Search once more before sending again.
		a.missed[k] = true
		log.Info().Dur("search_again_in", a.deps.SettleDelay).Msg("An attempted delivery was not found in the room; searching again before resending")
		b := a.backoff[k]
		b.until = a.deps.Now().Add(a.deps.SettleDelay)
		a.backoff[k] = b
		return
	}
	// The deciding search found no copy by its marker. Only now is a
	// redacted event weighed: a marker found is proof, a redacted event a
	// reading of the room.
	sent, redacted, err := a.redactedCopy(d, m.search.Redacted)
	switch {
	case err != nil:
		log.Error().Err(err).Msg("Weighing the redacted events of the delivery's room failed")
		a.delay(k, 0)
	case redacted:
		log.Info().Str("event_id", sent.EventID).Msg("An attempted delivery was sent and then redacted; acknowledged, not sent again")
		a.acknowledgeCopy(d, sent, log)
	case d.DeviceID != "" && d.DeviceID != a.deps.DeviceID:
		if err := a.deps.Outbox.AdoptDevice(a.ctx, d.DeliveryID, d.Stage, a.deps.DeviceID); err != nil {
			log.Error().Err(err).Msg("Handing the delivery to this device failed")
			a.delay(k, 0)
			return
		}
		delete(a.missed, k)
		a.mine[k] = a.session()
		a.observe(Adopted, d)
	default:
		delete(a.missed, k)
		a.mine[k] = a.session()
	}
}

// acknowledgeCopy acknowledges d with the copy a search found in the room.
func (a *outboxActor) acknowledgeCopy(d journal.Delivery, found journal.Sent, log zerolog.Logger) {
	k := key{d.DeliveryID, d.Stage}
	if _, err := a.deps.Outbox.Acknowledge(a.ctx, d.DeliveryID, d.Stage, found); err != nil {
		log.Error().Err(err).Msg("Acknowledge failed")
		a.delay(k, 0)
		return
	}
	a.forget(k)
	a.observe(Acknowledged, d)
}

// redactedCopy asks journal.RedactedCopy whether one of the redacted events
// a search met is d's copy, which a person removed before it was
// acknowledged. The rule needs what the room cannot say: which of the
// events are the principal's acknowledged deliveries, and which other rows
// of the room are in doubt too.
func (a *outboxActor) redactedCopy(d journal.Delivery, redacted []journal.RedactedSend) (journal.Sent, bool, error) {
	if len(redacted) == 0 {
		return journal.Sent{}, false, nil
	}
	delivered := make(map[string]bool, len(redacted))
	for _, e := range redacted {
		yes, err := a.deps.Outbox.DeliveredEvent(a.ctx, d.RoomID, e.EventID)
		if err != nil {
			return journal.Sent{}, false, fmt.Errorf("look up %s: %w", e.EventID, err)
		}
		delivered[e.EventID] = yes
	}
	var (
		inDoubt []journal.Delivery
		after   *journal.DeliveryCursor
	)
	for {
		rows, err := a.deps.Outbox.Unacknowledged(a.ctx, a.deps.ScanLimit, after)
		if err != nil {
			return journal.Sent{}, false, fmt.Errorf("scan outbox: %w", err)
		}
		for _, r := range rows {
			if r.RoomID == d.RoomID && r.State == journal.DeliveryAttempted {
				inDoubt = append(inDoubt, r)
			}
		}
		if len(rows) < a.deps.ScanLimit {
			break
		}
		last := rows[len(rows)-1]
		after = &journal.DeliveryCursor{CreatedMS: last.CreatedMS, Position: last.Position}
	}
	sent, ok := journal.RedactedCopy(d, inDoubt, redacted, delivered)
	return sent, ok, nil
}

// finish records a send's outcome.
func (a *outboxActor) finish(m *sent) {
	d, k := m.delivery, key{m.delivery.DeliveryID, m.delivery.Stage}
	log := a.deps.Log.With().Str("delivery_id", d.DeliveryID).Stringer("stage", d.Stage).Logger()
	if m.err == nil {
		a.observe(Accepted, d)
		_, err := a.deps.Outbox.Acknowledge(a.ctx, d.DeliveryID, d.Stage, m.record)
		switch {
		case err == nil:
			a.forget(k)
			a.tokenRefused = false
			a.observe(Acknowledged, d)
			return
		case errors.Is(err, journal.ErrInvalidArgument):
			m.err = invalidAnswer(m.record.EventID, err)
		default:
			// The send stays attempted; the retry reuses its transaction ID,
			// so the server returns the same event.
			log.Error().Err(err).Msg("Acknowledge failed")
			a.delay(k, 0)
			return
		}
	}
	if a.ctx.Err() != nil {
		return // stopping: the row stays attempted and is recovered on start
	}
	v := judge(m.err)
	if err := a.deps.Outbox.Fail(a.ctx, d.DeliveryID, d.Stage, m.err.Error(), v.permanent); err != nil {
		// Unrecorded, the row stays claimable: back off rather than resend
		// at once.
		log.Error().Err(err).Msg("Recording a failed send failed")
		a.delay(k, v.after)
		return
	}
	if v.permanent {
		log.Warn().Err(m.err).Msg("Delivery failed permanently")
		a.forget(k)
		return
	}
	if v.unanswered {
		// The send may have reached the room. A homeserver that lost its
		// memory of transaction IDs meanwhile (Dendrite keeps them in
		// memory, per token) would make a blind resend a second event.
		delete(a.mine, k)
	}
	switch {
	case !v.tokenRefused:
		log.Info().Err(m.err).Msg("Delivery will be retried")
	case !a.tokenRefused:
		a.tokenRefused = true
		log.Warn().Err(m.err).Msg("The homeserver refused the access token: deliveries stay owed and go out once a login is accepted")
	default:
		log.Debug().Err(m.err).Msg("Delivery still waits for an accepted login")
	}
	a.delay(k, v.after)
}

// session is the sender's current session (0 for a sender that never logs
// in again).
func (a *outboxActor) session() uint64 {
	if s, ok := a.deps.Sender.(Sessions); ok {
		return s.Session()
	}
	return 0
}

// isMine reports whether row k may be sent again without a search: this
// run claimed it, under the session still current.
func (a *outboxActor) isMine(k key) bool {
	s, ok := a.mine[k]
	return ok && s == a.session()
}

// forget drops what the actor holds for a finished row (acknowledged,
// retired or failed for good): a long-running principal sends without end,
// and only the rows still owed may cost memory.
func (a *outboxActor) forget(k key) {
	delete(a.backoff, k)
	delete(a.mine, k)
	delete(a.missed, k)
}

// prune forgets every row not in owed.
func (a *outboxActor) prune(owed map[key]struct{}) {
	for k := range a.mine {
		if _, ok := owed[k]; !ok {
			delete(a.mine, k)
		}
	}
	for k := range a.missed {
		if _, ok := owed[k]; !ok {
			delete(a.missed, k)
		}
	}
	for k := range a.backoff {
		if _, ok := owed[k]; !ok {
			delete(a.backoff, k)
		}
	}
}

// tracked counts the rows the actor holds state for.
func (a *outboxActor) tracked() int {
	rows := make(map[key]struct{}, len(a.backoff)+len(a.mine)+len(a.missed))
	for k := range a.mine {
		rows[k] = struct{}{}
	}
	for k := range a.missed {
		rows[k] = struct{}{}
	}
	for k := range a.backoff {
		rows[k] = struct{}{}
	}
	return len(rows)
}

// delay puts a row in backoff: the server's delay when it named one, else
// exponential backoff with full jitter.
func (a *outboxActor) delay(k key, after time.Duration) {
	b := a.backoff[k]
	b.failures++
	if after <= 0 {
		ceiling := a.deps.BackoffBase << min(b.failures-1, 20)
		if ceiling > a.deps.BackoffMax || ceiling <= 0 {
			ceiling = a.deps.BackoffMax
		}
		after = ceiling/2 + time.Duration(rand.Int64N(int64(ceiling/2)+1))
	}
	b.until = a.deps.Now().Add(after)
	a.backoff[k] = b
}

// schedule wakes the actor at t.
func (a *outboxActor) schedule(ctx actor.Context, t time.Time) {
	if a.timer != nil {
		a.timer.Stop()
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	a.timer = time.AfterFunc(max(t.Sub(a.deps.Now()), 0), func() { root.Send(self, &retryDue{}) })
}

func (a *outboxActor) observe(p Point, d journal.Delivery) {
	if a.deps.Observe != nil {
		a.deps.Observe(p, d)
	}
}
