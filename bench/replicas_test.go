package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

const (
	// replicaAgents is the agents the replicas divide between them: 6
	// split evenly over 1, 2 and 3 replicas, so no arm measures an uneven
	// share.
	replicaAgents = 6
	// replicaTakeover is every replica's replica_takeover.
	replicaTakeover = 4 * time.Second
	// takeoverKills is the replicas one iteration of
	// BenchmarkReplicaTakeover kills, one after another, each replaced
	// before the next: a round of 1x gives 2 agents × 3 kills = 6 probes.
	takeoverKills = 3
	// replicaIdle is how long an arm's replicas are left idle, their
	// agents served and nothing posted, to read what they cost at rest.
	replicaIdle = 3 * time.Second
	// replicaWait bounds every wait of a round: the leases spread, the
	// agents joined, a batch answered.
	replicaWait = 5 * time.Minute
	// replicaLogTail is how many lines of each replica's log a failed
	// benchmark prints.
	replicaLogTail = 30
	// pgUndefinedTable and pgUndefinedColumn are PostgreSQL's error codes
	// for a table, and a column, that does not exist (yet: the first
	// replica is migrating the journal).
	pgUndefinedTable  = "42P01"
	pgUndefinedColumn = "42703"
)

// replicaBatch is the messages one round of BenchmarkReplicas posts,
// spread evenly over the rooms.
func replicaBatch() int {
	if testing.Short() {
		return 30
	}
	return 300
}

// replicaSyncFilter is a poster's sync: its room's messages only, and
// enough of them that a running sync loop never gets a limited timeline.
const replicaSyncFilter = `{"room":{"timeline":{"limit":1000,"types":["m.room.message"]},` +
	`"state":{"types":[]},"ephemeral":{"types":[]},"account_data":{"types":[]}},` +
	`"presence":{"types":[]},"account_data":{"types":[]}}`

// BenchmarkReplicas measures end-to-end answered-message throughput with
// 1, 2 and 3 replicas of the daemon's binary sharing one PostgreSQL
// journal, in sub-benchmarks replicas=1, replicas=2 and replicas=3 that
// run one after another on the same homeserver, database server and
// schema. Beside each round, a floor: the same load answered by bare
// clients that store nothing (bareEcho), what the homeserver alone
// allows. The homeserver's speed, and the machine's, drift within
// minutes, so each iteration is a pair, a floor round and a replicas
// round back to back, and the arms are compared by their ratios to
// their floors.
//
// Six agents (echo back-end) each have a room with a poster of their own,
// and each poster a second room with a bare client. An arm starts its
// replicas afresh, waits until the agents' leases are spread over them
// (each holding its fair share), until every agent is in its room and
// has answered one untimed message there, and the bare clients too. In a
// round the six posters, each a Matrix client of its own, post 300
// messages (50 a room) as fast as the homeserver takes them, so every
// agent has a backlog, and the round ends when each poster's own sync
// has delivered the answer to each of its messages. After b.N pairs the
// replicas stop with SIGTERM.
//
// Metrics: answers/s and floor-answers/s (messages over the time from the
// first post to the last answer's arrival); of-floor, the one over the
// other; posts/s (messages over the posting alone, in the replicas'
// rounds); p50-ms and floor-p50-ms (an answer's origin_server_ts less its
// message's: under a backlog mostly the wait in it); cpu-ms/answer (the
// CPU time the replicas used in their rounds, together, per message);
// idle-cpu-ms/s (the CPU they use together at rest, over 3 s before the
// rounds: heartbeats, lease checks, long polls); and for 2 and 3
// replicas, speedup, their of-floor over replicas=1's, and raw-speedup,
// their answers/s over replicas=1's, in this run.
func BenchmarkReplicas(b *testing.B) {
	w := startReplicaBench(b)
	var one replicaArm
	for _, n := range []int{1, 2, 3} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			arm := w.throughputArm(b, n)
			if n == 1 {
				one = arm
			} else if one.rate > 0 {
				b.ReportMetric(arm.ofFloor/one.ofFloor, "speedup")
				b.ReportMetric(arm.rate/one.rate, "raw-speedup")
			}
		})
	}
}

