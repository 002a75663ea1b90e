package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
)

const (
	// agentName is the daemon's one agent, and its account's localpart;
	// several agents are named after it, agentName1 on.
	agentName = "soak"
	// replicaTakeover is the replicas' replica_takeover: short, so a
	// killed replica's agents are taken over within seconds, and above the
	// least the daemon allows (2s).
	replicaTakeover = 4 * time.Second
	// pickleKeyFile is the pickle key the replicas share, in the working
	// directory.
	pickleKeyFile = "pickle.key"
	// execTimeout bounds one turn of the exec agent.
	execTimeout = 30 * time.Second
	// joinTimeout bounds the agent's join of the room after the first
	// start.
	joinTimeout = time.Minute
	// admitTimeout bounds the wait, once every message is answered, for
	// the journal to hold every message event of the room.
	admitTimeout = 30 * time.Second
	// endTimeout bounds the wait for the person's own sync to show the
	// end marker.
	endTimeout = time.Minute
	// progressEvery is how often the soak reports how far it is.
	progressEvery = 10 * time.Second
	// pollEvery is how often the soak looks whether a wait is over.
	pollEvery = 100 * time.Millisecond
	// cryptoReady is the message the daemon logs, with the device's ID,
	// once an agent's end-to-end encryption is up.
	cryptoReady = "End-to-end encryption ready"
)

// result is one soak's outcome.
type result struct {
	Dir  string
	Seed uint64
	// Replicas is how many daemons shared the journal; Agents how many
	// agents answered, each in a room of its own with the person.
	Replicas, Agents int
	Posted           postResult
	Starts           int
	Kills            int
	// Killed is each kill, in order.
	Killed []kill
	// Crashes are daemon exits the soak did not cause.
	Crashes []string
	// Drained says every message was answered before the drain deadline;
	// Answered is how many were.
	Drained  bool
	Answered int
	// Drain is the time from the last kill (from the end of posting when
	// there was none) to the first answer of the last message answered.
	Drain time.Duration
	// LastKill is when the last kill came, after the first post.
	LastKill time.Duration
	// StopErr is the orderly shutdown's failure, nil for exit code 0.
	StopErr error
	// Gaps counts limited syncs the person filled from /messages.
	Gaps int
	// WalkSkipped counts the room's events the final /messages walk did
	// not return and the person's sync did.
	WalkSkipped int
	// CutSends counts the daemon's sends a kill cut short while the
	// homeserver was taking them in: the window a duplicate comes from.
	CutSends int
	// Devices are the devices the daemon's starts logged, the first
	// start's first; OffDevice counts the starts on another one than the
	// first's (of the same agent, with several), which would hold none of
	// its keys.
	Devices   []string
	OffDevice int
	// Undecrypted says, of each event the person's device could not
	// decrypt, its sender and why.
	Undecrypted []string
	Server      serverTally
	// JournalOn says which journal the daemon kept, and where.
	JournalOn string
	Journal   journalTally
	// Status is `mindroomd status` after the stop.
	Status string
	Wall   time.Duration
}

// passed reports a soak that lost nothing, answered nothing twice, left
// nothing owed and stopped cleanly.
func (r result) passed() bool {
	s, j := r.Server, r.Journal
	return r.Drained && r.StopErr == nil && len(r.Crashes) == 0 &&
		len(s.Missing) == 0 && len(s.Lost) == 0 && s.Duplicated == 0 && len(s.Stray) == 0 &&
		len(s.Unmarked) == 0 && len(s.Misanswered) == 0 && len(s.Misplaced) == 0 && s.AgentEdits == 0 &&
		len(s.Undecrypted) == 0 && len(s.Cleartext) == 0 && len(s.KeyNotices) == 0 && r.OffDevice == 0 &&
		j.DuplicateIDs == 0 && j.Pending == 0 && j.Unacknowledged == 0 && j.Failed == 0 && j.OpenTurns == 0 &&
		j.AwaitingKeys == 0 && j.Undecryptable == 0 &&
		len(j.NotJournaled) == 0 && len(j.NotWork) == 0 && len(j.OutboxMismatch) == 0
}

