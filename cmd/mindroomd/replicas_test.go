package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
)

// replicaScript answers "answer: <body>" after a moment (3 s for a body
// starting slow-), and first leaves the file started-<body> in $1, so a
// test knows a turn is running.
const replicaScript = `req=$(cat)
body=$(printf '%s' "$req" | sed -n 's/.*"body":"\([^"]*\)","conversation":.*/\1/p')
[ -n "$body" ] || { printf '{"ignore": true}'; exit 0; }
: >"$1/started-$body"
case "$body" in
slow-*) sleep 3 ;;
*) sleep 0.2 ;;
esac
printf '{"body": "answer: %s"}' "$body"
`

// replicaWorld is one PostgreSQL journal, one homeserver with alice and
// the agents' accounts, a room of alice's with each agent, and replicas
// of the daemon sharing the journal, each a child process.
type replicaWorld struct {
	t        *testing.T
	ctx      context.Context
	bin, dir string
	dbURL    string
	hs       *dendrite.Server
	hsURL    string
	takeover time.Duration
	alice    *dendrite.User
	aliceAcc dendrite.Account
	bots     []dendrite.Account
	// rooms[i] is alice's room with bots[i].
	rooms []string
	// extra are top-level lines every replica's configuration adds.
	extra    string
	replicas map[string]*daemonProcess
	addrs    map[string]string
}

