package principal_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3" // reads the crypto store the killed child left
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/actors/outbox"
	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport/crash"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
)

// The encrypted crash tests kill a real process: the parent test
// re-executes this test binary as a child that runs one principal with
// end-to-end encryption against the package's Dendrite, reads "AT <point>"
// from the child's stdout, SIGKILLs it, starts it again without the point
// on the same storage (journal, crypto.db beside it, the session file) and
// checks what the person's own crypto client reads in the room.
//
// The child is not a Test function: the package's TestMain starts a
// Dendrite in every process of this binary, and a child killed with
// SIGKILL would leave its own behind, running. So init takes the child
// over, before TestMain, when the child's environment is set.

// Environment of the child.
const (
	envE2EECrashDir      = "MINDROOMD_E2EECRASH_DIR"        // storage: journal, crypto.db, session file
	envE2EECrashServer   = "MINDROOMD_E2EECRASH_HOMESERVER" // the parent's Dendrite
	envE2EECrashUser     = "MINDROOMD_E2EECRASH_USER"       // the agent's account
	envE2EECrashPassword = "MINDROOMD_E2EECRASH_PASSWORD"
	envE2EECrashPoint    = "MINDROOMD_E2EECRASH_POINT" // kill point; "" runs to DONE
	envE2EECrashRoom     = "MINDROOMD_E2EECRASH_ROOM"  // with EVENT: what DONE waits for
	envE2EECrashEvent    = "MINDROOMD_E2EECRASH_EVENT"
)

// Kill points.
const (
	// pointAfterDeviceNews: the crypto engine took a sync response that
	// brought to-device messages (the room key stored), the journal has
	// neither admitted the response nor stored its token.
	pointAfterDeviceNews = "after-device-news"
	// pointAfterEncryptedAccept: the homeserver accepted the encrypted
	// reply and answered its event ID; the acknowledgement is not
	// committed.
	pointAfterEncryptedAccept = "after-accept"
)

const (
	e2eeCrashAgent = "cipher"
	// e2eeCrashChildDeadline bounds one run of the child; the parent's
	// waits are bounded by e2eeCrashDeadline. Both are generous: the
	// machine is shared with other test runs.
	e2eeCrashChildDeadline = 3 * time.Minute
	e2eeCrashDeadline      = 4 * time.Minute
	// syncFailed is the principal's record of a sync response it could not
	// apply.
	syncFailed = "Sync failed; retrying from the same token"
)

func init() {
	if os.Getenv(envE2EECrashDir) == "" {
		return
	}
	os.Exit(runE2EECrashChild())
}

func TestKilledBetweenTheRoomKeyAndTheBatchCommitTheMessageIsAnsweredOnce(t *testing.T) {
	w := newE2EECrashWorld(t)
	c := w.start(pointAfterDeviceNews, "")
	c.WaitFor(w.ctx, t, "READY")
	w.createRoom()

	question := w.alice.SendText(w.room, "Is this kept across a kill?")
	c.WaitFor(w.ctx, t, "AT "+pointAfterDeviceNews)
	c.Kill(t)
	// What the crypto engine took just before the kill.
	replayed := c.valuesOf("TODEVICE")
	next := c.valueOf(t, "NEXT")
	together := "a later one"
	for _, id := range c.valuesOf("SEALED") {
		if id == question {
			together = "the same one"
		}
	}
	t.Logf("killed run: %q", c.Seen)

	// The kill landed between the two stores: the room key is in the
	// crypto store, the response that brought it is not in the journal.
	v, closeJournal := w.openJournal()
	if _, seen, err := v.AdmittedThreadID(w.ctx, w.room, question); err != nil || seen {
		t.Fatalf("at the kill the journal holds the question: %v, %v; want it not admitted", seen, err)
	}
	if tok, err := v.SyncToken(w.ctx); err != nil || tok == next {
		t.Fatalf("at the kill the sync token is %q (%v); want it short of the killed response's %q", tok, err, next)
	}
	closeJournal()
	if n := w.roomKeys(); n == 0 {
		t.Fatalf("at the kill the crypto store holds no room key of %s; want the one the response brought", w.room)
	}

	c = w.start("", question)
	c.WaitFor(w.ctx, t, "DONE")
	c.Exit(t)

	// The response came again, to-device messages and all, and the
	// crypto engine took them again without stopping the sync.
	again := map[string]bool{}
	for _, h := range c.valuesOf("TODEVICE") {
		again[h] = true
	}
	for _, h := range replayed {
		if !again[h] {
			t.Errorf("the to-device message %s of the killed response did not come again; the restart took %v", h, c.valuesOf("TODEVICE"))
		}
	}
	if n := c.logged(syncFailed); n > 0 {
		t.Errorf("after the restart the sync failed %d times:\n%s", n, c.Stderr())
	}
	t.Logf("the restart's crypto engine logged %d duplicate olm messages", c.logged("Ignoring duplicate olm message"))

	v, closeJournal = w.openJournal()
	defer closeJournal()
	w.checkSettled(v)
	reply := w.checkAnsweredOnce(v, question, "echo: Is this kept across a kill?")
	t.Logf("restart: %q", c.Seen)
	t.Logf("killed after the device news of a response with %d to-device messages, the question in %s; answered once, as %s",
		len(replayed), together, reply)
}

