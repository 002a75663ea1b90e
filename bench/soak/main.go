// Command soak is the kill-9 soak: it starts a real Dendrite and
// bin/mindroomd with an echo agent, has a person post K messages at a
// steady rate (some in threads, some edited afterwards) while the daemon is
// SIGKILLed at M random moments and restarted on the same configuration and
// storage each time, waits until every message is answered, stops the
// daemon in order, and then checks what the homeserver and the journal
// hold:
//
//   - on the homeserver, read back by the person through /messages: every
//     message the person wrote has exactly one answer from the agent,
//     matched to its source by the reply relation and the delivery marker,
//     with the source's text, in the source's thread;
//   - in the journal, opened read-only after the stop: every event has one
//     row, each message was admitted as work, and nothing is pending, queued
//     or unacknowledged.
//
// With -encrypted the room is end-to-end encrypted as Element creates one:
// the person writes from a device of her own (testsupport/e2eeperson), so
// every message is Megolm ciphertext the daemon must decrypt, and each
// answer counts only once the person's device has decrypted it. The
// daemon, killed and restarted, keeps its device and crypto store, and
// must go on decrypting and sealing across every restart. On top of the
// checks above, no event of the room may stay undecryptable to the person,
// no message may go into the room in the clear, every start of the daemon
// must be on the first one's device, and the journal must hold no event
// still awaiting its key or settled undecryptable.
//
// The journal is the SQLite file under the daemon's storage, or with -pg a
// PostgreSQL database: a durable cluster the soak launches in its working
// directory (as the postgres OS user when run as root, so the working
// directory must be under the system's temporary directory or open to that
// user), or a new schema on the server MINDROOM_TEST_PG_URL names.
//
// With -replicas N above 1 (only with -pg) the soak runs N daemons with
// replicas: auto on the one PostgreSQL journal, each with a storage
// directory of its own (replica_id r1 to rN, one pickle key file shared,
// replica_takeover 4s). So that every replica has work there are 2N
// agents, each with an account and a room of its own with the person, who
// writes to the rooms in turn. Each kill SIGKILLs one replica, drawn at
// random, and restarts it at once, as the single daemon is: the others run
// on, take the killed one's agents over, and give some back as it rejoins.
// The checks are the same, room by room: every message has exactly one
// answer from its room's agent. The report names the replica each kill
// took and how long after it the agents that replica held answered again.
//
// It prints a table (K, M, lost, duplicated, the time to drain after the
// last kill, the wall time) and the checks behind it, and exits 1 if any
// check failed, 2 if the soak could not run. The working directory (the
// servers' logs, the journal) is kept when the soak fails, or with -keep.
//
// Run it from the module's root after `make build dendrite`; `make soak`
// does that.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/mindroomd/mindroomd/testsupport/pg"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitError  = 2
)

// options are the soak's flags.
type options struct {
	k, m         int
	rate         float64
	agent        string
	agentDelay   time.Duration
	threadShare  float64
	editShare    float64
	drainTimeout time.Duration
	dir          string
	keep         bool
	pg           bool
	encrypted    bool
	replicas     int
	retention    bool
	seed         uint64
	bin          string
	script       string
	python       string
}

func main() {
	os.Exit(soakMain(os.Args[1:], os.Stdout, os.Stderr))
}