// run plays one soak in a new working directory and checks it. An error
// means the soak could not be played; a failed check is in the result.
func run(ctx context.Context, o options, out io.Writer) (res result, err error) {
	began := time.Now()
	res.Seed, res.Replicas, res.Agents = o.seed, o.replicas, o.agents()
	logf := func(format string, args ...any) {
		fmt.Fprintf(out, "[%6.1fs] %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
	}
	bin, command, err := resolveTools(ctx, o)
	if err != nil {
		return res, err
	}
	if res.Dir, err = workDir(o.dir); err != nil {
		return res, err
	}
	logf("working directory %s, seed %d", res.Dir, o.seed)
	_, storage, _ := replicaFiles(res.Dir, o, 0)
	at := journalAt{storage: storage}
	res.JournalOn = "SQLite, " + sqlitefs.Path(at.storage)
	urlFile := ""
	if o.pg {
		var pj *pgJournal
		if pj, err = startPG(ctx, res.Dir); err != nil {
			return res, err
		}
		// err is run's own, so a failed stop reaches the caller; a schema
		// on a shared server goes with a passing soak, as the working
		// directory does, and stays with a failed one.
		defer func() {
			drop := err == nil && res.passed() && !o.keep
			if ferr := pj.finish(drop, logf); ferr != nil && err == nil {
				err = fmt.Errorf("stop postgres: %w", ferr)
			}
		}()
		urlFile = filepath.Join(res.Dir, "postgres.url")
		if err := pj.writeURL(urlFile); err != nil {
			return res, err
		}
		at.pgURL = pj.url
		res.JournalOn = "PostgreSQL, " + pj.where
	}
	logf("journal: %s", res.JournalOn)
	hsDir := filepath.Join(res.Dir, "dendrite")
	if err := os.Mkdir(hsDir, 0o700); err != nil {
		return res, err
	}
	hs, err := dendrite.Launch(hsDir)
	if err != nil {
		return res, err
	}
	defer func() {
		if serr := hs.Stop(); serr != nil && err == nil {
			err = fmt.Errorf("stop dendrite: %w", serr)
		}
	}()
	names := agentNames(o.agents())
	bots := make([]dendrite.Account, len(names))
	for i, name := range names {
		if bots[i], err = hs.RegisterAccount(ctx, name, secret()); err != nil {
			return res, err
		}
	}
	alice, err := hs.RegisterAccount(ctx, "alice", secret())
	if err != nil {
		return res, err
	}
	logf("Dendrite at %s (log %s)", hs.URL, filepath.Join(hsDir, "dendrite.log"))

	cli, err := mautrix.NewClient(hs.URL, id.UserID(alice.UserID), alice.AccessToken)
	if err != nil {
		return res, err
	}
	var device *e2eeperson.Client
	if o.encrypted {
		if device, err = e2eeperson.Open(ctx, hs.URL, alice); err != nil {
			return res, err
		}
		defer device.Close()
	}
	// The person has a room with each agent; with one agent it is the
	// soak's one room, as it always was.
	rooms := make([]*person, len(bots))
	for i, bot := range bots {
		p := &person{cli: cli, agent: bot.UserID, device: device}
		with := ""
		if len(bots) > 1 {
			p.txnTag = fmt.Sprintf("room%d-", i+1)
			with = " with " + bot.UserID
		}
		if o.encrypted {
			room, err := device.CreateEncryptedRoom(ctx, bot.UserID)
			if err != nil {
				return res, err
			}
			p.room = id.RoomID(room)
			logf("room %s%s: end-to-end encrypted, as Element creates one; the person writes from her own device %s", room, with, device.DeviceID())
		} else {
			created, err := cli.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "private_chat", Invite: []id.UserID{id.UserID(bot.UserID)}})
			if err != nil {
				return res, err
			}
			p.room = created.RoomID
			logf("room %s%s: not encrypted", p.room, with)
		}
		rooms[i] = p
	}

	if o.replicas > 1 {
		// Every replica must open the agents' olm accounts, kept in the
		// journal's database, with the one key: made here, before any
		// replica could make one of its own.
		if _, err := e2ee.LoadPickleKey(filepath.Join(res.Dir, pickleKeyFile)); err != nil {
			return res, err
		}
	}
	cfgs, err := writeConfig(res.Dir, hs.URL, bots, names, o, command, urlFile)
	if err != nil {
		return res, err
	}
	ds := make([]*daemon, len(cfgs))
	logPaths := make([]string, len(cfgs))
	for i, cfg := range cfgs {
		_, _, logPaths[i] = replicaFiles(res.Dir, o, i)
		who := "daemon"
		if len(cfgs) > 1 {
			who = "replica " + replicaName(i)
		}
		ds[i] = &daemon{bin: bin, cfg: cfg, logPath: logPaths[i], onCrash: func(what string) { logf("%s %s", who, what) }}
	}
	stopped := false
	defer func() {
		if !stopped {
			for _, d := range ds {
				d.Abort()
			}
		}
	}()
	// The first replica makes the journal, and the others start once it
	// has joined: replicas opening a new database at once race on its
	// migrations (the versions table is created outside their lock), and
	// all but one would fail. The others join as replicas do, each taking
	// its share of the agents from the first.
	for i, d := range ds {
		if err := d.Start(); err != nil {
			return res, err
		}
		if i == 0 && len(ds) > 1 {
			if err := awaitReplica(ctx, at, replicaName(0)); err != nil {
				return res, err
			}
		}
	}
	for _, p := range rooms {
		if err := awaitJoin(ctx, p, p.agent); err != nil {
			return res, err
		}
	}
	if len(ds) == 1 {
		logf("%s run -config %s (log %s); the agent joined %s", bin, cfgs[0], logPaths[0], rooms[0].room)
	} else {
		logf("%d replicas of %s run -config %s (logs %s), replicas: auto, takeover %s; the %d agents joined their rooms",
			len(ds), bin, strings.Join(cfgs, ", "), strings.Join(logPaths, ", "), replicaTakeover, len(rooms))
	}

	obs := newObserver(rooms)
	_, since, err := obs.syncOnce(ctx, "")
	if err != nil {
		return res, fmt.Errorf("the person's first sync: %w", err)
	}
	obsCtx, stopObserving := context.WithCancel(ctx)
	// The observer reads through the person's device: it ends before the
	// device closes.
	var observing sync.WaitGroup
	defer observing.Wait()
	defer stopObserving()
	observing.Go(func() { obs.run(obsCtx, since) })
	if device != nil {
		observing.Go(func() { obs.reopen(obsCtx) })
	}

	var (
		mu     sync.Mutex
		ids    []string
		last   time.Time // the last kill
		killed []kill
	)
	sentIDs := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), ids...)
	}
	moments := killMoments(mrand.New(mrand.NewPCG(o.seed, 2)), o.m, o.killWindow())
	targets := killTargets(mrand.New(mrand.NewPCG(o.seed, 3)), o.m, len(ds))
	postStart := time.Now()
	killErr := make(chan error, 1)
	go func() {
		killErr <- killAt(ctx, postStart, moments, func(i int) error {
			k := kill{Replica: targets[i]}
			if len(ds) > 1 {
				// Which agents the replica serves is read before the kill:
				// after it, the rows still name the dead replica until
				// another takes each agent.
				var herr error
				if k.Agents, herr = heldBy(ctx, at, replicaName(k.Replica), ds[k.Replica].Started()); herr != nil {
					logf("kill %d: %v", i+1, herr)
				}
			}
			now := time.Now()
			if err := ds[k.Replica].KillAndRestart(); err != nil {
				return err
			}
			k.At, k.UnixMS = now.Sub(postStart), now.UnixMilli()
			mu.Lock()
			last = now
			killed = append(killed, k)
			mu.Unlock()
			if len(ds) > 1 {
				logf("kill %d: replica %s, serving %s, killed and restarted", i+1, replicaName(k.Replica), agentList(k.Agents))
			}
			return nil
		})
	}()
	reportCtx, stopReporting := context.WithCancel(ctx)
	defer stopReporting()
	go func() {
		tick := time.NewTicker(progressEvery)
		defer tick.Stop()
		for {
			select {
			case <-reportCtx.Done():
				return
			case <-tick.C:
			}
			ids := sentIDs()
			answered, _ := obs.progress(ids)
			starts, kills, _ := counts(ds)
			logf("posted %d/%d, answered %d, killed %d/%d, started %d", len(ids), o.k, answered, kills, o.m, starts)
		}
	}()

	logf("posting %d messages at %g/s with %d kills over the first %s", o.k, o.rate, o.m, o.killWindow().Round(time.Second))
	res.Posted, err = post(ctx, rooms, o, mrand.New(mrand.NewPCG(o.seed, 1)), func(m sent) {
		mu.Lock()
		ids = append(ids, m.ID)
		mu.Unlock()
	})
	if err != nil {
		return res, err
	}
	postEnd := time.Now()
	logf("posted %d messages (%d in threads, %d edits) in %s", o.k, res.Posted.Threaded, res.Posted.Edits, res.Posted.Took.Round(time.Millisecond))
	if err := <-killErr; err != nil {
		return res, err
	}
	mu.Lock()
	lastKill := last
	res.Killed = killed
	mu.Unlock()
	if lastKill.IsZero() {
		lastKill = postEnd
	} else {
		res.LastKill = lastKill.Sub(postStart)
	}

	all := sentIDs()
	deadline := time.Now().Add(o.drainTimeout)
	var lastAnswer time.Time
	for {
		res.Answered, lastAnswer = obs.progress(all)
		if res.Answered == len(all) || time.Now().After(deadline) {
			break
		}
		if err := obs.deviceFailure(); err != nil {
			return res, fmt.Errorf("the person's device stopped syncing, so no key reaches it: %w", err)
		}
		if err := pause(ctx); err != nil {
			return res, err
		}
	}
	res.Drained = res.Answered == len(all)
	if res.Drained {
		res.Drain = max(0, lastAnswer.Sub(lastKill))
		logf("every message answered, %s after the last kill", res.Drain.Round(time.Millisecond))
	} else {
		logf("%d of %d messages answered after %s of draining; giving up", res.Answered, len(all), o.drainTimeout)
	}
	stopReporting()

	// Every message event the rooms hold is admitted before the stop, so
	// the journal's figures after it are final.
	records, _, err := roomRecords(ctx, rooms, obs.record())
	if err != nil {
		return res, err
	}
	var admitted []string
	for i, p := range rooms {
		admitted = append(admitted, messageIDs(records[i], alice.UserID, p.agent)...)
	}
	if err := awaitJournaled(ctx, at, names, admitted); err != nil {
		logf("%v", err)
	}
	stopped = true
	res.StopErr = stopAll(ds)
	res.Starts, res.Kills, res.Crashes = counts(ds)
	logf("%s stopped (%d starts, %d kills): %v", plural(len(ds), "daemon", "replicas"), res.Starts, res.Kills, exitText(res.StopErr))
	if res.Devices, res.OffDevice, err = daemonDevices(logPaths...); err != nil {
		return res, err
	}

	for _, p := range rooms {
		end, err := p.send(ctx, event.Type{Type: endType, Class: event.MessageEventType}, map[string]any{})
		if err != nil {
			return res, err
		}
		if err := awaitSeen(ctx, obs, end); err != nil {
			return res, err
		}
	}
	stopObserving()
	// Each room's record is what the person's sync showed and what
	// /messages returns, together: Dendrite's backward /messages skips an
	// event that shares its depth with the last one of a page (the next
	// page's token starts one depth lower), so neither alone is complete.
	if records, res.WalkSkipped, err = roomRecords(ctx, rooms, obs.record()); err != nil {
		return res, err
	}
	obs.mu.Lock()
	res.Gaps = obs.gaps
	obs.mu.Unlock()
	checked := make([]roomRecord, len(rooms))
	for i, p := range rooms {
		checked[i] = roomRecord{bot: p.agent, events: records[i]}
		for _, m := range res.Posted.Messages {
			if m.Room == p.room {
				checked[i].msgs = append(checked[i].msgs, m)
			}
		}
	}
	var byRoom []serverTally
	res.Server, byRoom = tallyRooms(checked, o.encrypted)
	shares := make([]agentShare, len(rooms))
	answersOf := map[string][]answer{}
	for i, p := range rooms {
		res.Undecrypted = append(res.Undecrypted, p.whyUndecrypted(ctx, records[i], byRoom[i].Undecrypted)...)
		shares[i] = agentShare{agent: names[i], msgs: checked[i].msgs,
			others: messageIDs(records[i], alice.UserID, p.agent), answers: byRoom[i].Answers}
		answersOf[names[i]] = byRoom[i].Answers
	}
	answeredAgain(res.Killed, answersOf)
	if res.CutSends, err = cutSends(filepath.Join(hsDir, "dendrite.log")); err != nil {
		return res, err
	}
	if res.Journal, err = readJournal(ctx, at, shares); err != nil {
		return res, err
	}
	statusArgs := []string{"status", "-storage", at.storage}
	if urlFile != "" {
		statusArgs = append(statusArgs, "-database-url-file", urlFile)
	}
	status, err := exec.CommandContext(ctx, bin, statusArgs...).CombinedOutput()
	res.Status = string(status)
	if err != nil {
		return res, fmt.Errorf("mindroomd status: %w: %s", err, status)
	}
	res.Wall = time.Since(began)
	return res, nil
}