// replicaArm is what an arm measured: its answers/s and their ratio to
// its floor's.
type replicaArm struct{ rate, ofFloor float64 }

// throughputArm is one arm's run: n fresh replicas, b.N pairs of rounds.
// It reports the arm's metrics.
func (w *replicaBench) throughputArm(b *testing.B, n int) replicaArm {
	ctx, cancel := context.WithTimeout(context.Background(), replicaWait)
	defer cancel()
	ids := w.startReplicas(ctx, b, n)
	w.awaitSpread(ctx, b, ids)
	w.awaitJoined(ctx, b)
	w.warmUp(ctx, b, w.rooms)
	w.warmUp(ctx, b, w.floorRooms)
	idle0 := w.cpu(b, ids)
	time.Sleep(replicaIdle)
	idle := w.cpu(b, ids) - idle0

	var served, floor roundStats
	var cpu time.Duration
	b.ResetTimer()
	for range b.N {
		floor.add(w.round(b, w.floorRooms))
		cpu0 := w.cpu(b, ids)
		served.add(w.round(b, w.rooms))
		cpu += w.cpu(b, ids) - cpu0
	}
	b.StopTimer()
	w.stopReplicas(b, ids)
	w.settle(b)
	w.checkOnce(b, append(served.bodies, floor.bodies...))

	arm := replicaArm{rate: served.rate()}
	arm.ofFloor = arm.rate / floor.rate()
	b.ReportMetric(arm.rate, "answers/s")
	b.ReportMetric(floor.rate(), "floor-answers/s")
	b.ReportMetric(arm.ofFloor, "of-floor")
	b.ReportMetric(float64(served.messages)/served.posting.Seconds(), "posts/s")
	b.ReportMetric(ms(quantile(served.latencies, 0.5)), "p50-ms")
	b.ReportMetric(ms(quantile(floor.latencies, 0.5)), "floor-p50-ms")
	b.ReportMetric(ms(cpu)/float64(served.messages), "cpu-ms/answer")
	b.ReportMetric(ms(idle)/replicaIdle.Seconds(), "idle-cpu-ms/s")
	return arm
}

// roundStats is what rounds measured: messages, the time from the first
// post to the last answer and the time posting took, and each answer's
// latency by the homeserver's stamps.
type roundStats struct {
	messages         int
	elapsed, posting time.Duration
	latencies        []time.Duration
	bodies           []string
}

func (r *roundStats) add(o roundStats) {
	r.messages += o.messages
	r.elapsed += o.elapsed
	r.posting += o.posting
	r.latencies = append(r.latencies, o.latencies...)
	r.bodies = append(r.bodies, o.bodies...)
}

func (r *roundStats) rate() float64 { return float64(r.messages) / r.elapsed.Seconds() }

// round posts replicaBatch() messages into rooms, evenly, and waits
// until each is answered.
func (w *replicaBench) round(b *testing.B, rooms []string) roundStats {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), replicaWait)
	defer cancel()
	total := replicaBatch()
	perRoom := make([][]string, len(rooms))
	var bodies []string
	round := w.nextRound()
	for k := range total {
		i := k % len(rooms)
		body := fmt.Sprintf("m%d-%d-%d", round, i, k)
		perRoom[i] = append(perRoom[i], body)
		bodies = append(bodies, body)
	}
	start := time.Now()
	if err := w.post(ctx, rooms, perRoom); err != nil {
		b.Fatal(err)
	}
	posting := time.Since(start)
	last, err := w.seen.await(ctx, bodies)
	if err != nil {
		b.Fatal(err)
	}
	return roundStats{messages: total, elapsed: last.Sub(start), posting: posting, latencies: w.seen.latencies(bodies), bodies: bodies}
}

