package retention_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/retention"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// settledMessage admits and settles one message in room.
func settledMessage(t *testing.T, v journal.PrincipalStore, id, token string) {
	t.Helper()
	ctx := context.Background()
	if _, err := v.AdmitBatch(ctx, mx.Live("!r:example.org", mx.Message(id, "@alice:example.org", 1000, "hi")), token); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Settle(ctx, id); err != nil {
		t.Fatal(err)
	}
}

func TestPassesRunAtStartAndOnTheIntervalAndReclaimAfterClearing(t *testing.T) {
	clock := &testsupport.ShiftClock{Base: testsupport.DefaultNow}
	s := testsupport.MustOpenWith(t, store.Options{StorageDir: t.TempDir(), Now: clock.Now})
	v, err := s.Principal(context.Background(), "kept", "@kept:example.org")
	if err != nil {
		t.Fatal(err)
	}
	settledMessage(t, v, "$first", "s1")
	clock.Advance(2 * time.Hour)

	passes := make(chan journal.RetentionCount, 16)
	var (
		mu       sync.Mutex
		reclaims int
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		retention.Run(ctx, retention.Deps{
			Targets: []retention.Target{{Agent: "kept", Store: v, Policy: journal.RetentionPolicy{Bodies: time.Hour},
				Interval: 20 * time.Millisecond}},
			OnPass: func(agent string, n journal.RetentionCount) {
				if agent == "kept" {
					passes <- n
				}
			},
			Reclaim: func(ctx context.Context) (int64, error) {
				mu.Lock()
				reclaims++
				mu.Unlock()
				return s.Reclaim(ctx)
			},
			Log: zerolog.Nop(),
		})
	}()
	next := func() journal.RetentionCount {
		t.Helper()
		select {
		case n := <-passes:
			return n
		case <-time.After(10 * time.Second):
			t.Fatal("no pass came")
			return journal.RetentionCount{}
		}
	}
	if n := next(); n.Bodies != 1 {
		t.Fatalf("the pass at start pruned %+v, want the old body", n)
	}
	// Later passes find nothing until more has aged; then one prunes it.
	settledMessage(t, v, "$second", "s2")
	clock.Advance(2 * time.Hour)
	for n := next(); n.Bodies == 0; n = next() {
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if reclaims != 2 {
		t.Fatalf("the journal was reclaimed %d times, want after each of the 2 passes that cleared something", reclaims)
	}
}

func TestAnAgentAReplicaDoesNotServeIsLeftAloneUntilItDoes(t *testing.T) {
	clock := &testsupport.ShiftClock{Base: testsupport.DefaultNow}
	s := testsupport.MustOpenWith(t, store.Options{StorageDir: t.TempDir(), Now: clock.Now})
	ctx := context.Background()
	var views [2]journal.PrincipalStore
	for i, name := range []string{"served", "elsewhere"} {
		v, err := s.Principal(ctx, name, "@"+name+":example.org")
		if err != nil {
			t.Fatal(err)
		}
		settledMessage(t, v, "$old-"+name, "s1")
		views[i] = v
	}
	clock.Advance(2 * time.Hour)
	var active sync.Map
	active.Store("served", true)
	passes := make(chan string, 64)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var targets []retention.Target
		for i, name := range []string{"served", "elsewhere"} {
			targets = append(targets, retention.Target{Agent: name, Store: views[i], Policy: journal.RetentionPolicy{Bodies: time.Hour},
				Interval: 10 * time.Millisecond, Active: func() bool { _, ok := active.Load(name); return ok }})
		}
		retention.Run(runCtx, retention.Deps{Targets: targets, Log: zerolog.Nop(),
			OnPass: func(agent string, n journal.RetentionCount) { passes <- agent }})
	}()
	defer func() { cancel(); <-done }()
	await := func(agent string) {
		t.Helper()
		for {
			select {
			case got := <-passes:
				if got == agent {
					return
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no pass of %s came", agent)
			}
		}
	}
	// Passes of the served agent come and go; none of the other's.
	for range 3 {
		await("served")
	}
	st, err := views[1].RetentionStatus(ctx)
	if err != nil || st.Passes != 0 {
		t.Fatalf("the agent served elsewhere had %d passes (%v), want none", st.Passes, err)
	}
	// Once this process serves it, its passes run too.
	active.Store("elsewhere", true)
	await("elsewhere")
}
