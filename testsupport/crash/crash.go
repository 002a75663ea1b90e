// Package crash proves a journal durable against a killed process. It
// re-executes the test binary as a child that admits sync batches and
// acknowledges each one on stdout only after AdmitBatch returned; the
// parent SIGKILLs it at a random acknowledgement, reopens the journal and
// checks that nothing acknowledged was lost and no batch was applied in
// part, then starts the child again on the same journal.
//
// A backend's test package holds two tests: the parent, which calls Seed
// and Run, and the child, which returns at once unless its environment
// (Journal.Env) is set and then calls Child.
package crash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// seedEnv replays a logged seed.
const seedEnv = "MINDROOMD_CRASH_SEED"

const (
	agent          = "crash"
	user           = "@crashbot:example.org"
	room           = "!crash:example.org"
	sender         = "@alice:example.org"
	eventsPerBatch = 3
	maxAcksPerKill = 200
	// kills and shortKills are how many times Run kills the child, without
	// and with -short.
	kills      = 20
	shortKills = 5
	// runTimeout bounds one Run, all of its kills included.
	runTimeout = 4 * time.Minute
)

// sentAt is when every message the child admits was sent; the journal's
// own clock is the business of Journal.Open.
var sentAt = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// Journal is one journal under the crash proof, as the parent reaches it.
// S is the backend's store.
type Journal[S journal.Store] struct {
	// ChildTest names the test that is the child when Env is set: it opens
	// the journal as Open does and calls Child.
	ChildTest string
	// Env is added to the child's environment; it may hold a secret (a
	// database URL) and is never printed.
	Env []string
	// Open opens the journal. The parent reopens it after every kill, as
	// a restarted daemon would.
	Open func(ctx context.Context) (S, error)
	// EventIDs lists the event ID of every row of the journal's event
	// table, read beneath the principal view so that a part of a batch
	// shows.
	EventIDs func(ctx context.Context, s S) ([]string, error)
	// Quiesce, when set, returns once nothing the killed child began can
	// still change the journal: a database server outlives its client and
	// may still be running the client's last statements. Nil when the
	// journal dies with the process.
	Quiesce func(ctx context.Context) error
}

// Seed is the random source of the kill points, seeded from the clock or
// from MINDROOMD_CRASH_SEED; the seed is logged for a replay.
func Seed(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(seedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with %s=%d)", seed, seedEnv, seed)
	return rand.New(rand.NewPCG(seed, 0x6d696e64726f6f6d))
}

// Run kills the child 20 times (5 under -short), each after a number of
// acknowledgements drawn from rng, and checks the journal after each kill.
func Run[S journal.Store](t *testing.T, rng *rand.Rand, j Journal[S]) {
	t.Helper()
	n := kills
	if testing.Short() {
		n = shortKills
	}
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	stored := -1
	passed := 0
	for round := 1; round <= n; round++ {
		killAfter := 1 + rng.IntN(maxAcksPerKill)
		r, err := runAndKill(ctx, t, j, killAfter, stored+1)
		if err != nil {
			t.Fatalf("kill %d/%d (after %d acks): %v", round, n, killAfter, err)
		}
		if r.stored, err = checkAfterKill(ctx, j, r.lastAck); err != nil {
			t.Fatalf("kill %d/%d (after %d acks, acked batches %d..%d): %v", round, n, killAfter, r.first, r.lastAck, err)
		}
		t.Logf("kill %2d/%d: SIGKILL after ack %3d; acked batches %d..%d (%d); stored token tok-%d (%d committed unacknowledged)",
			round, n, killAfter, r.first, r.lastAck, r.acked, r.stored, r.stored-r.lastAck)
		stored = r.stored
		passed++
	}
	t.Logf("%d/%d kills passed; %d batches (%d events) durable", passed, n, stored+1, (stored+1)*eventsPerBatch)
}

func eventID(batch, i int) string { return fmt.Sprintf("$crash-%d-%d", batch, i) }

func token(batch int) string { return "tok-" + strconv.Itoa(batch) }

// batchOf parses a token written by token; "" (nothing admitted yet) is
// batch -1.
func batchOf(tok string) (int, error) {
	if tok == "" {
		return -1, nil
	}
	n, err := strconv.Atoi(strings.TrimPrefix(tok, "tok-"))
	if err != nil || !strings.HasPrefix(tok, "tok-") {
		return 0, fmt.Errorf("sync token %q is not one this test wrote", tok)
	}
	return n, nil
}

// openView opens the journal and the crash principal's view of it.
func openView[S journal.Store](ctx context.Context, open func(context.Context) (S, error)) (S, journal.PrincipalStore, error) {
	var zero S
	s, err := open(ctx)
	if err != nil {
		return zero, nil, err
	}
	p, err := s.Principal(ctx, agent, user)
	if err != nil {
		_ = s.Close()
		return zero, nil, err
	}
	return s, p, nil
}