// BenchmarkReplicaTakeover measures how long the agents of a replica
// killed with SIGKILL go unserved. Three replicas of the daemon's binary
// share one PostgreSQL journal and six agents (echo back-end), two each.
// Each kill takes the replica holding the most agents; right after it, a
// probe is posted into the room of each of its agents, and the takeover
// is the time from the kill to the probe's answer as the homeserver
// stamps it (origin_server_ts). A replacement replica then starts, the
// agents spread over the three again and answer once each, untimed,
// before the next kill. An iteration is three kills; every replica has
// replica_takeover 4s.
//
// Metrics: takeover-p50-ms and takeover-max-ms over every probe;
// lease-p50-ms, the time from the kill until the agent's lease names a
// live replica (read from the database every 10 ms), the part of the
// takeover before the new replica signs the agent in and syncs; probes.
func BenchmarkReplicaTakeover(b *testing.B) {
	w := startReplicaBench(b)
	setup, cancel := context.WithTimeout(context.Background(), replicaWait)
	defer cancel()
	live := w.startReplicas(setup, b, 3)
	w.awaitSpread(setup, b, live)
	w.awaitJoined(setup, b)
	w.warmUp(setup, b, w.rooms)

	var takeovers, leases []time.Duration
	var probed []string
	b.ResetTimer()
	for range b.N {
		for range takeoverKills {
			round, done := context.WithTimeout(context.Background(), replicaWait)
			h := w.holders(round, b)
			victim := mostHeld(h, live)
			var theirs []int
			for i := range w.bots {
				if h[replicaAgentName(i)] == victim {
					theirs = append(theirs, i)
				}
			}
			killed := time.Now()
			w.kill(b, victim)
			live = slices.DeleteFunc(live, func(id string) bool { return id == victim })
			probes := make([][]string, len(w.rooms))
			var all []string
			for _, i := range theirs {
				probe := fmt.Sprintf("probe-%d-%d", w.nextRound(), i)
				probes[i] = []string{probe}
				all = append(all, probe)
			}
			if err := w.post(round, w.rooms, probes); err != nil {
				b.Fatal(err)
			}
			leases = append(leases, w.awaitMoved(round, b, theirs, victim, killed)...)
			if _, err := w.seen.await(round, all); err != nil {
				b.Fatal(err)
			}
			probed = append(probed, all...)
			for _, probe := range all {
				takeovers = append(takeovers, time.UnixMilli(w.seen.answerTS(probe)).Sub(killed))
			}
			b.StopTimer()
			live = append(live, w.startReplicas(round, b, 1)...)
			w.awaitSpread(round, b, live)
			w.warmUp(round, b, w.rooms)
			done()
			b.StartTimer()
		}
	}
	b.StopTimer()
	w.stopReplicas(b, live)
	w.settle(b)
	w.checkOnce(b, probed)
	b.ReportMetric(ms(quantile(takeovers, 0.5)), "takeover-p50-ms")
	b.ReportMetric(ms(slices.Max(takeovers)), "takeover-max-ms")
	b.ReportMetric(ms(quantile(leases, 0.5)), "lease-p50-ms")
	b.ReportMetric(float64(len(takeovers)), "probes")
	b.Logf("takeovers (kill to the probe's answer): %v; leases moved after: %v", takeovers, leases)
}

// replicaBench is one homeserver with six agents' accounts, each in a
// room with a poster of its own, each poster in a second room with a bare
// client (the floor), one PostgreSQL schema the replicas share as their
// journal, and the replicas of the daemon's binary, each a child process
// with a storage directory of its own.
type replicaBench struct {
	bin, dir string
	hsURL    string
	admin    *pgx.Conn
	bots     []dendrite.Account
	posters  []*dendrite.User
	// rooms[i] is posters[i]'s room with bots[i], floorRooms[i] its room
	// with bares[i].
	rooms, floorRooms []string
	bares             []dendrite.Account
	seen              *answerLog
	// procs are the replicas running, by replica ID.
	procs map[string]*daemonProc
	seq   int
}

func replicaAgentName(i int) string { return "echo" + strconv.Itoa(i) }