// roomRecords reads each room's record: what the person's sync showed of
// it (synced) and what /messages returns, each as the person's device
// reads it, each event once; skipped counts the events the walks of
// /messages did not return and the sync did.
func roomRecords(ctx context.Context, rooms []*person, synced map[id.RoomID][]json.RawMessage) (records [][]json.RawMessage, skipped int, err error) {
	records = make([][]json.RawMessage, len(rooms))
	for i, p := range rooms {
		history, err := p.history(ctx)
		if err != nil {
			return nil, 0, err
		}
		history = p.readAll(ctx, history)
		records[i] = union(synced[p.room], history)
		skipped += len(records[i]) - len(union(history, nil))
	}
	return records, skipped, nil
}

// kill is one of the soak's SIGKILLs.
type kill struct {
	// At is when it came, after the first post; UnixMS the same moment
	// by the clock the homeserver stamps events with.
	At     time.Duration
	UnixMS int64
	// Replica is the replica it took, from 0.
	Replica int
	// Agents are the agents the replica served as it was killed, with
	// several replicas.
	Agents []string
	// Again is how long after the kill the last of Agents had an answer
	// the homeserver took in after it. Measured is false when none of them
	// had one: the replica served none, or their rooms had nothing left to
	// answer.
	Again    time.Duration
	Measured bool
}