func TestKilledBetweenAnEncryptedSendAndItsAckANewDeviceFindsTheReplyInItsCiphertext(t *testing.T) {
	w := newE2EECrashWorld(t)
	c := w.start(pointAfterEncryptedAccept, "")
	c.WaitFor(w.ctx, t, "READY")
	oldDevice := c.valueOf(t, "DEVICE")
	w.createRoom()

	question := w.alice.SendText(w.room, "Will you say this once?")
	c.WaitFor(w.ctx, t, "AT "+pointAfterEncryptedAccept)
	c.Kill(t)
	accepted := c.valueOf(t, "ACCEPTED")
	t.Logf("killed run: %q", c.Seen)

	// The kill landed between the send and its acknowledgement.
	v, closeJournal := w.openJournal()
	d, err := v.Delivery(w.ctx, journal.ReplyDeliveryID(question), journal.StageFinal)
	if err != nil || d.State != journal.DeliveryAttempted || d.DeviceID != oldDevice || d.EventID != "" {
		t.Fatalf("at the kill the reply is %v from %q as %q (%v); want attempted from %s, unacknowledged",
			d.State, d.DeviceID, d.EventID, err, oldDevice)
	}
	closeJournal()

	// A fresh login: a device of its own, on which the homeserver's
	// transaction memory cannot recognise the cut-off send.
	if err := os.Remove(filepath.Join(w.dir, "matrix", e2eeCrashAgent+".session.json")); err != nil {
		t.Fatal(err)
	}
	c = w.start("", question)
	c.WaitFor(w.ctx, t, "DONE")
	c.Exit(t)
	t.Logf("restart: %q", c.Seen)
	if newDevice := c.valueOf(t, "DEVICE"); newDevice == oldDevice {
		t.Fatalf("the restart signed in on device %s again; the test needs a new one", oldDevice)
	}
	// The new device's olm account read the old device's ciphertext.
	opened := map[string]string{}
	for _, o := range c.valuesOf("OPENED") {
		id, typ, _ := strings.Cut(o, " ")
		opened[id] = typ
	}
	if opened[accepted] != "m.room.message" {
		t.Errorf("the reconciler opened the cut-off reply %s as %q; want m.room.message (opened: %v)", accepted, opened[accepted], opened)
	}

	v, closeJournal = w.openJournal()
	defer closeJournal()
	w.checkSettled(v)
	reply := w.checkAnsweredOnce(v, question, "echo: Will you say this once?")
	if reply != accepted {
		t.Errorf("the room's one reply is %s; want the one accepted before the kill, %s", reply, accepted)
	}
	if d, err := v.Delivery(w.ctx, journal.ReplyDeliveryID(question), journal.StageFinal); err != nil ||
		d.State != journal.DeliveryAcknowledged || d.EventID != accepted {
		t.Errorf("the reply's delivery is %v as %q (%v); want acknowledged as %s", d.State, d.EventID, err, accepted)
	}
}

// e2eeCrashWorld is one test's agent account, storage, person and room.
type e2eeCrashWorld struct {
	t     *testing.T
	ctx   context.Context
	dir   string
	bot   dendrite.Account
	alice *e2eeperson.Person
	room  string
}