// startReplicaWorld registers agents accounts and creates their rooms;
// no replica runs yet.
func startReplicaWorld(t *testing.T, agents int, takeover time.Duration) *replicaWorld {
	t.Helper()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	hs := dendrite.Start(t)
	w := &replicaWorld{t: t, bin: bin, dir: t.TempDir(), dbURL: postgresURL(t), hs: hs, hsURL: hs.URL, takeover: takeover,
		replicas: map[string]*daemonProcess{}, addrs: map[string]string{}}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
	w.ctx = ctx
	w.aliceAcc = hs.Register(t, "alice", "alice-password")
	w.alice = hs.User(t, w.aliceAcc)
	for i := range agents {
		bot := hs.Register(t, fmt.Sprintf("rep%d", i), fmt.Sprintf("rep%d-password-5c1e", i))
		w.bots = append(w.bots, bot)
		w.rooms = append(w.rooms, w.alice.CreateRoom(bot.UserID))
		for file, v := range map[string]string{"pw": bot.Password, "tok": replicaToken(i)} {
			if err := os.WriteFile(filepath.Join(w.dir, fmt.Sprintf("rep%d.%s", i, file)), []byte(v), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(w.dir, "pg.url"), []byte(w.dbURL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Every replica opens the agents' olm accounts with the one key.
	if _, err := e2ee.LoadPickleKey(filepath.Join(w.dir, "pickle.key")); err != nil {
		t.Fatal(err)
	}
	return w
}

// replicaToken is agent i's API token.
func replicaToken(i int) string { return fmt.Sprintf("rep%d-api-token-7a2f", i) }

// config writes the configuration of the replica named id.
func (w *replicaWorld) config(id string) string {
	w.t.Helper()
	command, err := json.Marshal([]string{"/bin/sh", "-c", replicaScript, "agent", w.dir})
	if err != nil {
		w.t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `homeserver: %s
storage: ./%s
listen: 127.0.0.1:0
database_url_file: ./pg.url
pickle_key_file: ./pickle.key
replicas: auto
replica_id: %s
replica_takeover: %s
%sagents:
`, w.hsURL, id, id, w.takeover, w.extra)
	for i, bot := range w.bots {
		fmt.Fprintf(&b, `  - name: rep%d
    user_id: "%s"
    password_file: ./rep%d.pw
    api_token_file: ./rep%d.tok
    auto_join: true
    read_receipts: "off"
    typing: false
    backend:
      type: exec
      command: %s
      timeout: 20s
`, i, bot.UserID, i, i, command)
	}
	path := filepath.Join(w.dir, id+".yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		w.t.Fatal(err)
	}
	return path
}

// start runs the replica named id and waits until it listens.
func (w *replicaWorld) start(id string) {
	w.t.Helper()
	d := startDaemonProcess(w.t, w.bin, w.config(id))
	w.t.Cleanup(func() {
		if w.t.Failed() {
			w.t.Logf("the log of replica %s:\n%s", id, d.log)
		}
	})
	w.replicas[id] = d
	w.addrs[id] = daemonAddress(w.t, d.log)
}

// holders reads which replica holds each agent's lease, by agent.
func (w *replicaWorld) holders() map[string]string {
	w.t.Helper()
	conn, err := pgx.Connect(w.ctx, w.dbURL)
	if err != nil {
		w.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(w.ctx, `SELECT agent, lease_holder FROM principals`)
	if err != nil {
		w.t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var agent, holder string
		if err := rows.Scan(&agent, &holder); err != nil {
			w.t.Fatal(err)
		}
		out[agent] = holder
	}
	if err := rows.Err(); err != nil {
		w.t.Fatal(err)
	}
	return out
}

// awaitHolders waits until ok accepts the lease holders, and returns them.
func (w *replicaWorld) awaitHolders(what string, ok func(map[string]string) bool) map[string]string {
	w.t.Helper()
	for {
		h := w.holders()
		if ok(h) {
			return h
		}
		select {
		case <-w.ctx.Done():
			w.t.Fatalf("%s: never; the holders are %v", what, h)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// spread reports every agent held, by the replicas named, each holding
// at most its fair share.
func (w *replicaWorld) spread(ids ...string) func(map[string]string) bool {
	return func(h map[string]string) bool {
		count := map[string]int{}
		for i := range w.bots {
			holder := h[fmt.Sprintf("rep%d", i)]
			if !slices.Contains(ids, holder) {
				return false
			}
			count[holder]++
		}
		share := (len(w.bots) + len(ids) - 1) / len(ids)
		for _, n := range count {
			if n > share {
				return false
			}
		}
		return true
	}
}

// answered matches bot i's answer to body.
func (w *replicaWorld) answered(i int, body string) func(json.RawMessage) bool {
	return w.said(i, "answer: "+body)
}

// said matches a message of bot i's whose body is body.
func (w *replicaWorld) said(i int, body string) func(json.RawMessage) bool {
	return dendrite.Says(w.bots[i].UserID, body)
}

// answers counts, in each room, the answers to each of alice's messages,
// as the homeserver records them, by question.
func (w *replicaWorld) answers() (asked []string, answers map[string]int) {
	w.t.Helper()
	answers = map[string]int{}
	for i, room := range w.rooms {
		for _, raw := range w.alice.Messages(room) {
			var ev struct {
				Type    string `json:"type"`
				Sender  string `json:"sender"`
				Content struct {
					Body string `json:"body"`
				} `json:"content"`
			}
			if json.Unmarshal(raw, &ev) != nil || ev.Type != "m.room.message" {
				continue
			}
			switch ev.Sender {
			case w.alice.UserID:
				asked = append(asked, ev.Content.Body)
			case w.bots[i].UserID:
				answers[strings.TrimPrefix(ev.Content.Body, "answer: ")]++
			}
		}
	}
	return asked, answers
}

// poster has alice post into the rooms in turn, one message every
// interval, until stop; it returns the bodies it sent.
type poster struct {
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	sent  []string
	fails []error
}

func (w *replicaWorld) post(interval time.Duration) *poster {
	p := &poster{stop: make(chan struct{}), done: make(chan struct{})}
	client := w.alice.Client
	go func() {
		defer close(p.done)
		for n := 0; ; n++ {
			select {
			case <-p.stop:
				return
			case <-time.After(interval):
			}
			i := n % len(w.rooms)
			body := fmt.Sprintf("q-%d-%d", i, n)
			ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
			_, err := client.SendMessageEvent(ctx, id.RoomID(w.rooms[i]), event.EventMessage,
				map[string]string{"msgtype": "m.text", "body": body})
			cancel()
			p.mu.Lock()
			if err != nil {
				p.fails = append(p.fails, err)
			} else {
				p.sent = append(p.sent, body)
			}
			p.mu.Unlock()
		}
	}()
	return p
}

// finish stops posting and returns what was sent.
func (p *poster) finish(t *testing.T) []string {
	t.Helper()
	close(p.stop)
	<-p.done
	if len(p.fails) > 0 {
		t.Fatalf("alice's posts failed: %v", p.fails)
	}
	return p.sent
}

// awaitEveryAnswer waits until each of bodies has an answer on the
// homeserver's record.
func (w *replicaWorld) awaitEveryAnswer(bodies []string) {
	w.t.Helper()
	for {
		_, answers := w.answers()
		var missing []string
		for _, b := range bodies {
			if answers[b] == 0 {
				missing = append(missing, b)
			}
		}
		if len(missing) == 0 {
			return
		}
		select {
		case <-w.ctx.Done():
			w.t.Fatalf("%d of %d messages were never answered: %v", len(missing), len(bodies), missing)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// checkAnsweredOnce fails the test unless each of alice's messages in the
// rooms has exactly one answer.
func (w *replicaWorld) checkAnsweredOnce() int {
	w.t.Helper()
	asked, answers := w.answers()
	for _, q := range asked {
		if answers[q] != 1 {
			w.t.Errorf("%q has %d answers on the homeserver, want exactly one", q, answers[q])
		}
	}
	return len(asked)
}

// metric reads one counter or gauge of the replica named id (0 when it
// has none).
func (w *replicaWorld) metric(id, name string) float64 {
	w.t.Helper()
	// On loopback the metrics need no token; the agent's goes unread.
	status, body := w.call(w.addrs[id], 0, http.MethodGet, "/metrics", "")
	if status != http.StatusOK {
		w.t.Fatalf("metrics of %s: %d %s", id, status, body)
	}
	return sampleOf(w.t, body, name)
}

// originMS is an event's origin_server_ts.
func originMS(t *testing.T, raw json.RawMessage) int64 {
	t.Helper()
	var ev struct {
		TS int64 `json:"origin_server_ts"`
	}
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatal(err)
	}
	return ev.TS
}

func TestThreeReplicasAnswerEveryMessageOnceWhileTwoAreKilledInTurn(t *testing.T) {
	w := startReplicaWorld(t, 6, 10*time.Second)
	for _, id := range []string{"r1", "r2", "r3"} {
		w.start(id)
	}
	w.awaitHolders("six agents spread over three replicas", w.spread("r1", "r2", "r3"))
	for i, room := range w.rooms {
		w.alice.AwaitEvent(w.ctx, room, dendrite.Joined(w.bots[i].UserID, 1))
	}
	p := w.post(100 * time.Millisecond)
	var takeovers []time.Duration
	live := []string{"r1", "r2", "r3"}
	for round, victim := range []string{"r2", "r1"} {
		// Mid-turn: a turn of one of the victim's agents has started.
		h := w.holders()
		var theirs []int
		for i := range w.bots {
			if h[fmt.Sprintf("rep%d", i)] == victim {
				theirs = append(theirs, i)
			}
		}
		if len(theirs) == 0 {
			t.Fatalf("replica %s holds no agent: %v", victim, h)
		}
		marker := fmt.Sprintf("busy-%d", round)
		w.alice.SendText(w.rooms[theirs[0]], marker)
		awaitFile(t, w.ctx, filepath.Join(w.dir, "started-"+marker))
		killed := time.Now()
		w.replicas[victim].kill(t)
		live = slices.DeleteFunc(live, func(id string) bool { return id == victim })
		// A probe in each of its agents' rooms: its answer is the agent
		// served again.
		for _, i := range theirs {
			probe := fmt.Sprintf("probe-%d-%d", round, i)
			w.alice.SendText(w.rooms[i], probe)
			ts := originMS(t, w.alice.AwaitEvent(w.ctx, w.rooms[i], w.answered(i, probe)))
			takeovers = append(takeovers, time.UnixMilli(ts).Sub(killed))
		}
		w.alice.AwaitEvent(w.ctx, w.rooms[theirs[0]], w.answered(theirs[0], marker))
		w.awaitHolders("the agents spread over the live replicas", w.spread(live...))
	}
	sent := p.finish(t)
	w.awaitEveryAnswer(sent)
	// The last replica stops cleanly: nothing more is sent after the count.
	w.replicas["r3"].stop(t)
	n := w.checkAnsweredOnce()
	slices.Sort(takeovers)
	t.Logf("%d messages answered once each; takeover after SIGKILL (kill to the probe's answer) over %d agents: p50 %v, max %v",
		n, len(takeovers), takeovers[len(takeovers)/2], takeovers[len(takeovers)-1])
	if n < 20 {
		t.Fatalf("only %d messages were asked; the test asked too little to prove anything", n)
	}
	if max := takeovers[len(takeovers)-1]; max > w.takeover+startTimeout/2 {
		t.Errorf("the slowest takeover took %v", max)
	}
}

// awaitFile waits until path exists.
func awaitFile(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never appeared", path)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestAReplicaStoppedPastItsLeaseCommitsNothingWhenItResumes(t *testing.T) {
	w := startReplicaWorld(t, 2, 4*time.Second)
	// The replicas check their leases' connections seldom: resumed, the
	// stopped one still believes it holds its lease, and only the
	// generation in the database stops its writes.
	w.extra = "replica_lease_check: 1m\n"
	w.start("r1")
	w.start("r2")
	h := w.awaitHolders("two agents over two replicas", w.spread("r1", "r2"))
	stopped, other := h["rep0"], "r1"
	if stopped == "r1" {
		other = "r2"
	}
	w.alice.AwaitEvent(w.ctx, w.rooms[0], dendrite.Joined(w.bots[0].UserID, 1))
	// rep0's turn runs for 3 s; its replica is stopped in the middle and
	// stops beating (the server ends its presence session once it is idle
	// for half the takeover time); the other replica ends its lease
	// sessions and takes rep0 over. It is resumed once the other has
	// answered in its place.
	w.alice.SendText(w.rooms[0], "slow-1")
	awaitFile(t, w.ctx, filepath.Join(w.dir, "started-slow-1"))
	proc := w.replicas[stopped].cmd.Process
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	w.awaitHolders("rep0 taken over", func(h map[string]string) bool { return h["rep0"] == other })
	w.alice.AwaitEvent(w.ctx, w.rooms[0], w.answered(0, "slow-1"))
	// While it is stopped, its sync has a message waiting for it too.
	w.alice.SendText(w.rooms[0], "while-stopped")
	w.alice.AwaitEvent(w.ctx, w.rooms[0], w.answered(0, "while-stopped"))
	if err := proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Resumed, its first write (the sync that waited for it, or the
	// turn's answer) is refused by the generation, and it stops serving
	// the agent.
	awaitLog(t, w.replicas[stopped].log, nil, "A write was refused: another replica took the principal's lease", 1)
	if n := w.metric(stopped, "mindroomd_fenced_writes_total"); n < 1 {
		t.Fatalf("the resumed replica counts %v refused writes", n)
	}
	awaitLog(t, w.replicas[stopped].log, nil, "The agent's lease was lost; no longer serving it", 1)
	// It rejoins: the agents spread over both again, and both answer.
	w.awaitHolders("two agents over two replicas again", w.spread("r1", "r2"))
	for i := range w.rooms {
		w.alice.SendText(w.rooms[i], fmt.Sprintf("after-%d", i))
		w.alice.AwaitEvent(w.ctx, w.rooms[i], w.answered(i, fmt.Sprintf("after-%d", i)))
	}
	w.replicas["r1"].stop(t)
	w.replicas["r2"].stop(t)
	w.checkAnsweredOnce()
}

func TestAReplicaWhoseLeaseConnectionsAreTerminatedGivesItsAgentsUpAndRejoins(t *testing.T) {
	w := startReplicaWorld(t, 2, 4*time.Second)
	w.start("r1")
	w.start("r2")
	h := w.awaitHolders("two agents over two replicas", w.spread("r1", "r2"))
	cut, other := h["rep0"], "r1"
	if cut == "r1" {
		other = "r2"
	}
	for i, room := range w.rooms {
		w.alice.AwaitEvent(w.ctx, room, dendrite.Joined(w.bots[i].UserID, 1))
	}
	p := w.post(150 * time.Millisecond)
	conn, err := pgx.Connect(w.ctx, w.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// The replica's lease sessions end, as a failover of the server, a
	// proxy or the network would end them; its other connections stay.
	var ended int
	if err := conn.QueryRow(w.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1`, "mindroomd lease "+cut).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if ended != 1 {
		t.Fatalf("ended %d lease sessions of %s, want its one", ended, cut)
	}
	w.awaitHolders("rep0 moved", func(h map[string]string) bool { return h["rep0"] == other })
	awaitLog(t, w.replicas[cut].log, nil, "The agent's lease was lost; no longer serving it", 1)
	w.awaitHolders("two agents over two replicas again", w.spread("r1", "r2"))
	sent := p.finish(t)
	w.awaitEveryAnswer(sent)
	w.replicas["r1"].stop(t)
	w.replicas["r2"].stop(t)
	w.checkAnsweredOnce()
}

// call asks the agent API at addr, as agent i, and returns the status and
// the body.
func (w *replicaWorld) call(addr string, i int, method, path, body string) (int, string) {
	w.t.Helper()
	req, err := http.NewRequestWithContext(w.ctx, method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+replicaToken(i))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		w.t.Fatal(err)
	}
	return resp.StatusCode, string(data)
}

func TestEveryReplicasAgentAPIAnswersForEveryAgent(t *testing.T) {
	w := startReplicaWorld(t, 2, 4*time.Second)
	w.start("r1")
	w.start("r2")
	h := w.awaitHolders("two agents over two replicas", w.spread("r1", "r2"))
	for i, room := range w.rooms {
		w.alice.AwaitEvent(w.ctx, room, dendrite.Joined(w.bots[i].UserID, 1))
		asked := w.alice.SendText(room, fmt.Sprintf("read-%d", i))
		w.alice.AwaitEvent(w.ctx, room, w.answered(i, fmt.Sprintf("read-%d", i)))
		for _, id := range []string{"r1", "r2"} {
			// Reads: the conversation, whichever replica serves the agent.
			status, body := w.call(w.addrs[id], i, http.MethodGet, "/v1/agents/rep"+strconv.Itoa(i)+"/rooms/"+room+"/messages", "")
			if status != http.StatusOK || !strings.Contains(body, asked) {
				t.Fatalf("rep%d's conversation through %s (holder %s): %d %s", i, id, h[fmt.Sprintf("rep%d", i)], status, body)
			}
			// Writes: a message the agent sends, through either replica,
			// once under its key.
			text := fmt.Sprintf("sent by rep%d through %s", i, id)
			for range 2 {
				status, body = w.call(w.addrs[id], i, http.MethodPost, "/v1/agents/rep"+strconv.Itoa(i)+"/rooms/"+room+"/send",
					fmt.Sprintf(`{"body": %q, "key": %q}`, text, id))
				if status != http.StatusOK && status != http.StatusAccepted {
					t.Fatalf("send through %s: %d %s", id, status, body)
				}
			}
			w.alice.AwaitEvent(w.ctx, room, w.said(i, text))
			// MCP goes the same way: its tools call the API in memory.
			cs, _, err := mcpOverHTTP("http://"+w.addrs[id]+"/v1/agents/rep"+strconv.Itoa(i)+"/mcp", replicaToken(i), nil, "")
			if err != nil {
				t.Fatalf("MCP through %s: %v", id, err)
			}
			if page := mcpTool[mcpPage](t, cs, "read_conversation", map[string]any{"room_id": room}); !page.has(asked) {
				t.Fatalf("rep%d's read_conversation through %s lacks %s: %+v", i, id, asked, page.Messages)
			}
			_ = cs.Close()
			// Another agent's token is refused on either replica, before
			// anything is forwarded.
			if status, body := w.call(w.addrs[id], 1-i, http.MethodGet, "/v1/agents/rep"+strconv.Itoa(i)+"/rooms", ""); status != http.StatusForbidden {
				t.Fatalf("another agent's token through %s: %d %s", id, status, body)
			}
		}
	}
	// status shows both replicas live and who holds each lease.
	out, err := run(t, "status", "-database-url-file", filepath.Join(w.dir, "pg.url"))
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	h = w.holders()
	for _, want := range []string{"REPLICA", "LEASE", "HOLDER", "GENERATION"} {
		if !strings.Contains(out, want) {
			t.Fatalf("status lacks %s:\n%s", want, out)
		}
	}
	for _, id := range []string{"r1", "r2"} {
		if !regexp.MustCompile(`(?m)^` + id + `\s+http://` + regexp.QuoteMeta(w.addrs[id]) + `\s+\S+\s+\d+s ago\s+live$`).MatchString(out) {
			t.Errorf("status does not show %s live at %s:\n%s", id, w.addrs[id], out)
		}
	}
	for i, bot := range w.bots {
		holder := h[fmt.Sprintf("rep%d", i)]
		if !regexp.MustCompile(`(?m)^rep` + strconv.Itoa(i) + `@` + regexp.QuoteMeta(bot.UserID) + `\s+` + holder + `\s`).MatchString(out) {
			t.Errorf("status does not show rep%d held by %s:\n%s", i, holder, out)
		}
	}
	// Stopped cleanly, a replica hands its agents back, and the other
	// takes them and answers for them.
	w.replicas["r1"].stop(t)
	w.awaitHolders("both agents on r2", w.spread("r2"))
	for i, room := range w.rooms {
		w.alice.SendText(room, fmt.Sprintf("after-r1-%d", i))
		w.alice.AwaitEvent(w.ctx, room, w.answered(i, fmt.Sprintf("after-r1-%d", i)))
	}
	w.replicas["r2"].stop(t)
	w.checkAnsweredOnce()
	// Stopped cleanly, each handed its leases back and left.
	out, err = run(t, "status", "-database-url-file", filepath.Join(w.dir, "pg.url"))
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if strings.Contains(out, "REPLICA") {
		t.Errorf("the stopped replicas are still listed:\n%s", out)
	}
	for h, holder := range w.holders() {
		if holder != "" {
			t.Errorf("%s is still held by %s after both replicas stopped", h, holder)
		}
	}
	sent := 0
	for i, room := range w.rooms {
		for _, raw := range w.alice.Messages(room) {
			if strings.Contains(string(raw), fmt.Sprintf("sent by rep%d through", i)) {
				sent++
			}
		}
	}
	if sent != 4 {
		t.Fatalf("the rooms hold %d sent messages, want one per agent and replica (4)", sent)
	}
}

func TestAnAgentTakenOverInItsEncryptedRoomReadsAndSealsOnTheSameDevice(t *testing.T) {
	w := startReplicaWorld(t, 1, 4*time.Second)
	carol := e2eeperson.New(t, w.hs, w.hs.Register(t, "carol", "carol-password"))
	bot := w.bots[0].UserID
	room := carol.CreateEncryptedRoom(bot)
	answered := func(body string) {
		t.Helper()
		carol.SendText(room, body)
		carol.AwaitDecrypted(w.ctx, room, func(typ string, content map[string]any, raw json.RawMessage) bool {
			var ev struct {
				Sender string `json:"sender"`
			}
			return typ == "m.room.message" && content["body"] == "answer: "+body &&
				json.Unmarshal(raw, &ev) == nil && ev.Sender == bot
		})
	}
	holds := func(id string) func(map[string]string) bool {
		return func(h map[string]string) bool { return h["rep0"] == id }
	}
	// r1 serves the agent first; r2 waits beside it.
	w.start("r1")
	w.awaitHolders("r1 serves the agent", holds("r1"))
	carol.AwaitDecrypted(w.ctx, room, joinedBy(bot))
	w.start("r2")
	answered("sealed-1")
	// Each owner in turn is killed; the other takes the agent over with
	// the olm account, the room keys and the device the first stored.
	w.replicas["r1"].kill(t)
	w.awaitHolders("r2 takes the agent over", holds("r2"))
	answered("sealed-2")
	// The stored account is fenced: a write as r1, which lost the agent,
	// is refused; as r2, its holder, it goes through.
	account := "rep0@" + bot
	if err := w.touchCryptoAccount("r1", account); err == nil || !strings.Contains(err.Error(), "ML001") {
		t.Fatalf("a write of the agent's olm account as the replica that lost it: %v, want the fence's refusal", err)
	}
	if err := w.touchCryptoAccount("r2", account); err != nil {
		t.Fatalf("a write of the agent's olm account as its holder: %v", err)
	}
	w.start("r1")
	w.replicas["r2"].kill(t)
	w.awaitHolders("r1 takes the agent back", holds("r1"))
	answered("sealed-3")
	w.replicas["r1"].stop(t)

	keys, err := w.alice.Client.QueryKeys(w.ctx, &mautrix.ReqQueryKeys{DeviceKeys: mautrix.DeviceKeysRequest{id.UserID(bot): {}}})
	if err != nil {
		t.Fatal(err)
	}
	if devices := keys.DeviceKeys[id.UserID(bot)]; len(devices) != 1 {
		t.Fatalf("the agent has %d devices after two takeovers, want its one", len(devices))
	}
	for _, body := range []string{"sealed-1", "sealed-2", "sealed-3"} {
		if n := answersFrom(t, carol, room, bot)["answer: "+body]; n != 1 {
			t.Errorf("%q has %d sealed answers, want one", body, n)
		}
	}
}

// touchCryptoAccount rewrites the stored olm account of account unchanged,
// on a connection that speaks for the replica named replica as a
// replica's crypto store does.
func (w *replicaWorld) touchCryptoAccount(replica, account string) error {
	w.t.Helper()
	cfg, err := pgx.ParseConfig(w.dbURL)
	if err != nil {
		w.t.Fatal(err)
	}
	cfg.RuntimeParams["mindroomd.replica"] = replica
	conn, err := pgx.ConnectConfig(w.ctx, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tag, err := conn.Exec(w.ctx, `UPDATE crypto_account SET shared = shared WHERE account_id = $1`, account)
	if err == nil && tag.RowsAffected() != 1 {
		w.t.Fatalf("no stored olm account %q", account)
	}
	return err
}