// answeredAgain measures, for each kill, how long its replica's agents
// went without answering: from the kill to each agent's first answer the
// homeserver took in after it, the longest of them. An agent whose room
// had nothing left to answer has no such answer and counts for nothing.
// It bounds the takeover from above: a room with no message waiting
// answers only once the next one comes.
func answeredAgain(kills []kill, answers map[string][]answer) {
	for i := range kills {
		k := &kills[i]
		k.Again, k.Measured = 0, false
		for _, agent := range k.Agents {
			first := int64(-1)
			for _, a := range answers[agent] {
				if a.TS >= k.UnixMS && (first < 0 || a.TS < first) {
					first = a.TS
				}
			}
			if first < 0 {
				continue
			}
			k.Measured = true
			k.Again = max(k.Again, time.Duration(first-k.UnixMS)*time.Millisecond)
		}
	}
}

// resolveTools finds the daemon and, for the exec agent, the Python
// interpreter itself: a version manager's shim in front of it would add its
// own start-up to every turn.
func resolveTools(ctx context.Context, o options) (bin string, python string, err error) {
	if bin, err = filepath.Abs(o.bin); err != nil {
		return "", "", err
	}
	if _, err := os.Stat(bin); err != nil {
		return "", "", fmt.Errorf("no daemon binary (run `make build`): %w", err)
	}
	if o.agent != "exec" {
		return bin, "", nil
	}
	path, err := exec.LookPath(o.python)
	if err != nil {
		return "", "", fmt.Errorf("the exec agent needs Python: %w", err)
	}
	exe, err := exec.CommandContext(ctx, path, "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		return "", "", fmt.Errorf("ask %s for its interpreter: %w", path, err)
	}
	return bin, strings.TrimSpace(string(exe)), nil
}