func newE2EECrashWorld(t *testing.T) *e2eeCrashWorld {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eeCrashDeadline)
	t.Cleanup(cancel)
	n := accounts.Add(1)
	w := &e2eeCrashWorld{t: t, ctx: ctx, dir: t.TempDir()}
	w.bot = hs.Register(t, fmt.Sprintf("cipherbot%d", n), "cipherbot-password")
	w.alice = e2eeperson.New(t, hs, hs.Register(t, fmt.Sprintf("cipheralice%d", n), "cipheralice-password"))
	return w
}

// createRoom has the person create an encrypted room with the agent
// invited, and waits until the agent has joined it.
func (w *e2eeCrashWorld) createRoom() {
	w.t.Helper()
	w.room = w.alice.CreateEncryptedRoom(w.bot.UserID)
	w.alice.AwaitDecrypted(w.ctx, w.room, func(typ string, content map[string]any, raw json.RawMessage) bool {
		var ev struct {
			StateKey string `json:"state_key"`
		}
		return typ == "m.room.member" && content["membership"] == "join" &&
			json.Unmarshal(raw, &ev) == nil && ev.StateKey == w.bot.UserID
	})
}

// start runs the child on the world's storage: killed at point, or, with
// no point, until the question is answered and nothing is owed.
func (w *e2eeCrashWorld) start(point, question string) *e2eeCrashChild {
	w.t.Helper()
	env := append(os.Environ(),
		envE2EECrashDir+"="+w.dir, envE2EECrashServer+"="+hs.URL, envE2EECrashUser+"="+w.bot.UserID,
		envE2EECrashPassword+"="+w.bot.Password, envE2EECrashPoint+"="+point,
		envE2EECrashRoom+"="+w.room, envE2EECrashEvent+"="+question)
	return &e2eeCrashChild{crash.StartProcess(w.t, env, "-test.run=^$")}
}

// e2eeCrashJournal is the journal a child left, opened read-only.
type e2eeCrashJournal struct {
	journal.PrincipalStore
	store *store.Store
}

// openJournal opens the journal the child left, read-only, and returns
// it with the agent's view, and its closer.
func (w *e2eeCrashWorld) openJournal() (e2eeCrashJournal, func()) {
	w.t.Helper()
	s, err := store.Open(w.ctx, store.Options{StorageDir: w.dir, ReadOnly: true})
	if err != nil {
		w.t.Fatalf("open the journal the child left: %v", err)
	}
	v, err := s.Principal(w.ctx, e2eeCrashAgent, w.bot.UserID)
	if err != nil {
		_ = s.Close()
		w.t.Fatalf("the agent's view: %v", err)
	}
	return e2eeCrashJournal{PrincipalStore: v, store: s}, func() {
		if err := s.Close(); err != nil {
			w.t.Errorf("close the journal: %v", err)
		}
	}
}

// roomKeys counts the megolm sessions of the room the agent's olm account
// holds, read from the crypto store on disk.
func (w *e2eeCrashWorld) roomKeys() int {
	w.t.Helper()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(w.dir, e2ee.FileName)+"?mode=ro")
	if err != nil {
		w.t.Fatalf("open the crypto store: %v", err)
	}
	defer db.Close()
	account := journal.Principal{Agent: e2eeCrashAgent, UserID: w.bot.UserID}.String()
	var n int
	err = db.QueryRowContext(w.ctx, `SELECT COUNT(*) FROM crypto_megolm_inbound_session
		WHERE account_id = ? AND room_id = ? AND session IS NOT NULL`, account, w.room).Scan(&n)
	if err != nil {
		w.t.Fatalf("read the crypto store's room keys: %v", err)
	}
	return n
}

// checkSettled fails the test unless the journal owes nothing: no event
// pending, no reply unacknowledged, no event awaiting its key and none
// given up as undecryptable.
func (w *e2eeCrashWorld) checkSettled(j e2eeCrashJournal) {
	w.t.Helper()
	page, err := j.Pending(w.ctx, 10, 0)
	if err != nil || len(page.Events)+len(page.Unreadable) > 0 {
		w.t.Errorf("pending after the restart: %+v, %v; want none", page, err)
	}
	rows, err := j.Unacknowledged(w.ctx, 10, nil)
	if err != nil || len(rows) > 0 {
		w.t.Errorf("unacknowledged after the restart: %+v, %v; want none", rows, err)
	}
	waits, err := j.KeyWaits(w.ctx, 10)
	if err != nil || len(waits) > 0 {
		w.t.Errorf("events awaiting keys after the restart: %+v, %v; want none", waits, err)
	}
	status, err := j.store.Status(w.ctx)
	if err != nil {
		w.t.Fatalf("journal status: %v", err)
	}
	for _, st := range status {
		if st.Agent == e2eeCrashAgent && (st.AwaitingKeys != 0 || st.Undecryptable != 0 || st.Pending != 0 || st.Attempted != 0) {
			w.t.Errorf("after the restart the journal's status is %+v; want nothing awaiting a key, undecryptable, pending or attempted", st)
		}
	}
}