// startReplicaBench starts the homeserver and the database, registers the
// accounts, makes the rooms and starts each poster's sync loop; no
// replica runs yet. Without -pg it skips, as the PostgreSQL benchmarks do.
func startReplicaBench(b *testing.B) *replicaBench {
	b.Helper()
	c := pgCluster(b)
	bin := mcpBinary(b) // the daemon's binary, built once into the bench cache
	hs := dendrite.Start(b)
	w := &replicaBench{bin: bin, dir: b.TempDir(), hsURL: hs.URL, seen: newAnswerLog(), procs: map[string]*daemonProc{}}
	dbURL := c.Schema(b)
	var err error
	if w.admin, err = pgx.Connect(context.Background(), dbURL); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.admin.Close(context.Background()) })
	for i := range replicaAgents {
		bot := hs.Register(b, replicaAgentName(i), fmt.Sprintf("echo%d-password-7d0c", i))
		bare := hs.Register(b, fmt.Sprintf("bare%d", i), "bare-password")
		poster := hs.User(b, hs.Register(b, fmt.Sprintf("poster%d", i), "poster-password"))
		w.bots, w.bares = append(w.bots, bot), append(w.bares, bare)
		w.posters = append(w.posters, poster)
		w.rooms = append(w.rooms, poster.CreateRoom(bot.UserID))
		w.floorRooms = append(w.floorRooms, poster.CreateRoom(bare.UserID))
		if err := os.WriteFile(filepath.Join(w.dir, replicaAgentName(i)+".pw"), []byte(bot.Password), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(w.dir, "pg.url"), []byte(dbURL+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	// Every replica opens the agents' olm accounts with the one key.
	if _, err := e2ee.LoadPickleKey(filepath.Join(w.dir, "pickle.key")); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	// Registered after the schema's and the homeserver's cleanups, so it
	// runs before them: the replicas end before the schema is dropped.
	b.Cleanup(func() {
		cancel()
		loops.Wait()
		for id, d := range w.procs {
			_ = d.cmd.Process.Kill()
			<-d.done
			delete(w.procs, id)
		}
		if b.Failed() {
			w.logTails(b)
		}
	})
	for i := range w.posters {
		loops.Go(func() { w.syncLoop(ctx, i) })
		// The floor's client: its first sync, which it answers nothing
		// of, is done long before its arm posts.
		bare, err := matrix.Login(ctx, matrix.Config{Homeserver: hs.URL, UserID: w.bares[i].UserID, Password: w.bares[i].Password,
			Agent: "bare", StorageDir: b.TempDir(), Log: zerolog.Nop()})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := bare.Join(ctx, w.floorRooms[i]); err != nil {
			b.Fatal(err)
		}
		loops.Go(func() {
			if err := bareEcho(ctx, bare, w.floorRooms[i], w.posters[i]); err != nil {
				w.seen.fail(fmt.Errorf("bare client %d: %w", i, err))
			}
		})
	}
	return w
}

// nextRound hands out a number no round or replica had: a round's bodies
// and a replica's ID carry it, so none is taken for an earlier one's.
func (w *replicaBench) nextRound() int {
	w.seq++
	return w.seq
}

// config writes the configuration of the replica named id.
func (w *replicaBench) config(b *testing.B, id string) string {
	b.Helper()
	var sb strings.Builder
	fmt.Fprintf(&sb, `homeserver: %s
storage: ./%s
listen: 127.0.0.1:0
database_url_file: ./pg.url
pickle_key_file: ./pickle.key
replicas: auto
replica_id: %s
replica_takeover: %s
agents:
`, w.hsURL, id, id, replicaTakeover)
	// Receipts and typing are homeserver requests of their own on every
	// message, served by the same homeserver on the same cores; off, the
	// homeserver has more of the machine left for the messages.
	for i, bot := range w.bots {
		fmt.Fprintf(&sb, `  - name: %s
    user_id: "%s"
    password_file: ./%s.pw
    auto_join: true
    read_receipts: "off"
    typing: false
    backend:
      type: echo
`, replicaAgentName(i), bot.UserID, replicaAgentName(i))
	}
	path := filepath.Join(w.dir, id+".yaml")
	if err := os.WriteFile(path, []byte(sb.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	return path
}

// startReplicas starts n replicas under new IDs, all at once, as a fleet
// starts, waits until each runs, and returns the IDs.
func (w *replicaBench) startReplicas(ctx context.Context, b *testing.B, n int) []string {
	b.Helper()
	var ids []string
	for range n {
		id := "r" + strconv.Itoa(w.nextRound())
		logFile, err := os.Create(filepath.Join(w.dir, id+".log"))
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(w.bin, "run", "-config", w.config(b, id))
		cmd.Stdout, cmd.Stderr = logFile, logFile
		err = cmd.Start()
		logFile.Close()
		if err != nil {
			b.Fatal(err)
		}
		d := &daemonProc{cmd: cmd, done: make(chan error, 1), log: logFile.Name()}
		go func() { d.done <- cmd.Wait() }()
		w.procs[id] = d
		ids = append(ids, id)
	}
	for _, id := range ids {
		w.awaitRunning(ctx, b, id)
	}
	return ids
}

// awaitRunning waits until the replica named id logs that it runs: its
// journal is open and migrated.
func (w *replicaBench) awaitRunning(ctx context.Context, b *testing.B, id string) {
	b.Helper()
	d := w.procs[id]
	for {
		data, err := os.ReadFile(d.log)
		if err != nil {
			b.Fatal(err)
		}
		if strings.Contains(string(data), `"message":"mindroomd running"`) {
			return
		}
		select {
		case err := <-d.done:
			delete(w.procs, id)
			b.Fatalf("replica %s exited before it ran: %v\n%s", id, err, data)
		case <-ctx.Done():
			b.Fatalf("replica %s never ran", id)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stopReplicas stops the replicas named with SIGTERM, one after another,
// and fails unless each exits cleanly.
func (w *replicaBench) stopReplicas(b *testing.B, ids []string) {
	b.Helper()
	for _, id := range ids {
		d := w.procs[id]
		delete(w.procs, id)
		d.stop(b)
	}
}

// cpu is the CPU time the replicas named have used so far, together.
func (w *replicaBench) cpu(b *testing.B, ids []string) time.Duration {
	b.Helper()
	var sum time.Duration
	for _, id := range ids {
		used, err := procCPU(w.procs[id].cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		sum += used
	}
	return sum
}

// kill ends the replica named id with SIGKILL and reaps it.
func (w *replicaBench) kill(b *testing.B, id string) {
	b.Helper()
	d := w.procs[id]
	delete(w.procs, id)
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		b.Fatal(err)
	}
	if err := <-d.done; err == nil {
		b.Fatalf("replica %s exited 0 after SIGKILL", id)
	}
}

// logTails prints the end of every replica's log.
func (w *replicaBench) logTails(b *testing.B) {
	logs, _ := filepath.Glob(filepath.Join(w.dir, "*.log"))
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > replicaLogTail {
			lines = lines[len(lines)-replicaLogTail:]
		}
		b.Logf("the end of %s:\n%s", filepath.Base(path), strings.Join(lines, "\n"))
	}
}

// holders reads which replica holds each agent's lease, by agent. Until
// the first replica has migrated the journal, no agent is held.
func (w *replicaBench) holders(ctx context.Context, b *testing.B) map[string]string {
	b.Helper()
	out := map[string]string{}
	rows, err := w.admin.Query(ctx, `SELECT agent, lease_holder FROM principals`)
	if err == nil {
		for rows.Next() {
			var agent, holder string
			if err := rows.Scan(&agent, &holder); err != nil {
				b.Fatal(err)
			}
			out[agent] = holder
		}
		err = rows.Err()
	}
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && (pe.Code == pgUndefinedTable || pe.Code == pgUndefinedColumn) {
		return map[string]string{}
	}
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// awaitSpread waits until every agent's lease is held by one of the
// replicas named, each holding at most its fair share: then no replica
// hands an agent on while a round is measured.
func (w *replicaBench) awaitSpread(ctx context.Context, b *testing.B, ids []string) {
	b.Helper()
	share := (len(w.bots) + len(ids) - 1) / len(ids)
	for {
		h := w.holders(ctx, b)
		count := map[string]int{}
		spread := true
		for i := range w.bots {
			holder := h[replicaAgentName(i)]
			count[holder]++
			if !slices.Contains(ids, holder) || count[holder] > share {
				spread = false
			}
		}
		if spread {
			return
		}
		select {
		case <-ctx.Done():
			b.Fatalf("the agents never spread over %v: the holders are %v", ids, h)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// awaitMoved waits until the lease of each of the agents the replica
// victim held names another replica, and returns how long after killed
// each did, in the order of agents.
func (w *replicaBench) awaitMoved(ctx context.Context, b *testing.B, agents []int, victim string, killed time.Time) []time.Duration {
	b.Helper()
	moved := map[int]time.Duration{}
	for len(moved) < len(agents) {
		h := w.holders(ctx, b)
		at := time.Since(killed)
		for _, i := range agents {
			if _, ok := moved[i]; !ok && h[replicaAgentName(i)] != victim && h[replicaAgentName(i)] != "" {
				moved[i] = at
			}
		}
		select {
		case <-ctx.Done():
			b.Fatalf("the agents of %s never moved: the holders are %v", victim, h)
		case <-time.After(10 * time.Millisecond):
		}
	}
	var out []time.Duration
	for _, i := range agents {
		out = append(out, moved[i])
	}
	return out
}

// mostHeld is the replica among live holding the most agents.
func mostHeld(h map[string]string, live []string) string {
	count := map[string]int{}
	for _, holder := range h {
		count[holder]++
	}
	best := live[0]
	for _, id := range live[1:] {
		if count[id] > count[best] {
			best = id
		}
	}
	return best
}

// awaitJoined waits until each agent is joined to its room.
func (w *replicaBench) awaitJoined(ctx context.Context, b *testing.B) {
	b.Helper()
	for i, room := range w.rooms {
		cli := w.posters[i].Client
		for {
			resp, err := cli.JoinedMembers(ctx, id.RoomID(room))
			if err != nil {
				b.Fatalf("members of %s: %v", room, err)
			}
			if _, ok := resp.Joined[id.UserID(w.bots[i].UserID)]; ok {
				break
			}
			select {
			case <-ctx.Done():
				b.Fatalf("%s never joined %s", w.bots[i].UserID, room)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// warmUp posts one message into each of rooms and waits for its answer,
// so every agent (or bare client) answers before anything is measured.
func (w *replicaBench) warmUp(ctx context.Context, b *testing.B, rooms []string) {
	b.Helper()
	round := w.nextRound()
	perRoom := make([][]string, len(rooms))
	var all []string
	for i := range rooms {
		body := fmt.Sprintf("warm-%d-%d", round, i)
		perRoom[i] = []string{body}
		all = append(all, body)
	}
	if err := w.post(ctx, rooms, perRoom); err != nil {
		b.Fatal(err)
	}
	if _, err := w.seen.await(ctx, all); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
}

// post has poster i post perRoom[i] into rooms[i], one after another,
// the posters at once.
func (w *replicaBench) post(ctx context.Context, rooms []string, perRoom [][]string) error {
	var wg sync.WaitGroup
	errs := make([]error, len(perRoom))
	for i, bodies := range perRoom {
		if len(bodies) == 0 {
			continue
		}
		wg.Go(func() {
			cli := w.posters[i].Client
			for _, body := range bodies {
				_, err := cli.SendMessageEvent(ctx, id.RoomID(rooms[i]), event.EventMessage,
					map[string]string{"msgtype": "m.text", "body": body}, mautrix.ReqSendEvent{TransactionID: "bench-" + body})
				if err != nil {
					errs[i] = fmt.Errorf("poster %d: send %s: %w", i, body, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// settle returns once the posters' syncs have delivered every answer the
// stopped replicas sent: a sync delivers in the homeserver's order, so
// once it has the bare clients' answers to messages posted now, it has
// every answer sent before them, any sent twice included.
func (w *replicaBench) settle(b *testing.B) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), replicaWait)
	defer cancel()
	w.warmUp(ctx, b, w.floorRooms)
}

// checkOnce fails the benchmark unless each of bodies has exactly one
// answer.
func (w *replicaBench) checkOnce(b *testing.B, bodies []string) {
	b.Helper()
	for _, body := range bodies {
		if n := w.seen.answerCount(body); n != 1 {
			b.Errorf("%q has %d answers, want exactly one", body, n)
		}
	}
}

// syncLoop follows poster i's sync and records its rooms' messages and
// answers, until ctx ends.
func (w *replicaBench) syncLoop(ctx context.Context, i int) {
	cli := w.posters[i].Client
	since := ""
	for ctx.Err() == nil {
		resp, err := dendrite.SyncTimelines(ctx, cli, replicaSyncFilter, since, 30*time.Second)
		if err != nil {
			if ctx.Err() == nil {
				w.seen.fail(fmt.Errorf("poster %d's sync: %w", i, err))
			}
			return
		}
		for room, answerer := range map[string]string{w.rooms[i]: w.bots[i].UserID, w.floorRooms[i]: w.bares[i].UserID} {
			joined, ok := resp.Rooms.Join[room]
			if ok && joined.Timeline.Limited && since != "" {
				// A gap: the events skipped would never count as answered.
				w.seen.fail(fmt.Errorf("poster %d's sync skipped events of %s (a limited timeline)", i, room))
				return
			}
			w.seen.add(joined.Timeline.Events, w.posters[i].UserID, answerer)
		}
		since = resp.NextBatch
	}
}

// answerLog is every message and answer the posters' syncs delivered,
// by the message's body.
type answerLog struct {
	mu sync.Mutex
	// asked is each message's origin_server_ts.
	asked   map[string]int64
	answers map[string][]seenAnswer
	// wake is closed, and replaced, whenever something is recorded.
	wake chan struct{}
	err  error
}

// seenAnswer is one answer: the homeserver's timestamp, and when the
// poster's sync delivered it.
type seenAnswer struct {
	ts int64
	at time.Time
}

func newAnswerLog() *answerLog {
	return &answerLog{asked: map[string]int64{}, answers: map[string][]seenAnswer{}, wake: make(chan struct{})}
}

// add records the messages of poster and the answers of answerer among
// events.
func (l *answerLog) add(events []json.RawMessage, poster, answerer string) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, raw := range events {
		var ev struct {
			Sender  string `json:"sender"`
			TS      int64  `json:"origin_server_ts"`
			Content struct {
				Body string `json:"body"`
			} `json:"content"`
		}
		if json.Unmarshal(raw, &ev) != nil {
			continue
		}
		switch ev.Sender {
		case poster:
			l.asked[ev.Content.Body] = ev.TS
		case answerer:
			if q, ok := strings.CutPrefix(ev.Content.Body, "echo: "); ok {
				l.answers[q] = append(l.answers[q], seenAnswer{ts: ev.TS, at: now})
			}
		}
	}
	close(l.wake)
	l.wake = make(chan struct{})
}

// fail records a sync loop's failure, which ends every wait.
func (l *answerLog) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
	}
	close(l.wake)
	l.wake = make(chan struct{})
}

// await waits until each of bodies has an answer and returns when the
// last of them arrived.
func (l *answerLog) await(ctx context.Context, bodies []string) (time.Time, error) {
	for {
		l.mu.Lock()
		var last time.Time
		missing := 0
		for _, body := range bodies {
			a := l.answers[body]
			if len(a) == 0 {
				missing++
				continue
			}
			if a[0].at.After(last) {
				last = a[0].at
			}
		}
		wake, err := l.wake, l.err
		l.mu.Unlock()
		switch {
		case err != nil:
			return time.Time{}, err
		case missing == 0:
			return last, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%d of %d messages were never answered", missing, len(bodies))
		case <-wake:
		}
	}
}

// latencies are each answered body's answer time less its message's, as
// the homeserver stamped them.
func (l *answerLog) latencies(bodies []string) []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []time.Duration
	for _, body := range bodies {
		asked, ok := l.asked[body]
		if a := l.answers[body]; ok && len(a) > 0 {
			out = append(out, time.Duration(a[0].ts-asked)*time.Millisecond)
		}
	}
	return out
}

// answerTS is the homeserver's timestamp of body's first answer.
func (l *answerLog) answerTS(body string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answers[body][0].ts
}

func (l *answerLog) answerCount(body string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.answers[body])
}