// workDir creates the soak's working directory: dir, which must be new or
// empty, or a new temporary one.
func workDir(dir string) (string, error) {
	if dir == "" {
		return os.MkdirTemp("", "mindroomd-soak-")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	if len(entries) > 0 {
		return "", fmt.Errorf("-dir %s is not empty", dir)
	}
	return filepath.Abs(dir)
}

// secret is a random password.
func secret() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// agentWrapper is the exec agent the soak runs: a pause of up to the
// delay, then examples/echo-agent.py in the same interpreter.
const agentWrapper = `"""The soak's agent: a random pause, then the echo agent."""
import random
import runpy
import sys
import time

time.sleep(random.uniform(0, %g))
sys.argv = [%s]
runpy.run_path(%s, run_name="__main__")
`

// agentNames are the soak's n agents' names, each its account's
// localpart too: agentName alone for one agent, as the soak always had.
func agentNames(n int) []string {
	if n == 1 {
		return []string{agentName}
	}
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", agentName, i+1)
	}
	return out
}

// replicaName is the replica_id of the i-th replica, from 0.
func replicaName(i int) string {
	return fmt.Sprintf("r%d", i+1)
}

// replicaFiles are the i-th daemon's configuration, storage directory and
// log under dir: the ones the soak always had for a single daemon, each
// replica's own, named after it, for several.
func replicaFiles(dir string, o options, i int) (cfg, storage, log string) {
	if o.replicas == 1 {
		return filepath.Join(dir, "mindroom.yaml"), filepath.Join(dir, "storage"), filepath.Join(dir, "mindroomd.log")
	}
	r := replicaName(i)
	return filepath.Join(dir, "mindroom-"+r+".yaml"), filepath.Join(dir, "storage-"+r), filepath.Join(dir, "mindroomd-"+r+".log")
}