// checkAnsweredOnce fails the test unless the person reads exactly one
// message of the agent in the room, encrypted, saying want, and the turn
// of question is delivered as that event; it returns the event's ID.
func (w *e2eeCrashWorld) checkAnsweredOnce(v e2eeCrashJournal, question, want string) string {
	w.t.Helper()
	// The agent is stopped and everything it sent is acknowledged: once
	// the person's client reads a message sent after all of it, its
	// timeline holds every reply there is.
	mark := w.alice.SendText(w.room, "end of the test")
	w.alice.AwaitDecrypted(w.ctx, w.room, func(_ string, _ map[string]any, raw json.RawMessage) bool {
		var ev struct {
			ID string `json:"event_id"`
		}
		return json.Unmarshal(raw, &ev) == nil && ev.ID == mark
	})
	var replies []e2eeperson.Decrypted
	for _, d := range w.alice.DecryptedTimeline(w.room) {
		var ev struct {
			StateKey *string `json:"state_key"`
		}
		if d.Sender != w.bot.UserID || json.Unmarshal(d.Raw, &ev) != nil || ev.StateKey != nil {
			continue
		}
		replies = append(replies, d)
	}
	var report []string
	for _, d := range replies {
		report = append(report, fmt.Sprintf("%s %s %v (encrypted %t, error %v)", d.EventID, d.Type, d.Content["body"], d.Encrypted, d.Err))
	}
	if len(replies) != 1 {
		w.t.Fatalf("the person reads %d messages of the agent in the room, want exactly one:\n%s", len(replies), strings.Join(report, "\n"))
	}
	r := replies[0]
	if !r.Encrypted || r.Err != nil || r.Type != "m.room.message" || r.Content["body"] != want {
		w.t.Fatalf("the person reads the agent's message as %s; want %q, encrypted", report[0], want)
	}
	turn, ok, err := v.TurnForEvent(w.ctx, question)
	if err != nil || !ok || turn.State != journal.TurnDelivered || turn.EventID != r.EventID {
		w.t.Errorf("the question's turn is %+v (found %t, %v); want delivered as %s", turn, ok, err, r.EventID)
	}
	return r.EventID
}

// e2eeCrashChild is one run of the child process, seen from the parent.
type e2eeCrashChild struct{ *crash.Process }

// valuesOf returns what follows "<key> " on each line the child printed.
func (c *e2eeCrashChild) valuesOf(key string) []string {
	var out []string
	for _, line := range c.Seen {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			out = append(out, v)
		}
	}
	return out
}

// valueOf is the value of the one line the child printed under key.
func (c *e2eeCrashChild) valueOf(t *testing.T, key string) string {
	t.Helper()
	vs := c.valuesOf(key)
	if len(vs) != 1 {
		t.Fatalf("the child printed %d %s lines, want one; stdout %q", len(vs), key, c.Seen)
	}
	return vs[0]
}

