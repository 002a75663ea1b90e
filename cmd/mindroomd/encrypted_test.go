package main

import (
	"context"
	"encoding/json"
	"fmt"
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
	for file, v := range map[string]string{"pw": bot.Password, "tok": token} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "mindroom.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`homeserver: %s
storage: ./storage
listen: 127.0.0.1:0
%sagents:
  - name: %s
    user_id: "%s"
    password_file: pw
    api_token_file: tok
    auto_join: true
    backend:
      type: echo
`, homeserver, strings.Join(extra, ""), name, bot.UserID)), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
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

func TestAPersonInAnEncryptedRoomIsAnsweredOnceAndReadsEveryReply(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "cipher", "cipher-password-9a1e")
	alice := e2eeperson.New(t, hs, hs.Register(t, "alice", "alice-password"))
	const token = "encrypted-api-token-5b7c"
	dir := t.TempDir()
	d := runInProcess(writeEncryptedConfig(t, hs.URL, bot, "cipher", token, dir))
	t.Cleanup(func() { d.stopCleanly(t) })

	room := alice.CreateEncryptedRoom(bot.UserID)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice.AwaitDecrypted(ctx, room, joinedBy(bot.UserID))

	hello := alice.SendText(room, "Hello, encrypted!")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "Hello, encrypted!"))
	alice.Edit(room, hello, "Hello, edited!")
	alice.ThreadReply(room, hello, "And in a thread?")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "And in a thread?"))
	regret := alice.SendText(room, "Never mind this one")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "Never mind this one"))
	alice.Redact(room, regret)
	alice.SendText(room, "The last one")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "The last one"))

	// The agent's device is cross-signed, as the person's client sees it.
	dev, ok, err := e2ee.ReadDeviceStatus(filepath.Join(dir, "storage"), "cipher")
	if err != nil || !ok || !dev.CrossSigned {
		t.Fatalf("device status = %+v, %t, %v; want it recorded as cross-signed", dev, ok, err)
	}
	if signed, err := alice.DeviceIsCrossSigned(ctx, bot.UserID, dev.DeviceID); err != nil || !signed {
		t.Fatalf("the person's client sees device %s cross-signed: %t, %v", dev.DeviceID, signed, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "storage", "matrix", "cipher.recovery-key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("recovery key file: %v, %v; want it written 0600", fi, err)
	}

	want := map[string]int{"echo: Hello, encrypted!": 1, "echo: And in a thread?": 1, "echo: Never mind this one": 1, "echo: The last one": 1}
	got := answersFrom(t, alice, room, bot.UserID)
	for body, n := range want {
		if got[body] != n {
			t.Fatalf("answers = %v, want each question answered once: %v", got, want)
		}
	}

	// The agent API shows the conversation as a person reads it: the
	// edit applied, the redacted message gone, the answers there.
	var page struct {
		Messages []struct {
			EventID string `json:"event_id"`
			Content struct {
				Body string `json:"body"`
			} `json:"content"`
		} `json:"messages"`
	}
	u := "http://" + daemonAddress(t, d.log) + "/v1/agents/cipher/rooms/" + url.PathEscape(room) + "/messages?limit=50"
	if code := apiCall(t, "GET", u, token, "", &page); code != http.StatusOK {
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
	hs := dendrite.Start(t)
	bot := hs.Register(t, "late", "late-password-3f2d")
	alice := e2eeperson.New(t, hs, hs.Register(t, "alice", "alice-password"))
	const token = "late-api-token-8e1a"
	d := runInProcess(writeEncryptedConfig(t, hs.URL, bot, "late", token, t.TempDir()))
	t.Cleanup(func() { d.stopCleanly(t) })

	room := alice.CreateEncryptedRoom(bot.UserID)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice.AwaitDecrypted(ctx, room, joinedBy(bot.UserID))
	alice.SendText(room, "First, with its key")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "First, with its key"))

	late := alice.SendTextWithheldFrom(room, "Second, key withheld", bot.UserID)
	// The daemon has admitted the ciphertext once a later message it could
	// read was answered: sync order is receipt order.
	alice.SendText(room, "Third, with its key")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "Third, with its key"))
	if n := answersFrom(t, alice, room, bot.UserID)["echo: Second, key withheld"]; n != 0 {
		t.Fatalf("the message whose key is withheld was answered %d times before its key came", n)
	}
	awaiting := func() int {
		var page struct {
			Events []struct {
				EventID string `json:"event_id"`
			} `json:"events"`
		}
		u := "http://" + daemonAddress(t, d.log) + "/v1/agents/late/pending?limit=50"
		if code := apiCall(t, "GET", u, token, "", &page); code != http.StatusOK {
			t.Fatalf("pending: status %d", code)
		}
		for _, e := range page.Events {
			if e.EventID == late {
				return 1
			}
		}
		return 0
	}
	if awaiting() != 0 {
		t.Fatal("an event still awaiting its key is offered as work")
	}

	alice.ShareWithheldKeys(room)
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "Second, key withheld"))
	if !strings.Contains(d.log.String(), `"event_id":"`+late+`","room_id":"`+room+`","outcome":"resolved"`) {
		t.Fatalf("the daemon did not log the late key resolving %s:\n%s", late, d.log.String())
	}
	alice.SendText(room, "Fourth, the last")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "Fourth, the last"))
	got := answersFrom(t, alice, room, bot.UserID)
	for _, q := range []string{"First, with its key", "Second, key withheld", "Third, with its key", "Fourth, the last"} {
		if got["echo: "+q] != 1 {
			t.Fatalf("answers = %v, want %q answered once", got, q)
		}
	}
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
	hs := dendrite.Start(t)
	bot := hs.Register(t, "kicked", "kicked-password-71c0")
	alice := e2eeperson.New(t, hs, hs.Register(t, "alice", "alice-password"))
	dir := t.TempDir()
	cfg := writeEncryptedConfig(t, hs.URL, bot, "kicked", "kicked-api-token", dir, "key_notice_after: 1s\n")
	d := runInProcess(cfg)

	room := alice.CreateEncryptedRoom(bot.UserID)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice.AwaitDecrypted(ctx, room, joinedBy(bot.UserID))
	withheld := alice.SendTextWithheldFrom(room, "Said before the kick", bot.UserID)
	alice.AwaitDecrypted(ctx, room, noticeOf(bot.UserID))

	// The person removes the agent and asks it back; only then does the
	// key come. What was said to the ended membership is never answered.
	firstJoins := joinIDs(t, alice, room, bot.UserID)
	alice.Kick(room, bot.UserID)
	alice.Invite(room, bot.UserID)
	rejoined := func(typ string, content map[string]any, raw json.RawMessage) bool {
		var ev struct {
			EventID string `json:"event_id"`
		}
		_ = json.Unmarshal(raw, &ev)
		return joinedBy(bot.UserID)(typ, content, raw) && !slices.Contains(firstJoins, ev.EventID)
	}
	alice.AwaitDecrypted(ctx, room, rejoined)
	alice.ShareWithheldKeys(room)
	alice.SendText(room, "Said after the rejoin")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "Said after the rejoin"))

	// A restart sweeps every wait again: still one notice, no answer.
	d.stopCleanly(t)
	d = runInProcess(cfg)
	t.Cleanup(func() { d.stopCleanly(t) })
	alice.SendText(room, "After the restart")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "After the restart"))
	got := answersFrom(t, alice, room, bot.UserID)
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
	hs := dendrite.Start(t)
	bot := hs.Register(t, "keeper", "keeper-password-0c4e")
	alice := e2eeperson.New(t, hs, hs.Register(t, "alice", "alice-password"))
	dir := t.TempDir()
	d := runInProcess(writeEncryptedConfig(t, hs.URL, bot, "keeper", "keeper-api-token", dir))
	room := alice.CreateEncryptedRoom(bot.UserID)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice.AwaitDecrypted(ctx, room, joinedBy(bot.UserID))
	alice.SendText(room, "Before the backup")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "Before the backup"))

	storage := filepath.Join(dir, "storage")
	to := filepath.Join(t.TempDir(), "journal.backup")
	out, err := run(t, "backup", "-storage", storage, "-to", to)
	if err != nil || !strings.Contains(out, "(1 olm accounts) written to "+to+".crypto.db and verified") {
		t.Fatalf("backup beside the running daemon: %v\n%s", err, out)
	}
	d.stopCleanly(t)

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
	d = runInProcess(writeEncryptedConfig(t, hs.URL, bot, "keeper", "keeper-api-token", restored))
	t.Cleanup(func() { d.stopCleanly(t) })
	alice.SendText(room, "After the restore")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "After the restore"))
	got := answersFrom(t, alice, room, bot.UserID)
	if got["echo: Before the backup"] != 1 || got["echo: After the restore"] != 1 {
		t.Fatalf("answers = %v, want each message answered once across the restore", got)
	}
}

func TestMalformedCiphertextIsRecordedAndSkippedAndTheBacklogGoesOn(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "sturdy", "sturdy-password-2b8d")
	alice := e2eeperson.New(t, hs, hs.Register(t, "alice", "alice-password"))
	mallory := hs.User(t, hs.Register(t, "mallory", "mallory-password"))
	dir := t.TempDir()
	d := runInProcess(writeEncryptedConfig(t, hs.URL, bot, "sturdy", "sturdy-api-token", dir))
	t.Cleanup(func() { d.stopCleanly(t) })
	room := alice.CreateEncryptedRoom(bot.UserID)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice.AwaitDecrypted(ctx, room, joinedBy(bot.UserID))
	alice.Invite(room, mallory.UserID)
	mallory.Join(room)

	session := strings.Repeat("A", 43)
	bad := map[string]map[string]any{
		"missing fields":    {"algorithm": "m.megolm.v1.aes-sha2"},
		"unknown algorithm": {"algorithm": "m.rot13.v1", "ciphertext": "Uryyb", "session_id": session, "sender_key": "x", "device_id": "D"},
		"not base64": {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": strings.Repeat("!", 100),
			"session_id": session, "sender_key": "x", "device_id": "D"},
	}
	ids := map[string]string{}
	for what, content := range bad {
		ids[what] = mallory.Send(room, "m.room.encrypted", content)
	}
	// Well-formed ciphertext under a session nobody ever shared cannot be
	// told from a message whose key is late: it waits (never work) until
	// its deadline settles it.
	mallory.Send(room, "m.room.encrypted", map[string]any{"algorithm": "m.megolm.v1.aes-sha2",
		"ciphertext": strings.Repeat("Zm9v", 30), "session_id": session, "sender_key": "x", "device_id": "D"})
	alice.SendText(room, "Still heard")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "Still heard"))
	out, err := run(t, "status", "-storage", filepath.Join(dir, "storage"))
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if fields := statusLine(t, out, "sturdy@"+bot.UserID); fields[10] != "1" || fields[11] != "0" {
		t.Fatalf("status line %q: want 1 event awaiting its key and none undecryptable", fields)
	}
	log := d.log.String()
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
	hs := dendrite.Start(t)
	bot := hs.Register(t, "pgcipher", "pgcipher-password-4e2a")
	alice := e2eeperson.New(t, hs, hs.Register(t, "alice", "alice-password"))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pg.url"), []byte(dbURL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := writeEncryptedConfig(t, hs.URL, bot, "pgcipher", "pgcipher-api-token", dir, "database_url_file: ./pg.url\n")
	d := runInProcess(cfg)
	room := alice.CreateEncryptedRoom(bot.UserID)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice.AwaitDecrypted(ctx, room, joinedBy(bot.UserID))
	alice.SendText(room, "Hello, PostgreSQL")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "Hello, PostgreSQL"))
	d.stopCleanly(t)

	if _, err := os.Stat(filepath.Join(dir, "storage", "crypto.db")); !os.IsNotExist(err) {
		t.Fatalf("a crypto.db beside a PostgreSQL journal: %v", err)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	var accounts int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM crypto_account WHERE account_id = $1`, "pgcipher@"+bot.UserID).Scan(&accounts)
	_ = conn.Close(ctx)
	if err != nil || accounts != 1 {
		t.Fatalf("olm accounts in the database = %d, %v; want the agent's one", accounts, err)
	}

	d = runInProcess(cfg)
	t.Cleanup(func() { d.stopCleanly(t) })
	alice.SendText(room, "After the restart")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "After the restart"))
	got := answersFrom(t, alice, room, bot.UserID)
	if got["echo: Hello, PostgreSQL"] != 1 || got["echo: After the restart"] != 1 {
		t.Fatalf("answers = %v, want each message answered once", got)
	}
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
	hs := dendrite.Start(t)
	bot := hs.Register(t, "steady", "steady-password-8f3b")
	alice := e2eeperson.New(t, hs, hs.Register(t, "alice", "alice-password"))
	waker := hs.User(t, hs.Register(t, "waker", "waker-password"))
	dir := t.TempDir()
	storage := filepath.Join(dir, "storage")
	cfg := writeEncryptedConfig(t, hs.URL, bot, "steady", "steady-api-token", dir)
	d := runInProcess(cfg)
	room := alice.CreateEncryptedRoom(bot.UserID)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	alice.AwaitDecrypted(ctx, room, joinedBy(bot.UserID))
	alice.SendText(room, "First")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "First"))
	device, token := botSession(t, storage, "steady")
	before := devicesOf(t, hs.URL, token)

	d.stopCleanly(t)
	d = runInProcess(cfg)
	t.Cleanup(func() { d.stopCleanly(t) })
	alice.SendText(room, "After the restart")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "After the restart"))
	if again, _ := botSession(t, storage, "steady"); again != device {
		t.Fatalf("the restart moved the agent from device %s to %s", device, again)
	}

	// The session is signed out (on Dendrite that deletes the device and
	// its keys); a sync the waker wakes meets the refusal, and the daemon
	// logs in again on the same device and publishes its keys again.
	alice.Invite(room, waker.UserID)
	waker.Join(room)
	if code := apiCall(t, "POST", hs.URL+"/_matrix/client/v3/logout", token, "{}", nil); code != http.StatusOK {
		t.Fatalf("logout: status %d", code)
	}
	waker.SendText(room, "wake up")
	d.awaitLog(t, "Device keys uploaded", 1)
	alice.SendText(room, "After the re-login")
	alice.AwaitDecrypted(ctx, room, encryptedReply(bot.UserID, "After the re-login"))

	now, token := botSession(t, storage, "steady")
	if now != device {
		t.Fatalf("the re-login moved the agent from device %s to %s", device, now)
	}
	if after := devicesOf(t, hs.URL, token); !slices.Equal(after, before) {
		t.Fatalf("devices = %v after a restart and a re-login, want %v", after, before)
	}
	if signed, err := alice.DeviceIsCrossSigned(ctx, bot.UserID, device); err != nil || !signed {
		t.Fatalf("after the re-login the person's client sees device %s cross-signed: %t, %v", device, signed, err)
	}
	got := answersFrom(t, alice, room, bot.UserID)
	for _, q := range []string{"First", "After the restart", "After the re-login"} {
		if got["echo: "+q] != 1 {
			t.Fatalf("answers = %v, want %q answered once", got, q)
		}
	}
}