func soakMain(args []string, stdout, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "soak:", err)
		return exitError
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, opts, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "soak:", err)
		if res.Dir != "" {
			fmt.Fprintln(stderr, "soak: logs kept in", res.Dir)
		}
		return exitError
	}
	printResult(stdout, opts, res)
	if !res.passed() {
		return exitFailed
	}
	if !opts.keep {
		if err := os.RemoveAll(res.Dir); err != nil {
			fmt.Fprintln(stderr, "soak:", err)
		}
	}
	return exitOK
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.k, "k", 2000, "messages the person posts")
	fs.IntVar(&o.m, "m", 30, "SIGKILLs of the daemon, at random moments over the posting period and a quarter after")
	fs.Float64Var(&o.rate, "rate", 20, "messages posted per second")
	fs.StringVar(&o.agent, "agent", "exec", "the back-end that answers: exec (examples/echo-agent.py behind a random pause) or echo (built in)")
	fs.DurationVar(&o.agentDelay, "agent-delay", 200*time.Millisecond, "the exec agent pauses a random time up to this before it answers")
	fs.Float64Var(&o.threadShare, "threads", 0.2, "share of the messages posted as thread replies to earlier ones")
	fs.Float64Var(&o.editShare, "edits", 0.1, "share of the messages an edit of a recent message follows")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 0, "how long to wait for every answer once posting and killing are over (0: 60s + 250ms per message)")
	fs.StringVar(&o.dir, "dir", "", "working directory, new or empty (default: a new temporary directory)")
	fs.BoolVar(&o.keep, "keep", false, "keep the working directory when the soak passes")
	fs.BoolVar(&o.pg, "pg", false, "keep the journal in PostgreSQL: a durable cluster (fsync on) launched in the working directory, "+
		"or a new schema on the server "+pg.EnvURL+" names")
	fs.IntVar(&o.replicas, "replicas", 1, "daemons sharing the PostgreSQL journal under replicas: auto (above 1 needs -pg); "+
		"above 1 there are two agents per replica, each in a room of its own, and each kill takes one replica")
	fs.BoolVar(&o.encrypted, "encrypted", false, "play the soak in an end-to-end encrypted room, the person writing from a device of her own")
	fs.BoolVar(&o.retention, "retention", false, "run the daemon under retention at its tiniest: bodies, payloads, turns and "+
		"rejected records pruned a second after they settle, identities after the least window (24h), a pass every second")
	fs.Uint64Var(&o.seed, "seed", 0, "seed of the message mix and the kill moments (0: random)")
	fs.StringVar(&o.bin, "bin", "bin/mindroomd", "the daemon binary (make build)")
	fs.StringVar(&o.script, "script", "examples/echo-agent.py", "the exec agent's script")
	fs.StringVar(&o.python, "python", "python3", "the Python interpreter the exec agent runs under")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case o.k < 1:
		return o, errors.New("-k must be at least 1")
	case o.m < 0:
		return o, errors.New("-m must not be negative")
	case o.replicas < 1:
		return o, errors.New("-replicas must be at least 1")
	case o.replicas > 1 && !o.pg:
		// Replicas share their journal, and only PostgreSQL is shared.
		return o, fmt.Errorf("-replicas %d needs -pg: replicas share one journal, which only PostgreSQL can be", o.replicas)
	case o.rate <= 0:
		return o, errors.New("-rate must be positive")
	case o.agent != "exec" && o.agent != "echo":
		return o, fmt.Errorf("-agent %q is not exec or echo", o.agent)
	case o.agentDelay < 0:
		return o, errors.New("-agent-delay must not be negative")
	case o.threadShare < 0 || o.threadShare > 1 || o.editShare < 0 || o.editShare > 1:
		return o, errors.New("-threads and -edits are shares between 0 and 1")
	}
	if o.drainTimeout <= 0 {
		o.drainTimeout = time.Minute + time.Duration(o.k)*250*time.Millisecond
	}
	if o.seed == 0 {
		o.seed = rand.Uint64()
	}
	return o, nil
}

// postingTime is how long posting K messages at the rate takes.
func (o options) postingTime() time.Duration {
	return time.Duration(float64(o.k) / o.rate * float64(time.Second))
}

// killWindow is the span the kills are drawn from, counted from the first
// post: the posting period and a quarter more (at least 2 s), so some kills
// land while the backlog drains.
func (o options) killWindow() time.Duration {
	p := o.postingTime()
	return p + max(p/4, 2*time.Second)
}

// agents is how many agents the soak runs: one for one daemon, as the soak
// always had; two per replica for several, so that each replica serves
// some after every rebalance.
func (o options) agents() int {
	if o.replicas > 1 {
		return 2 * o.replicas
	}
	return 1
}

// killMoments draws m kill moments over the kill window, in order.
func killMoments(rng *rand.Rand, m int, window time.Duration) []time.Duration {
	out := make([]time.Duration, m)
	for i := range out {
		out[i] = time.Duration(rng.Int64N(int64(window)))
	}
	slices.Sort(out)
	return out
}

// killTargets draws which replica, 0 to replicas-1, each of m kills takes:
// any of them, at random, so a replica may be killed again soon after it
// rejoined. A kill restarts its replica before the next kill comes, so at
// most one is down at a time and the others always run. With one replica
// every kill takes it, and nothing is drawn.
func killTargets(rng *rand.Rand, m, replicas int) []int {
	out := make([]int, m)
	if replicas <= 1 {
		return out
	}
	for i := range out {
		out[i] = rng.IntN(replicas)
	}
	return out
}