// logged counts the child's log records with message msg.
func (c *e2eeCrashChild) logged(msg string) int {
	n := 0
	sc := bufio.NewScanner(strings.NewReader(c.Stderr()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Message == msg {
			n++
		}
	}
	return n
}

// The child.

// e2eeChildOut serialises the child's stdout lines.
var e2eeChildOut sync.Mutex

// childSay prints one protocol line to the parent. Stdout is unbuffered: the
// line is in the pipe when childSay returns.
func childSay(key string, values ...string) {
	e2eeChildOut.Lock()
	defer e2eeChildOut.Unlock()
	fmt.Fprintln(os.Stdout, strings.Join(append([]string{key}, values...), " "))
}

// e2eeChildConfig is what the parent hands the child.
type e2eeChildConfig struct {
	dir, homeserver, user, password, point, room, event string
}

func runE2EECrashChild() int {
	cfg := e2eeChildConfig{
		dir: os.Getenv(envE2EECrashDir), homeserver: os.Getenv(envE2EECrashServer), user: os.Getenv(envE2EECrashUser),
		password: os.Getenv(envE2EECrashPassword), point: os.Getenv(envE2EECrashPoint),
		room: os.Getenv(envE2EECrashRoom), event: os.Getenv(envE2EECrashEvent),
	}
	ctx, cancel := context.WithTimeout(context.Background(), e2eeCrashChildDeadline)
	defer cancel()
	log := zerolog.New(os.Stderr).With().Timestamp().Logger().Level(zerolog.InfoLevel)
	if err := e2eeCrashChildRun(ctx, cfg, log); err != nil {
		log.Error().Err(err).Msg("child failed")
		return 1
	}
	return 0
}

// childHalt announces the kill point and waits to be killed; a child the
// parent forgot ends at its deadline.
func childHalt(ctx context.Context, point string) {
	childSay("AT", point)
	<-ctx.Done()
	fmt.Fprintf(os.Stderr, "not killed at %s: %v\n", point, ctx.Err())
	os.Exit(3)
}

// e2eeCrashChildRun signs the agent in, wires its encryption as the
// daemon does (cmd/mindroomd startAgent) and runs its principal with the
// echo agent: to the kill point, or until the awaited question is
// admitted and nothing is owed any more.
func e2eeCrashChildRun(ctx context.Context, cfg e2eeChildConfig, log zerolog.Logger) (err error) {
	s, err := store.Open(ctx, store.Options{StorageDir: cfg.dir})
	if err != nil {
		return fmt.Errorf("open journal: %w", err)
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	view, err := s.Principal(ctx, e2eeCrashAgent, cfg.user)
	if err != nil {
		return err
	}
	client, err := matrix.Login(ctx, matrix.Config{Homeserver: cfg.homeserver, UserID: cfg.user, Password: cfg.password,
		Agent: e2eeCrashAgent, StorageDir: cfg.dir, Log: log})
	if err != nil {
		return fmt.Errorf("login: %w", err)
	}
	childSay("DEVICE", client.DeviceID())
	pickleKey, err := e2ee.LoadPickleKey(filepath.Join(cfg.dir, "pickle.key"))
	if err != nil {
		return err
	}
	cryptoStore, err := e2ee.OpenSQLite(ctx, filepath.Join(cfg.dir, e2ee.FileName))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cryptoStore.Close()) }()
	machine, err := cryptoStore.Machine(ctx, e2ee.Options{Account: view.Principal().String(), Client: client,
		PickleKey: pickleKey, Log: log})
	if err != nil {
		return err
	}
	defer machine.Close()
	client.SetEncrypter(machine)
	reconciler := matrix.NewReconciler(client)
	reconciler.Open = reportOpened(machine.Open, client.UserID())
	sender := matrix.NewSender(client)

	var (
		crypto principal.Crypto = reportDeviceNews{Crypto: machine, halt: func() {}}
		send   outbox.Sender    = sender
	)
	switch cfg.point {
	case pointAfterDeviceNews:
		crypto = reportDeviceNews{Crypto: machine, halt: func() { childHalt(ctx, cfg.point) }}
	case pointAfterEncryptedAccept:
		send = haltAfterAccept{Sender: sender, halt: func() { childHalt(ctx, cfg.point) }}
	case "":
	default:
		return fmt.Errorf("unknown kill point %q", cfg.point)
	}

	faults := make(chan error, 1)
	sub := s.Hints().Subscribe(view.Principal().String())
	defer sub.Close()
	system := actors.NewSystem(zerolog.Nop())
	pid := system.Root.Spawn(principal.Props(principal.Deps{
		Store: view, Transport: client, Agent: agent.Echo{}, Sender: send, Reconciler: reconciler,
		DeviceID: client.DeviceID(), Hints: s.Hints(), AutoJoin: true, Crypto: crypto, Log: log,
		SyncTimeout: time.Second, BackoffBase: 50 * time.Millisecond, BackoffMax: time.Second,
		OnFault: func(err error) {
			select {
			case faults <- err:
			default:
			}
		},
	}))
	defer func() { err = errors.Join(err, system.Root.StopFuture(pid).Wait()) }()
	childSay("READY")

	for {
		if cfg.point == "" && cfg.event != "" {
			done, err := e2eeCrashSettled(ctx, view, cfg.room, cfg.event)
			if err != nil {
				return err
			}
			if done {
				childSay("DONE")
				return nil
			}
		}
		select {
		case <-sub.C():
		case err := <-faults:
			return fmt.Errorf("the principal stopped: %w", err)
		case <-ctx.Done():
			if cfg.point != "" {
				return fmt.Errorf("never reached %s: %w", cfg.point, ctx.Err())
			}
			return fmt.Errorf("%s was never settled: %w", cfg.event, ctx.Err())
		}
	}
}

