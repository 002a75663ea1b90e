package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
)

// writeEncryptedConfig writes a configuration of one echo agent named
// name whose agent API answers to token, with storage under dir.
func writeEncryptedConfig(t *testing.T, homeserver string, bot dendrite.Account, name, token, dir string, extra ...string) string {
	t.Helper()
	return writeAgentConfig(t, homeserver, bot, name, token, "echo", dir, extra...)
}

// encryptedReply matches the agent's encrypted answer to body.
func encryptedReply(bot, body string) func(string, map[string]any, json.RawMessage) bool {
	return func(typ string, content map[string]any, raw json.RawMessage) bool {
		var ev struct {
			Sender string `json:"sender"`
			Type   string `json:"type"`
		}
		return json.Unmarshal(raw, &ev) == nil && ev.Sender == bot && ev.Type == "m.room.encrypted" &&
			typ == "m.room.message" && content["body"] == "echo: "+body
	}
}

// joinedBy matches the membership event of user joining.
func joinedBy(user string) func(string, map[string]any, json.RawMessage) bool {
	return func(typ string, content map[string]any, raw json.RawMessage) bool {
		var ev struct {
			StateKey string `json:"state_key"`
		}
		return typ == "m.room.member" && content["membership"] == "join" &&
			json.Unmarshal(raw, &ev) == nil && ev.StateKey == user
	}
}

// answersFrom counts the agent's decrypted answers in room by body.
func answersFrom(t *testing.T, p *e2eeperson.Person, room, bot string) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, d := range p.DecryptedTimeline(room) {
		if d.Sender != bot || d.Type != "m.room.message" {
			continue
		}
		if !d.Encrypted {
			t.Fatalf("the agent sent %s in the clear into an encrypted room", d.EventID)
		}
		if body, _ := d.Content["body"].(string); body != "" {
			n[body]++
		}
	}
	return n
}

// encrypted is an agent's daemon and a person, alice, in an encrypted
// room alice made and the agent joined.
type encrypted struct {
	t     *testing.T
	hs    *dendrite.Server
	bot   dendrite.Account
	alice *e2eeperson.Person
	// dir holds the configuration (cfg) and the storage (dir/storage).
	dir, cfg, room, token string
	d                     *inProcess
	ctx                   context.Context
}

