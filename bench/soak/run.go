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

	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
)

const (
	// agentName is the daemon's one agent, and its account's localpart.
	agentName = "soak"
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
	Dir    string
	Seed   uint64
	Posted postResult
	Starts int
	Kills  int
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
	// first's, which would hold none of its keys.
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
	res.Seed = o.seed
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
	at := journalAt{storage: filepath.Join(res.Dir, "storage")}
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
	bot, err := hs.RegisterAccount(ctx, agentName, secret())
	if err != nil {
		return res, err
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
	p := &person{cli: cli}
	if o.encrypted {
		if p.device, err = e2eeperson.Open(ctx, hs.URL, alice); err != nil {
			return res, err
		}
		defer p.device.Close()
		room, err := p.device.CreateEncryptedRoom(ctx, bot.UserID)
		if err != nil {
			return res, err
		}
		p.room = id.RoomID(room)
		logf("room %s: end-to-end encrypted, as Element creates one; the person writes from her own device %s", room, p.device.DeviceID())
	} else {
		created, err := cli.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "private_chat", Invite: []id.UserID{id.UserID(bot.UserID)}})
		if err != nil {
			return res, err
		}
		p.room = created.RoomID
		logf("room %s: not encrypted", p.room)
	}

	cfg, err := writeConfig(res.Dir, hs.URL, bot, o, command, urlFile)
	if err != nil {
		return res, err
	}
	d := &daemon{bin: bin, cfg: cfg, logPath: filepath.Join(res.Dir, "mindroomd.log"),
		onCrash: func(what string) { logf("daemon %s", what) }}
	if err := d.Start(); err != nil {
		return res, err
	}
	stopped := false
	defer func() {
		if !stopped {
			d.Abort()
		}
	}()
	if err := awaitJoin(ctx, p, bot.UserID); err != nil {
		return res, err
	}
	logf("%s run -config %s (log %s); the agent joined %s", bin, cfg, d.logPath, p.room)

	obs := newObserver(p, bot.UserID)
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
	if p.device != nil {
		observing.Go(func() { obs.reopen(obsCtx) })
	}

	var (
		mu   sync.Mutex
		ids  []string
		last time.Time // the last kill
	)
	sentIDs := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), ids...)
	}
	moments := killMoments(mrand.New(mrand.NewPCG(o.seed, 2)), o.m, o.killWindow())
	postStart := time.Now()
	killErr := make(chan error, 1)
	go func() {
		killErr <- killAt(ctx, d, postStart, moments, func(at time.Time) {
			mu.Lock()
			last = at
			mu.Unlock()
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
			starts, kills, _ := d.Counts()
			logf("posted %d/%d, answered %d, killed %d/%d, started %d", len(ids), o.k, answered, kills, o.m, starts)
		}
	}()

	logf("posting %d messages at %g/s with %d kills over the first %s", o.k, o.rate, o.m, o.killWindow().Round(time.Second))
	res.Posted, err = post(ctx, p, o, mrand.New(mrand.NewPCG(o.seed, 1)), func(m sent) {
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

	// Every message event the room holds is admitted before the stop, so
	// the journal's figures after it are final.
	history, err := p.history(ctx)
	if err != nil {
		return res, err
	}
	record := union(obs.record(), p.readAll(ctx, history))
	if err := awaitJournaled(ctx, at, messageIDs(record, alice.UserID, bot.UserID)); err != nil {
		logf("%v", err)
	}
	stopped = true
	res.StopErr = d.Stop()
	res.Starts, res.Kills, res.Crashes = d.Counts()
	logf("daemon stopped (%d starts, %d kills): %v", res.Starts, res.Kills, exitText(res.StopErr))
	if res.Devices, res.OffDevice, err = daemonDevices(d.logPath); err != nil {
		return res, err
	}

	end, err := p.send(ctx, event.Type{Type: endType, Class: event.MessageEventType}, map[string]any{})
	if err != nil {
		return res, err
	}
	if err := awaitSeen(ctx, obs, end); err != nil {
		return res, err
	}
	stopObserving()
	// The room's record is what the person's sync showed and what
	// /messages returns, together: Dendrite's backward /messages skips an
	// event that shares its depth with the last one of a page (the next
	// page's token starts one depth lower), so neither alone is complete.
	if history, err = p.history(ctx); err != nil {
		return res, err
	}
	history = p.readAll(ctx, history)
	synced := obs.record()
	record = union(synced, history)
	res.WalkSkipped = len(record) - len(union(history, nil))
	obs.mu.Lock()
	res.Gaps = obs.gaps
	obs.mu.Unlock()
	res.Server = tallyRoom(record, bot.UserID, res.Posted.Messages, o.encrypted)
	res.Undecrypted = p.whyUndecrypted(ctx, record, res.Server.Undecrypted)
	if res.CutSends, err = cutSends(filepath.Join(hsDir, "dendrite.log")); err != nil {
		return res, err
	}
	if res.Journal, err = readJournal(ctx, at, agentName, res.Posted.Messages,
		messageIDs(record, alice.UserID, bot.UserID), res.Server.Answers); err != nil {
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

// writeConfig writes the daemon's configuration, the agent's password and,
// for the exec back-end, the agent's wrapper into dir. A urlFile puts the
// journal in the PostgreSQL database it names.
func writeConfig(dir, homeserver string, bot dendrite.Account, o options, python, urlFile string) (string, error) {
	if err := os.WriteFile(filepath.Join(dir, agentName+".password"), []byte(bot.Password+"\n"), 0o600); err != nil {
		return "", err
	}
	backend := "      type: echo\n"
	if o.agent == "exec" {
		script, err := filepath.Abs(o.script)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(script); err != nil {
			return "", fmt.Errorf("the exec agent's script: %w", err)
		}
		quoted, err := json.Marshal(script)
		if err != nil {
			return "", err
		}
		wrapper := filepath.Join(dir, "agent.py")
		if err := os.WriteFile(wrapper, fmt.Appendf(nil, agentWrapper, o.agentDelay.Seconds(), quoted, quoted), 0o600); err != nil {
			return "", err
		}
		command, err := json.Marshal([]string{python, wrapper})
		if err != nil {
			return "", err
		}
		backend = fmt.Sprintf("      type: exec\n      command: %s\n      timeout: %s\n", command, execTimeout)
	}
	// Top-level keys beside homeserver and storage.
	top := ""
	if urlFile != "" {
		quoted, err := json.Marshal(urlFile)
		if err != nil {
			return "", err
		}
		top = fmt.Sprintf("database_url_file: %s\n", quoted)
	}
	if o.retention {
		top += "retention: {bodies: 1s, payloads: 1s, turns: 1s, rejected: 1s, identities: 24h, interval: 1s}\n"
	}
	cfg := fmt.Sprintf(`homeserver: %s
storage: ./storage
%slisten: 127.0.0.1:0
agents:
  - name: %s
    user_id: "%s"
    password_file: ./%s.password
    auto_join: true
    backend:
%s`, homeserver, top, agentName, bot.UserID, agentName, backend)
	path := filepath.Join(dir, "mindroom.yaml")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
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

// killAt SIGKILLs the daemon at each moment after start and restarts it,
// telling onKill when each kill came.
func killAt(ctx context.Context, d *daemon, start time.Time, moments []time.Duration, onKill func(time.Time)) error {
	for _, m := range moments {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(start.Add(m))):
		}
		at := time.Now()
		if err := d.KillAndRestart(); err != nil {
			return err
		}
		onKill(at)
	}
	return nil
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

// awaitJournaled waits until the journal at holds every one of ids,
// reading it read-only beside the running daemon.
func awaitJournaled(ctx context.Context, at journalAt, ids []string) error {
	ctx, cancel := context.WithTimeout(ctx, admitTimeout)
	defer cancel()
	var missing int
	for {
		class, err := readAgentEvents(ctx, at, agentName)
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

// daemonDevices reads the daemon's log for the device each start's
// end-to-end encryption came up on: the devices, the first start's first,
// and how many starts came up on another than the first's. A start killed
// before it got that far logs none; a log where none did is an error, as
// the soak could not tell which device the daemon used.
func daemonDevices(logPath string) (devices []string, off int, err error) {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return nil, 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		var rec struct {
			Message  string `json:"message"`
			DeviceID string `json:"device_id"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Message != cryptoReady || rec.DeviceID == "" {
			continue
		}
		if len(devices) > 0 && rec.DeviceID != devices[0] {
			off++
		}
		if !slices.Contains(devices, rec.DeviceID) {
			devices = append(devices, rec.DeviceID)
		}
	}
	if len(devices) == 0 {
		return nil, 0, fmt.Errorf("no start of the daemon logged %q with its device in %s", cryptoReady, logPath)
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