// e2eeCrashSettled reports whether event is admitted and nothing is owed:
// no event pending, no reply unacknowledged, no event awaiting its key.
func e2eeCrashSettled(ctx context.Context, v journal.PrincipalStore, room, event string) (bool, error) {
	if _, seen, err := v.AdmittedThreadID(ctx, room, event); err != nil || !seen {
		return false, err
	}
	page, err := v.Pending(ctx, 1, 0)
	if err != nil || len(page.Events)+len(page.Unreadable) > 0 {
		return false, err
	}
	rows, err := v.Unacknowledged(ctx, 1, nil)
	if err != nil || len(rows) > 0 {
		return false, err
	}
	waits, err := v.KeyWaits(ctx, 1)
	return err == nil && len(waits) == 0, err
}

// reportDeviceNews is the account's encryption, telling the parent of
// every to-device message the crypto engine took ("TODEVICE <type> <hash
// of its content>"), of the encrypted timeline events of the same response
// ("SEALED <event ID>") and of its token ("NEXT <next_batch>"), and calling
// halt once it took a response that brought any.
type reportDeviceNews struct {
	principal.Crypto
	halt func()
}

func (r reportDeviceNews) ProcessSync(ctx context.Context, since string, b *matrix.SyncBatch) error {
	err := r.Crypto.ProcessSync(ctx, since, b)
	if err != nil || len(b.Crypto.ToDevice) == 0 {
		return err
	}
	for _, raw := range b.Crypto.ToDevice {
		var ev struct {
			Type    string          `json:"type"`
			Content json.RawMessage `json:"content"`
		}
		_ = json.Unmarshal(raw, &ev)
		sum := sha256.Sum256(ev.Content)
		childSay("TODEVICE", ev.Type, hex.EncodeToString(sum[:8]))
	}
	for _, room := range b.Joined {
		for _, raw := range room.Events {
			var ev struct {
				ID   string `json:"event_id"`
				Type string `json:"type"`
			}
			if json.Unmarshal(raw, &ev) == nil && ev.Type == "m.room.encrypted" {
				childSay("SEALED", ev.ID)
			}
		}
	}
	childSay("NEXT", b.NextBatch)
	r.halt()
	return nil
}

// haltAfterAccept sends through the real sender, then halts once the
// homeserver answered an event ID ("ACCEPTED <event ID>").
type haltAfterAccept struct {
	*matrix.Sender
	halt func()
}

func (h haltAfterAccept) Send(ctx context.Context, d journal.Delivery, content json.RawMessage) (journal.Sent, error) {
	sent, err := h.Sender.Send(ctx, d, content)
	if err == nil {
		childSay("ACCEPTED", sent.EventID)
		h.halt()
	}
	return sent, err
}

// reportOpened is the reconciler's Open, telling the parent what each of
// the agent's own events opened to ("OPENED <event ID> <type>").
func reportOpened(open func(context.Context, string, json.RawMessage) json.RawMessage, self string) func(context.Context, string, json.RawMessage) json.RawMessage {
	return func(ctx context.Context, room string, raw json.RawMessage) json.RawMessage {
		out := open(ctx, room, raw)
		var in, opened struct {
			ID     string `json:"event_id"`
			Sender string `json:"sender"`
			Type   string `json:"type"`
		}
		if json.Unmarshal(raw, &in) == nil && in.Sender == self && json.Unmarshal(out, &opened) == nil {
			childSay("OPENED", in.ID, opened.Type)
		}
		return out
	}
}