// writeConfig writes each daemon's configuration, the agents' passwords
// and, for the exec back-end, the agents' wrapper into dir, and returns
// the configurations' paths. A urlFile puts the journal in the PostgreSQL
// database it names. Several replicas each have their own configuration
// and storage, replicas: auto, and the shared pickle key.
func writeConfig(dir, homeserver string, bots []dendrite.Account, names []string, o options, python, urlFile string) ([]string, error) {
	for i, bot := range bots {
		if err := os.WriteFile(filepath.Join(dir, names[i]+".password"), []byte(bot.Password+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	backend := "      type: echo\n"
	if o.agent == "exec" {
		script, err := filepath.Abs(o.script)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(script); err != nil {
			return nil, fmt.Errorf("the exec agent's script: %w", err)
		}
		quoted, err := json.Marshal(script)
		if err != nil {
			return nil, err
		}
		wrapper := filepath.Join(dir, "agent.py")
		if err := os.WriteFile(wrapper, fmt.Appendf(nil, agentWrapper, o.agentDelay.Seconds(), quoted, quoted), 0o600); err != nil {
			return nil, err
		}
		command, err := json.Marshal([]string{python, wrapper})
		if err != nil {
			return nil, err
		}
		backend = fmt.Sprintf("      type: exec\n      command: %s\n      timeout: %s\n", command, execTimeout)
	}
	// Top-level keys beside homeserver and storage.
	top := ""
	if urlFile != "" {
		quoted, err := json.Marshal(urlFile)
		if err != nil {
			return nil, err
		}
		top = fmt.Sprintf("database_url_file: %s\n", quoted)
	}
	if o.retention {
		top += "retention: {bodies: 1s, payloads: 1s, turns: 1s, rejected: 1s, identities: 24h, interval: 1s}\n"
	}
	var agents strings.Builder
	for i, bot := range bots {
		fmt.Fprintf(&agents, `  - name: %s
    user_id: "%s"
    password_file: ./%s.password
    auto_join: true
    backend:
%s`, names[i], bot.UserID, names[i], backend)
	}
	paths := make([]string, o.replicas)
	for i := range paths {
		var storage string
		paths[i], storage, _ = replicaFiles(dir, o, i)
		replica := ""
		if o.replicas > 1 {
			replica = fmt.Sprintf("pickle_key_file: ./%s\nreplicas: %s\nreplica_id: %s\nreplica_takeover: %s\n",
				pickleKeyFile, config.ReplicasAuto, replicaName(i), replicaTakeover)
		}
		cfg := fmt.Sprintf(`homeserver: %s
storage: ./%s
%s%slisten: 127.0.0.1:0
agents:
%s`, homeserver, filepath.Base(storage), top, replica, agents.String())
		if err := os.WriteFile(paths[i], []byte(cfg), 0o600); err != nil {
			return nil, err
		}
	}
	return paths, nil
}

// awaitJoin waits until the agent is a member of the person's room.
func awaitJoin(ctx context.Context, p *person, bot string) error {
	ctx, cancel := context.WithTimeout(ctx, joinTimeout)
	defer cancel()
	for {
		members, err := p.cli.JoinedMembers(ctx, p.room)
		if err == nil {
			if _, ok := members.Joined[id.UserID(bot)]; ok {
				return nil
			}
		}
		if err := pause(ctx); err != nil {
			return fmt.Errorf("the agent never joined %s: %w", p.room, err)
		}
	}
}

// killAt calls kill at each moment after start, with the moment's index:
// kill SIGKILLs a daemon and restarts it before it returns, so the next
// kill never finds it down.
func killAt(ctx context.Context, start time.Time, moments []time.Duration, kill func(i int) error) error {
	for i, m := range moments {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(start.Add(m))):
		}
		if err := kill(i); err != nil {
			return err
		}
	}
	return nil
}

// counts adds up the daemons' starts, kills and crashes, each crash named
// by its replica when there are several.
func counts(ds []*daemon) (starts, kills int, crashes []string) {
	for i, d := range ds {
		s, k, c := d.Counts()
		starts += s
		kills += k
		for _, what := range c {
			if len(ds) > 1 {
				what = "replica " + replicaName(i) + ": " + what
			}
			crashes = append(crashes, what)
		}
	}
	return starts, kills, crashes
}

// stopAll stops the daemons in order, all at once, and returns how that
// failed: the one daemon's error as it is, each failing replica's named.
func stopAll(ds []*daemon) error {
	if len(ds) == 1 {
		return ds[0].Stop()
	}
	errs := make([]error, len(ds))
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Go(func() {
			if err := d.Stop(); err != nil {
				errs[i] = fmt.Errorf("replica %s: %s", replicaName(i), exitText(err))
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// plural is one when n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// agentList names agents for the log and the report.
func agentList(agents []string) string {
	if len(agents) == 0 {
		return "no agent"
	}
	return strings.Join(agents, ", ")
}

// awaitReplica waits until the replica named replica has joined the
// replicas in the journal at.
func awaitReplica(ctx context.Context, at journalAt, replica string) error {
	ctx, cancel := context.WithTimeout(ctx, joinTimeout)
	defer cancel()
	var err error
	for {
		var joined bool
		if joined, err = beats(ctx, at, replica); joined {
			return nil
		}
		if perr := pause(ctx); perr != nil {
			return fmt.Errorf("replica %s never joined the replicas in the journal (%v): %w", replica, err, perr)
		}
	}
}

// awaitSeen waits until the person's sync has shown eventID.
func awaitSeen(ctx context.Context, obs *observer, eventID string) error {
	ctx, cancel := context.WithTimeout(ctx, endTimeout)
	defer cancel()
	for !obs.saw(eventID) {
		if err := pause(ctx); err != nil {
			return fmt.Errorf("the person's sync never showed %s: %w", eventID, err)
		}
	}
	return nil
}

// awaitJournaled waits until the agents' principals in the journal at hold
// every one of ids, reading it read-only beside the running daemons.
func awaitJournaled(ctx context.Context, at journalAt, agents, ids []string) error {
	ctx, cancel := context.WithTimeout(ctx, admitTimeout)
	defer cancel()
	var missing int
	for {
		class, err := readAgentEvents(ctx, at, agents)
		if err == nil {
			missing = 0
			for _, id := range ids {
				if _, ok := class[id]; !ok {
					missing++
				}
			}
			if missing == 0 {
				return nil
			}
		}
		if err := pause(ctx); err != nil {
			return fmt.Errorf("%d message events still not journaled after %s", missing, admitTimeout)
		}
	}
}

// messageIDs are the IDs of the message events among events that the
// person or the agent sent: the journal admits each (the person's messages
// as work, their edits and the agent's answers as context).
func messageIDs(events []json.RawMessage, person, bot string) []string {
	var out []string
	for _, raw := range events {
		ev, err := parseEvent(raw)
		if err == nil && ev.Type == "m.room.message" && (ev.Sender == person || ev.Sender == bot) {
			out = append(out, ev.ID)
		}
	}
	return out
}

// daemonDevices reads the daemons' logs for the device each start's
// end-to-end encryption came up on, agent by agent: the devices, the first
// start's first, and how many starts came up on another than their
// agent's first start's. A start killed before it got that far logs none;
// logs where none did are an error, as the soak could not tell which
// device the daemon used.
func daemonDevices(logPaths ...string) (devices []string, off int, err error) {
	first := map[string]string{}
	for _, logPath := range logPaths {
		data, err := os.ReadFile(logPath)
		if err != nil {
			return nil, 0, err
		}
		for _, line := range strings.Split(string(data), "\n") {
			var rec struct {
				Message  string `json:"message"`
				Agent    string `json:"agent"`
				DeviceID string `json:"device_id"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil || rec.Message != cryptoReady || rec.DeviceID == "" {
				continue
			}
			if f, ok := first[rec.Agent]; !ok {
				first[rec.Agent] = rec.DeviceID
			} else if rec.DeviceID != f {
				off++
			}
			if !slices.Contains(devices, rec.DeviceID) {
				devices = append(devices, rec.DeviceID)
			}
		}
	}
	if len(devices) == 0 {
		return nil, 0, fmt.Errorf("no start of the daemon logged %q with its device in %s", cryptoReady, strings.Join(logPaths, ", "))
	}
	return devices, off, nil
}

// cutSends counts the daemon's sends Dendrite logged as failed because the
// client went away: it had taken the event in, and may have stored it,
// without recording the transaction ID.
func cutSends(logPath string) (int, error) {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, `msg="SendEvents failed"`) && strings.Contains(line, "context canceled") &&
			strings.Contains(line, "/send/m.room.message/mindroomd-") {
			n++
		}
	}
	return n, nil
}

func pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(pollEvery):
		return nil
	}
}

// exitText says how a stop ended.
func exitText(err error) string {
	if err == nil {
		return "exit 0"
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.String()
	}
	return err.Error()
}

// indent prefixes every line of s.
func indent(s, prefix string) string {
	var b bytes.Buffer
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString(prefix + line + "\n")
	}
	return b.String()
}
