package principal

import (
	"context"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// typingCallTimeout bounds one typing notice: it is worth nothing late.
const typingCallTimeout = 5 * time.Second

// typer is a Transport that can show the account typing (*matrix.Client).
type typer interface {
	Typing(ctx context.Context, room string, typing bool, timeout time.Duration) error
}

// typing shows the agent typing in e's room while the Agent answers e, and
// returns the function that ends it, called once Answer returned. The
// notice is renewed every TypingRenew, with a timeout half again as long,
// so it stays up through a slow answer and lapses by itself should the
// daemon die. It is best-effort: a notice that fails is logged at debug
// and the turn goes on. Only a message or media shows typing: the agent
// answers nothing else. stop returns at once; the notice is withdrawn
// from a goroutine of its own, after the last renewal, so the answer is
// not held up by it.
func (a *principalActor) typing(ctx context.Context, e journal.PendingEvent) (stop func()) {
	t, ok := a.deps.Transport.(typer)
	renew := a.deps.withTurnDefaults().TypingRenew
	if !ok || renew < 0 || !e.Kind.TurnBacked() {
		return func() {}
	}
	timeout := renew + renew/2
	log := a.log.With().Str("event_id", e.EventID).Logger()
	turnCtx, cancel := context.WithCancel(ctx)
	a.loops.Add(1)
	go func() {
		defer a.loops.Done()
		for {
			callCtx, done := context.WithTimeout(turnCtx, typingCallTimeout)
			err := t.Typing(callCtx, e.RoomID, true, timeout)
			done()
			if err != nil && turnCtx.Err() == nil {
				log.Debug().Err(err).Msg("Typing notice failed; ignored")
			}
			if !sleep(turnCtx, renew) {
				break
			}
		}
		// Withdrawn even when the turn's context ended with the daemon's
		// stop: left up, it would show the agent typing for its timeout.
		offCtx, done := context.WithTimeout(context.WithoutCancel(ctx), typingCallTimeout)
		defer done()
		if err := t.Typing(offCtx, e.RoomID, false, 0); err != nil {
			log.Debug().Err(err).Msg("Withdrawing the typing notice failed; it lapses by itself")
		}
	}()
	return cancel
}