// startEncrypted starts Dendrite and the daemon of one echo agent named
// name (extra lines added to its configuration), and has alice invite it
// into a new encrypted room; it returns once the agent has joined. The
// daemon is stopped cleanly when the test ends.
func startEncrypted(t *testing.T, name string, extra ...string) *encrypted {
	t.Helper()
	e := &encrypted{t: t, hs: dendrite.Start(t), dir: t.TempDir(), token: name + "-api-token"}
	e.bot = e.hs.Register(t, name, name+"-password-4b1d")
	e.alice = e2eeperson.New(t, e.hs, e.hs.Register(t, "alice", "alice-password"))
	e.cfg = writeEncryptedConfig(t, e.hs.URL, e.bot, name, e.token, e.dir, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	e.ctx = ctx
	e.start()
	t.Cleanup(func() { e.d.stopCleanly(t) })
	e.room = e.alice.CreateEncryptedRoom(e.bot.UserID)
	e.alice.AwaitDecrypted(ctx, e.room, joinedBy(e.bot.UserID))
	return e
}

// start runs the daemon on the fixture's configuration.
func (e *encrypted) start() { e.d = runInProcess(e.cfg) }

// restart stops the daemon cleanly and starts it again.
func (e *encrypted) restart() {
	e.t.Helper()
	e.d.stopCleanly(e.t)
	e.start()
}

// ask has alice send body and waits for the agent's encrypted answer.
func (e *encrypted) ask(body string) string {
	e.t.Helper()
	id := e.alice.SendText(e.room, body)
	e.awaitAnswer(body)
	return id
}

// awaitAnswer waits for the agent's encrypted answer to body.
func (e *encrypted) awaitAnswer(body string) {
	e.t.Helper()
	e.alice.AwaitDecrypted(e.ctx, e.room, encryptedReply(e.bot.UserID, body))
}

// storage is the agent's storage directory.
func (e *encrypted) storage() string { return filepath.Join(e.dir, "storage") }

// answers counts the agent's answers by body, as alice decrypts them.
func (e *encrypted) answers() map[string]int {
	e.t.Helper()
	return answersFrom(e.t, e.alice, e.room, e.bot.UserID)
}

// answeredOnce fails the test unless each question has exactly one answer.
func (e *encrypted) answeredOnce(questions ...string) {
	e.t.Helper()
	got := e.answers()
	for _, q := range questions {
		if got["echo: "+q] != 1 {
			e.t.Fatalf("answers = %v, want %q answered once", got, q)
		}
	}
}

func TestAPersonInAnEncryptedRoomIsAnsweredOnceAndReadsEveryReply(t *testing.T) {
	e := startEncrypted(t, "cipher")
	alice, room := e.alice, e.room
	hello := e.ask("Hello, encrypted!")
	alice.Edit(room, hello, "Hello, edited!")
	alice.ThreadReply(room, hello, "And in a thread?")
	e.awaitAnswer("And in a thread?")
	regret := e.ask("Never mind this one")
	alice.Redact(room, regret)
	e.ask("The last one")

	// The agent's device is cross-signed, as the person's client sees it.
	dev, ok, err := e2ee.ReadDeviceStatus(e.storage(), "cipher")
	if err != nil || !ok || !dev.CrossSigned {
		t.Fatalf("device status = %+v, %t, %v; want it recorded as cross-signed", dev, ok, err)
	}
	if signed, err := alice.DeviceIsCrossSigned(e.ctx, e.bot.UserID, dev.DeviceID); err != nil || !signed {
		t.Fatalf("the person's client sees device %s cross-signed: %t, %v", dev.DeviceID, signed, err)
	}
	if fi, err := os.Stat(filepath.Join(e.storage(), "matrix", "cipher.recovery-key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("recovery key file: %v, %v; want it written 0600", fi, err)
	}
	e.answeredOnce("Hello, encrypted!", "And in a thread?", "Never mind this one", "The last one")

	// The agent API shows the conversation as a person reads it: the
	// edit applied, the redacted message gone, the answers there.
	var page struct {
		Messages []struct {
			Content struct {
				Body string `json:"body"`
			} `json:"content"`
		} `json:"messages"`
	}
	u := "http://" + daemonAddress(t, e.d.log) + "/v1/agents/cipher/rooms/" + url.PathEscape(room) + "/messages?limit=50"
	if code := apiCall(t, "GET", u, e.token, "", &page); code != http.StatusOK {
		t.Fatalf("messages: status %d", code)
	}
	var bodies []string
	for _, m := range page.Messages {
		bodies = append(bodies, m.Content.Body)
	}
	for _, w := range []string{"Hello, edited!", "echo: Hello, encrypted!", "The last one", "echo: The last one"} {
		if !slices.Contains(bodies, w) {
			t.Fatalf("the room's page = %q, lacks %q", bodies, w)
		}
	}
	for _, gone := range []string{"Hello, encrypted!", "Never mind this one"} {
		if slices.Contains(bodies, gone) {
			t.Fatalf("the room's page = %q, still shows %q", bodies, gone)
		}
	}
}

func TestAMessageWhoseKeyComesLateIsAnsweredOnceWhenItComes(t *testing.T) {
	e := startEncrypted(t, "late")
	alice, room := e.alice, e.room
	e.ask("First, with its key")
	late := alice.SendTextWithheldFrom(room, "Second, key withheld", e.bot.UserID)
	// The daemon has admitted the ciphertext once a later message it could
	// read was answered: sync order is receipt order.
	e.ask("Third, with its key")
	if n := e.answers()["echo: Second, key withheld"]; n != 0 {
		t.Fatalf("the message whose key is withheld was answered %d times before its key came", n)
	}
	if slices.Contains(pendingIDs(t, "http://"+daemonAddress(t, e.d.log)+"/v1/agents/late", e.token), late) {
		t.Fatal("an event still awaiting its key is offered as work")
	}

	alice.ShareWithheldKeys(room)
	e.awaitAnswer("Second, key withheld")
	if !strings.Contains(e.d.log.String(), `"event_id":"`+late+`","room_id":"`+room+`","outcome":"resolved"`) {
		t.Fatalf("the daemon did not log the late key resolving %s:\n%s", late, e.d.log.String())
	}
	e.ask("Fourth, the last")
	e.answeredOnce("First, with its key", "Second, key withheld", "Third, with its key", "Fourth, the last")
}

// noticeOf matches the agent's notice that it cannot read a message yet.
func noticeOf(bot string) func(string, map[string]any, json.RawMessage) bool {
	return func(typ string, content map[string]any, raw json.RawMessage) bool {
		var ev struct {
			Sender string `json:"sender"`
		}
		return json.Unmarshal(raw, &ev) == nil && ev.Sender == bot && typ == "m.room.message" &&
			content["msgtype"] == "m.notice" && content["body"] == journal.KeyNoticeBody
	}
}

func TestAMessageWhoseKeyIsMissingIsToldToTheRoomOnceAndAKickBeforeItsKeyVoidsIt(t *testing.T) {
	e := startEncrypted(t, "kicked", "key_notice_after: 1s\n")
	alice, room, bot := e.alice, e.room, e.bot.UserID
	withheld := alice.SendTextWithheldFrom(room, "Said before the kick", bot)
	alice.AwaitDecrypted(e.ctx, room, noticeOf(bot))

	// The person removes the agent and asks it back; only then does the
	// key come. What was said to the ended membership is never answered.
	firstJoins := joinIDs(t, alice, room, bot)
	alice.Kick(room, bot)
	alice.Invite(room, bot)
	rejoined := func(typ string, content map[string]any, raw json.RawMessage) bool {
		var ev struct {
			EventID string `json:"event_id"`
		}
		_ = json.Unmarshal(raw, &ev)
		return joinedBy(bot)(typ, content, raw) && !slices.Contains(firstJoins, ev.EventID)
	}
	alice.AwaitDecrypted(e.ctx, room, rejoined)
	alice.ShareWithheldKeys(room)
	e.ask("Said after the rejoin")

	// A restart sweeps every wait again: still one notice, no answer.
	e.restart()
	e.ask("After the restart")
	got := e.answers()
	if n := got["echo: Said before the kick"]; n != 0 {
		t.Fatalf("the message of the ended membership %s was answered %d times once its key came", withheld, n)
	}
	if n := got[journal.KeyNoticeBody]; n != 1 {
		t.Fatalf("the room was told %d times that a key is missing, want once: %v", n, got)
	}
}

// joinIDs lists the event IDs of user's joins of room, oldest first.
func joinIDs(t *testing.T, p *e2eeperson.Person, room, user string) []string {
	t.Helper()
	var ids []string
	for _, d := range p.DecryptedTimeline(room) {
		var ev struct {
			StateKey string `json:"state_key"`
		}
		if d.Type == "m.room.member" && d.Content["membership"] == "join" && json.Unmarshal(d.Raw, &ev) == nil && ev.StateKey == user {
			ids = append(ids, d.EventID)
		}
	}
	return ids
}

func TestABackupOfAnEncryptedAgentRestoresToADaemonThatStillReadsItsRooms(t *testing.T) {
	e := startEncrypted(t, "keeper")
	e.ask("Before the backup")
	storage := e.storage()
	to := filepath.Join(t.TempDir(), "journal.backup")
	out, err := run(t, "backup", "-storage", storage, "-to", to)
	if err != nil || !strings.Contains(out, "(1 olm accounts) written to "+to+".crypto.db and verified") {
		t.Fatalf("backup beside the running daemon: %v\n%s", err, out)
	}
	e.d.stopCleanly(t)

	// The restore: the two backups, and the secrets kept apart from them
	// (the pickle key, the Matrix session, the recovery key).
	restored := t.TempDir()
	moves := map[string]string{
		to:                                   filepath.Join(restored, "storage", "tracking", "event_journal.db"),
		to + ".crypto.db":                    filepath.Join(restored, "storage", "crypto.db"),
		filepath.Join(storage, "pickle.key"): filepath.Join(restored, "storage", "pickle.key"),
		filepath.Join(storage, "matrix", "keeper.session.json"): filepath.Join(restored, "storage", "matrix", "keeper.session.json"),
		filepath.Join(storage, "matrix", "keeper.recovery-key"): filepath.Join(restored, "storage", "matrix", "keeper.recovery-key"),
	}
	for from, dst := range moves {
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(from, dst); err != nil {
			t.Fatal(err)
		}
	}
	e.cfg = writeEncryptedConfig(t, e.hs.URL, e.bot, "keeper", e.token, restored)
	e.start()
	e.ask("After the restore")
	e.answeredOnce("Before the backup", "After the restore")
}

func TestMalformedCiphertextIsRecordedAndSkippedAndTheBacklogGoesOn(t *testing.T) {
	e := startEncrypted(t, "sturdy")
	mallory := e.hs.User(t, e.hs.Register(t, "mallory", "mallory-password"))
	e.alice.Invite(e.room, mallory.UserID)
	mallory.Join(e.room)

	session := strings.Repeat("A", 43)
	bad := map[string]map[string]any{
		"missing fields":    {"algorithm": "m.megolm.v1.aes-sha2"},
		"unknown algorithm": {"algorithm": "m.rot13.v1", "ciphertext": "Uryyb", "session_id": session, "sender_key": "x", "device_id": "D"},
		"not base64": {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": strings.Repeat("!", 100),
			"session_id": session, "sender_key": "x", "device_id": "D"},
	}
	ids := map[string]string{}
	for what, content := range bad {
		ids[what] = mallory.Send(e.room, "m.room.encrypted", content)
	}
	// Well-formed ciphertext under a session nobody ever shared cannot be
	// told from a message whose key is late: it waits (never work) until
	// its deadline settles it.
	mallory.Send(e.room, "m.room.encrypted", map[string]any{"algorithm": "m.megolm.v1.aes-sha2",
		"ciphertext": strings.Repeat("Zm9v", 30), "session_id": session, "sender_key": "x", "device_id": "D"})
	e.ask("Still heard")
	out, err := run(t, "status", "-storage", e.storage())
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if fields := statusLine(t, out, "sturdy@"+e.bot.UserID); fields[10] != "1" || fields[11] != "0" {
		t.Fatalf("status line %q: want 1 event awaiting its key and none undecryptable", fields)
	}
	log := e.d.log.String()
	for what, id := range ids {
		if !strings.Contains(log, `"event_id":"`+id+`"`) || !strings.Contains(log, "Malformed event recorded and skipped") {
			t.Fatalf("the %s event %s was not recorded as malformed; log:\n%s", what, id, log)
		}
	}
}

// statusLine returns the fields of principal's line of a status output.
func statusLine(t *testing.T, out, principal string) []string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == principal {
			return f
		}
	}
	t.Fatalf("status has no line for %s:\n%s", principal, out)
	return nil
}

