package principal_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// finalEnqueues stands in front of the journal's enqueues of final
// answers: before runs first, and an error it returns is the enqueue's.
type finalEnqueues struct {
	journal.PrincipalStore
	before func(ctx context.Context) error
}

func (s finalEnqueues) EnqueueAndSettle(ctx context.Context, req journal.EnqueueRequest) (journal.EnqueueResult, error) {
	if req.Stage == journal.StageFinal {
		if err := s.before(ctx); err != nil {
			return journal.EnqueueResult{}, err
		}
	}
	return s.PrincipalStore.EnqueueAndSettle(ctx, req)
}

func TestAnAnswerWhoseEnqueueFailedIsSentWithoutAskingTheAgentAgain(t *testing.T) {
	f := newFixture(t)
	var failed atomic.Bool
	f.journal = func(v journal.PrincipalStore) journal.PrincipalStore {
		return finalEnqueues{PrincipalStore: v, before: func(context.Context) error {
			if failed.CompareAndSwap(false, true) {
				return errors.New("database is locked")
			}
			return nil
		}}
	}
	f.start()
	f.awaitJoined()
	q := f.alice.SendText(f.room, "hello")
	f.awaitReply("hello")
	if !failed.Load() {
		t.Fatal("the final enqueue never failed")
	}
	if n := f.agent.timesAsked(q); n != 1 {
		t.Fatalf("the agent was asked %d times, want once: its answer was recorded before the enqueue failed", n)
	}
	if got := f.replies(); got["echo: hello"] != 1 || len(got) != 1 {
		t.Fatalf("the room shows the agent's messages %v, want one answer", got)
	}
}

func TestAfterARestartARecordedAnswerIsSentAndTheAgentIsNotAskedAgain(t *testing.T) {
	f := newFixture(t)
	// The first run stops right after the answer's turn record committed,
	// where a crash would leave it: the final is never enqueued.
	reached := make(chan struct{})
	var once sync.Once
	f.journal = func(v journal.PrincipalStore) journal.PrincipalStore {
		return finalEnqueues{PrincipalStore: v, before: func(ctx context.Context) error {
			once.Do(func() { close(reached) })
			<-ctx.Done()
			return ctx.Err()
		}}
	}
	f.start()
	f.awaitJoined()
	q := f.alice.SendText(f.room, "question")
	select {
	case <-reached:
	case <-time.After(testDeadline):
		t.Fatal("the answer was never enqueued")
	}
	rec, ok, err := f.view.TurnForEvent(f.ctx, q)
	if err != nil || !ok || rec.State != journal.TurnResultRecorded {
		t.Fatalf("turn record before the restart = %+v, %v, %v; want the answer recorded", rec, ok, err)
	}
	if _, err := f.view.Delivery(f.ctx, journal.ReplyDeliveryID(q), journal.StageFinal); !errors.Is(err, journal.ErrNoDelivery) {
		t.Fatalf("the final was enqueued before the restart (%v)", err)
	}
	f.stop()

	f.journal = nil
	f.start()
	f.awaitReply("question")
	if n := f.agent.timesAsked(q); n != 1 {
		t.Fatalf("the agent was asked %d times across the restart, want once", n)
	}
	if got := f.replies(); got["echo: question"] != 1 || len(got) != 1 {
		t.Fatalf("the room shows the agent's messages %v, want one answer", got)
	}
}