func TestAWrongPickleKeyOrALostCryptoStoreRefusesTheStartWithExit4(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "guarded", "guarded-password-6d5a")
	dir := t.TempDir()
	cfg := writeEncryptedConfig(t, hs.URL, bot, "guarded", "guarded-api-token", dir)
	d := runInProcess(cfg)
	daemonAddress(t, d.log) // running: its olm account exists and its keys are published
	d.stopCleanly(t)
	storage := filepath.Join(dir, "storage")
	pickle := filepath.Join(storage, "pickle.key")
	key, err := os.ReadFile(pickle)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(t *testing.T, want string) {
		t.Helper()
		d := runInProcess(cfg)
		var code int
		select {
		case code = <-d.done:
			d.done <- code
		case <-time.After(time.Minute):
			d.stop(t)
			t.Fatalf("the daemon started; its log:\n%s", d.log)
		}
		if code != exitJournal {
			t.Fatalf("the daemon exited %d, want %d; its log:\n%s", code, exitJournal, d.log)
		}
		if !strings.Contains(d.log.String(), want) {
			t.Fatalf("the refusal does not say %q; its log:\n%s", want, d.log)
		}
		if strings.Contains(d.log.String(), strings.TrimSpace(string(key))) {
			t.Fatal("the log shows the pickle key")
		}
	}

	t.Run("WrongPickleKey", func(t *testing.T) {
		if err := os.WriteFile(pickle, []byte("not the key that pickled the account\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		refused(t, "the pickle key does not open guarded@"+bot.UserID+"'s olm account")
		if err := os.WriteFile(pickle, key, 0o600); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("LostCryptoStore", func(t *testing.T) {
		for _, f := range []string{"crypto.db", "crypto.db-wal", "crypto.db-shm"} {
			if err := os.Remove(filepath.Join(storage, f)); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}
		refused(t, "the homeserver publishes other keys for device")
	})
}

func TestOnPostgreSQLTheCryptoStoreLivesInTheDatabaseAndAnEncryptedRoomIsAnsweredAcrossARestart(t *testing.T) {
	dbURL := postgresURL(t)
	urlFile := filepath.Join(t.TempDir(), "pg.url")
	if err := os.WriteFile(urlFile, []byte(dbURL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := startEncrypted(t, "pgcipher", "database_url_file: "+urlFile+"\n")
	e.ask("Hello, PostgreSQL")
	if _, err := os.Stat(filepath.Join(e.storage(), "crypto.db")); !os.IsNotExist(err) {
		t.Fatalf("a crypto.db beside a PostgreSQL journal: %v", err)
	}
	conn, err := pgx.Connect(e.ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	var accounts int
	err = conn.QueryRow(e.ctx, `SELECT count(*) FROM crypto_account WHERE account_id = $1`, "pgcipher@"+e.bot.UserID).Scan(&accounts)
	_ = conn.Close(e.ctx)
	if err != nil || accounts != 1 {
		t.Fatalf("olm accounts in the database = %d, %v; want the agent's one", accounts, err)
	}
	e.restart()
	e.ask("After the restart")
	e.answeredOnce("Hello, PostgreSQL", "After the restart")
}

// botSession reads the agent's Matrix session file.
func botSession(t *testing.T, storage, agent string) (deviceID, token string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(storage, "matrix", agent+".session.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		DeviceID    string `json:"device_id"`
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return s.DeviceID, s.AccessToken
}

// devicesOf lists the device IDs of the account token signs in.
func devicesOf(t *testing.T, homeserver, token string) []string {
	t.Helper()
	var resp struct {
		Devices []struct {
			DeviceID string `json:"device_id"`
		} `json:"devices"`
	}
	if code := apiCall(t, "GET", homeserver+"/_matrix/client/v3/devices", token, "", &resp); code != http.StatusOK {
		t.Fatalf("devices: status %d", code)
	}
	var ids []string
	for _, d := range resp.Devices {
		ids = append(ids, d.DeviceID)
	}
	slices.Sort(ids)
	return ids
}

func TestARestartAndAReLoginKeepTheAgentsOneDeviceItsKeysAndItsSignature(t *testing.T) {
	e := startEncrypted(t, "steady")
	waker := e.hs.User(t, e.hs.Register(t, "waker", "waker-password"))
	e.ask("First")
	device, token := botSession(t, e.storage(), "steady")
	before := devicesOf(t, e.hs.URL, token)

	e.restart()
	e.ask("After the restart")
	if again, _ := botSession(t, e.storage(), "steady"); again != device {
		t.Fatalf("the restart moved the agent from device %s to %s", device, again)
	}

	// The session is signed out (on Dendrite that deletes the device and
	// its keys); a sync the waker wakes meets the refusal, and the daemon
	// logs in again on the same device and publishes its keys again.
	e.alice.Invite(e.room, waker.UserID)
	waker.Join(e.room)
	if code := apiCall(t, "POST", e.hs.URL+"/_matrix/client/v3/logout", token, "{}", nil); code != http.StatusOK {
		t.Fatalf("logout: status %d", code)
	}
	waker.SendText(e.room, "wake up")
	e.d.awaitLog(t, "Device keys uploaded", 1)
	e.ask("After the re-login")

	now, token := botSession(t, e.storage(), "steady")
	if now != device {
		t.Fatalf("the re-login moved the agent from device %s to %s", device, now)
	}
	if after := devicesOf(t, e.hs.URL, token); !slices.Equal(after, before) {
		t.Fatalf("devices = %v after a restart and a re-login, want %v", after, before)
	}
	if signed, err := e.alice.DeviceIsCrossSigned(e.ctx, e.bot.UserID, device); err != nil || !signed {
		t.Fatalf("after the re-login the person's client sees device %s cross-signed: %t, %v", device, signed, err)
	}
	e.answeredOnce("First", "After the restart", "After the re-login")
}

func TestARoomWhoseKeptStateForgotItsEncryptionGetsNoPlaintext(t *testing.T) {
	e := startEncrypted(t, "careful")
	e.ask("Before")
	e.d.stopCleanly(t)
	// A crypto store restored from a copy older than the room's
	// encryption: the kept state no longer says the room is encrypted, and
	// the sync will not show that state again.
	db, err := sql.Open("sqlite3", filepath.Join(e.storage(), "crypto.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE mx_room_state SET encryption = NULL WHERE room_id = ?`, e.room); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	e.start()
	e.ask("After")
	e.answeredOnce("Before", "After") // answersFrom fails the test on a clear answer
	if !strings.Contains(e.d.log.String(), "the homeserver said so") {
		t.Fatalf("the daemon did not ask the homeserver; its log:\n%s", e.d.log)
	}
}
