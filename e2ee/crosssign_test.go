package e2ee_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/crypto/olm"
	"maunium.net/go/mautrix/crypto/ssss"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
	"github.com/mindroomd/mindroomd/testsupport/logbuf"
)

// accounts numbers the accounts registered on the shared server, whose
// localparts must differ between tests.
var accounts atomic.Int64

// register makes an account named after name, unique on the server.
func register(t *testing.T, name string) dendrite.Account {
	t.Helper()
	localpart := fmt.Sprintf("%s-%d", name, accounts.Add(1))
	return hs.Register(t, localpart, localpart+"-password")
}

// deadline bounds one test's requests.
func deadline(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// agent is one start of the bot: its login, crypto store and machine.
type agent struct {
	mach  *e2ee.Machine
	store *e2ee.Store
	log   *logbuf.Buffer
	once  sync.Once
}

// start logs acct in with the session file under dir (the device of the
// last start there, a new device in a new dir), opens the crypto store in
// dir and makes the machine, as the daemon's start does. hc carries the
// requests; nil is a plain client. The agent stops when the test ends.
func start(t *testing.T, acct dendrite.Account, dir string, hc *http.Client) *agent {
	t.Helper()
	ctx := deadline(t)
	client, err := matrix.Login(ctx, matrix.Config{
		Homeserver: hs.URL, UserID: acct.UserID, Password: acct.Password, Agent: "bot", StorageDir: dir, HTTPClient: hc,
	})
	if err != nil {
		t.Fatalf("log in: %v", err)
	}
	store, err := e2ee.OpenSQLite(ctx, filepath.Join(dir, e2ee.FileName))
	if err != nil {
		t.Fatalf("open crypto store: %v", err)
	}
	a := &agent{store: store, log: &logbuf.Buffer{}}
	a.mach, err = store.Machine(ctx, e2ee.Options{
		Account: "bot@" + acct.UserID, Client: client, PickleKey: []byte("k"), Log: zerolog.New(a.log),
	})
	if err != nil {
		store.Close()
		t.Fatalf("make machine: %v", err)
	}
	t.Cleanup(a.stop)
	return a
}

// stop closes the machine and its store, once.
func (a *agent) stop() {
	a.once.Do(func() {
		a.mach.Close()
		a.store.Close()
	})
}

// crossSign runs CrossSign with no error expected.
func (a *agent) crossSign(t *testing.T, o e2ee.CrossSignOptions) e2ee.CrossSignStatus {
	t.Helper()
	st, err := a.mach.CrossSign(deadline(t), o)
	if err != nil {
		t.Fatalf("cross-sign: %v", err)
	}
	return st
}

// crossSigned reports whether the person's client sees device of user as
// cross-signed by its owner.
func crossSigned(t *testing.T, p *e2eeperson.Person, user, device string) bool {
	t.Helper()
	signed, err := p.DeviceIsCrossSigned(deadline(t), user, device)
	if err != nil {
		t.Fatalf("is device %s cross-signed: %v", device, err)
	}
	return signed
}

// mx is a mautrix client on acct's registration device, for reading what
// the homeserver holds for the account.
func mx(t *testing.T, acct dendrite.Account) *mautrix.Client {
	t.Helper()
	cli, err := mautrix.NewClient(hs.URL, id.UserID(acct.UserID), acct.AccessToken)
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

// masterKey is the account's published master key, "" for none.
func masterKey(t *testing.T, acct dendrite.Account) id.Ed25519 {
	t.Helper()
	user := id.UserID(acct.UserID)
	resp, err := mx(t, acct).QueryKeys(deadline(t), &mautrix.ReqQueryKeys{DeviceKeys: mautrix.DeviceKeysRequest{user: {}}})
	if err != nil {
		t.Fatalf("query keys: %v", err)
	}
	master, ok := resp.MasterKeys[user]
	if !ok {
		return ""
	}
	return master.FirstKey()
}

// storedMasterKey opens the account's secret storage with the recovery
// key file's text (its line ending trimmed) as mautrix's ssss package
// reads it and returns the public half of the master key stored there.
func storedMasterKey(t *testing.T, acct dendrite.Account, recoveryKey string) id.Ed25519 {
	t.Helper()
	ctx := deadline(t)
	storage := ssss.NewSSSSMachine(mx(t, acct))
	keyID, meta, err := storage.GetDefaultKeyData(ctx)
	if err != nil {
		t.Fatalf("read the default secret storage key: %v", err)
	}
	key, err := meta.VerifyRecoveryKey(keyID, strings.TrimSpace(recoveryKey))
	if err != nil {
		t.Fatalf("the recovery key does not open secret storage: %v", err)
	}
	seed, err := storage.GetDecryptedAccountData(ctx, event.AccountDataCrossSigningMaster, key)
	if err != nil {
		t.Fatalf("read the master key from secret storage: %v", err)
	}
	signing, err := olm.NewPKSigningFromSeed(seed)
	if err != nil {
		t.Fatalf("the stored master key: %v", err)
	}
	return signing.PublicKey()
}

// readFile returns a file's text.
func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// assertNoSecret fails the test if text quotes a secret, spaced or not.
func assertNoSecret(t *testing.T, what, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		compact := strings.ReplaceAll(strings.TrimSpace(s), " ", "")
		if strings.Contains(text, strings.TrimSpace(s)) || strings.Contains(strings.ReplaceAll(text, " ", ""), compact) {
			t.Errorf("%s quotes a secret: %s", what, text)
		}
	}
}

// bootstrap gives acct cross-signing from a first agent in a directory of
// its own, and returns the recovery key file.
func bootstrap(t *testing.T, acct dendrite.Account) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "recovery-key")
	st := start(t, acct, t.TempDir(), nil).crossSign(t, e2ee.CrossSignOptions{RecoveryKeyFile: file, Password: acct.Password})
	if !st.Bootstrapped || !st.CrossSigned {
		t.Fatalf("bootstrap: %+v", st)
	}
	return file
}

// elementForm is a recovery key file as Element shows the key: 48 base58
// characters in groups of four, a line of its own.
var elementForm = regexp.MustCompile(`^Es[1-9A-HJ-NP-Za-km-z]{2}( [1-9A-HJ-NP-Za-km-z]{4}){11}\n$`)

func TestBootstrapWithAPasswordCrossSignsTheDeviceAndWritesTheRecoveryKey(t *testing.T) {
	bot := register(t, "bot")
	alice := e2eeperson.New(t, hs, register(t, "alice"))
	a := start(t, bot, t.TempDir(), nil)
	if crossSigned(t, alice, bot.UserID, a.mach.DeviceID()) {
		t.Fatal("the bot's device reads as cross-signed before CrossSign")
	}
	file := filepath.Join(t.TempDir(), "keys", "recovery-key")

	st := a.crossSign(t, e2ee.CrossSignOptions{RecoveryKeyFile: file, Password: bot.Password})
	if !st.CrossSigned || !st.Bootstrapped || st.Reason != "" {
		t.Errorf("status %+v, want cross-signed and bootstrapped with no reason", st)
	}
	if !crossSigned(t, alice, bot.UserID, a.mach.DeviceID()) {
		t.Error("alice's client does not see the bot's device as cross-signed")
	}
	info, err := os.Stat(file)
	if err != nil {
		t.Fatalf("recovery key file: %v", err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("recovery key file mode %v, want 0600", info.Mode().Perm())
	}
	recovery := readFile(t, file)
	if !elementForm.MatchString(recovery) {
		t.Errorf("the recovery key file does not hold one key in Element's form (twelve groups of base58): %d bytes", len(recovery))
	}
	if stored, published := storedMasterKey(t, bot, recovery), masterKey(t, bot); stored != published {
		t.Errorf("secret storage under the file's recovery key holds master key %s, the account publishes %s", stored, published)
	}
	assertNoSecret(t, "the log", a.log.String(), bot.Password, recovery)
}

func TestARestartBootstrapsNothingAndStaysCrossSigned(t *testing.T) {
	bot := register(t, "bot")
	alice := e2eeperson.New(t, hs, register(t, "alice"))
	dir := t.TempDir()
	file := filepath.Join(t.TempDir(), "recovery-key")
	first := start(t, bot, dir, nil)
	first.crossSign(t, e2ee.CrossSignOptions{RecoveryKeyFile: file, Password: bot.Password})
	master, recovery := masterKey(t, bot), readFile(t, file)
	first.stop()

	again := start(t, bot, dir, nil)
	if again.mach.DeviceID() != first.mach.DeviceID() {
		t.Fatalf("the restart is on device %s, not %s", again.mach.DeviceID(), first.mach.DeviceID())
	}
	st := again.crossSign(t, e2ee.CrossSignOptions{RecoveryKeyFile: file, Password: bot.Password})
	if !st.CrossSigned || st.Bootstrapped || st.Reason != "" {
		t.Errorf("status %+v, want cross-signed, not bootstrapped, no reason", st)
	}
	if now := masterKey(t, bot); now != master {
		t.Errorf("the master key changed from %s to %s", master, now)
	}
	if now := readFile(t, file); now != recovery {
		t.Error("the recovery key file changed")
	}
	if !crossSigned(t, alice, bot.UserID, again.mach.DeviceID()) {
		t.Error("alice's client does not see the restarted bot's device as cross-signed")
	}
	if strings.Contains(again.log.String(), `"level":"warn"`) {
		t.Errorf("the restart warned: %s", again.log.String())
	}
}

func TestANewDeviceIsCrossSignedThroughTheRecoveryKeyWithoutAPassword(t *testing.T) {
	bot := register(t, "bot")
	alice := e2eeperson.New(t, hs, register(t, "alice"))
	file := bootstrap(t, bot)
	master, recovery := masterKey(t, bot), readFile(t, file)

	// The session file and crypto store are lost: the login makes a new
	// device.
	fresh := start(t, bot, t.TempDir(), nil)
	if crossSigned(t, alice, bot.UserID, fresh.mach.DeviceID()) {
		t.Fatal("the new device reads as cross-signed before CrossSign")
	}
	st := fresh.crossSign(t, e2ee.CrossSignOptions{RecoveryKeyFile: file})
	if !st.CrossSigned || st.Bootstrapped || st.Reason != "" {
		t.Errorf("status %+v, want cross-signed, not bootstrapped, no reason", st)
	}
	if !crossSigned(t, alice, bot.UserID, fresh.mach.DeviceID()) {
		t.Error("alice's client does not see the new device as cross-signed")
	}
	if now := masterKey(t, bot); now != master {
		t.Errorf("the master key changed from %s to %s", master, now)
	}
	assertNoSecret(t, "the log", fresh.log.String(), recovery)
}

func TestWithoutPasswordOrRecoveryKeyTheStatusSaysWhatIsNeeded(t *testing.T) {
	bot := register(t, "bot")
	file := filepath.Join(t.TempDir(), "recovery-key")
	a := start(t, bot, t.TempDir(), nil)

	st := a.crossSign(t, e2ee.CrossSignOptions{RecoveryKeyFile: file})
	if st.CrossSigned || st.Bootstrapped {
		t.Errorf("status %+v, want neither cross-signed nor bootstrapped", st)
	}
	for _, want := range []string{"password", "recovery key", file} {
		if !strings.Contains(st.Reason, want) {
			t.Errorf("reason %q does not name %q", st.Reason, want)
		}
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a recovery key file was written without cross-signing keys (%v)", err)
	}
	if master := masterKey(t, bot); master != "" {
		t.Errorf("the account has master key %s, though there was no password to upload it", master)
	}
}

func TestKeysMadeElsewhereAreKeptAndTheStatusAsksForTheirRecoveryKey(t *testing.T) {
	bot := register(t, "bot")
	// A person set up cross-signing for the bot's account in their client.
	e2eeperson.New(t, hs, bot).CrossSignOwnDevice()
	master := masterKey(t, bot)
	file := filepath.Join(t.TempDir(), "recovery-key")
	a := start(t, bot, t.TempDir(), nil)

	st := a.crossSign(t, e2ee.CrossSignOptions{RecoveryKeyFile: file, Password: bot.Password})
	if st.CrossSigned || st.Bootstrapped {
		t.Errorf("status %+v, want neither cross-signed nor bootstrapped", st)
	}
	for _, want := range []string{"recovery key", file} {
		if !strings.Contains(st.Reason, want) {
			t.Errorf("reason %q does not name %q", st.Reason, want)
		}
	}
	if now := masterKey(t, bot); now != master {
		t.Errorf("the account's master key was replaced: %s, then %s", master, now)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a recovery key file was written for keys made elsewhere (%v)", err)
	}
}

func TestAWrongRecoveryKeyIsRefusedWithoutQuotingIt(t *testing.T) {
	bot := register(t, "bot")
	alice := e2eeperson.New(t, hs, register(t, "alice"))
	bootstrap(t, bot)
	other, err := ssss.NewKey("")
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"another account's key": other.RecoveryKey(),
		"not a recovery key":    "correct horse battery staple",
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "recovery-key")
			if err := os.WriteFile(file, []byte(content+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			fresh := start(t, bot, t.TempDir(), nil)
			st, err := fresh.mach.CrossSign(deadline(t), e2ee.CrossSignOptions{RecoveryKeyFile: file})
			if !errors.Is(err, e2ee.ErrRefused) {
				t.Fatalf("CrossSign gave %+v, %v; want an error wrapping ErrRefused", st, err)
			}
			if !strings.Contains(err.Error(), file) {
				t.Errorf("the error does not name the file: %v", err)
			}
			assertNoSecret(t, "the error", err.Error(), content)
			assertNoSecret(t, "the log", fresh.log.String(), content)
			if crossSigned(t, alice, bot.UserID, fresh.mach.DeviceID()) {
				t.Error("the device reads as cross-signed after the refusal")
			}
		})
	}
}

func TestARestartWithoutAWorkingRecoveryKeyStaysCrossSignedAndWarns(t *testing.T) {
	other, err := ssss.NewKey("")
	if err != nil {
		t.Fatal(err)
	}
	for name, spoil := range map[string]func(file string) error{
		"a stale key": func(file string) error { return os.WriteFile(file, []byte(other.RecoveryKey()), 0o600) },
		"no file":     os.Remove,
	} {
		t.Run(name, func(t *testing.T) {
			bot := register(t, "bot")
			dir := t.TempDir()
			file := filepath.Join(t.TempDir(), "recovery-key")
			first := start(t, bot, dir, nil)
			first.crossSign(t, e2ee.CrossSignOptions{RecoveryKeyFile: file, Password: bot.Password})
			first.stop()
			if err := spoil(file); err != nil {
				t.Fatal(err)
			}

			again := start(t, bot, dir, nil)
			st := again.crossSign(t, e2ee.CrossSignOptions{RecoveryKeyFile: file})
			if !st.CrossSigned || st.Bootstrapped {
				t.Errorf("status %+v, want cross-signed, not bootstrapped", st)
			}
			log := again.log.String()
			for _, want := range []string{`"level":"warn"`, "new device", file} {
				if !strings.Contains(log, want) {
					t.Errorf("no warning naming %q that the recovery key would not sign a new device: %s", want, log)
				}
			}
			assertNoSecret(t, "the log", log, other.RecoveryKey())
			if _, err := os.Stat(file); name == "no file" && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a recovery key file was written for keys already in use (%v)", err)
			}
		})
	}
}

func TestABootstrapTheHomeserverRefusedResumesUnderTheSameRecoveryKey(t *testing.T) {
	bot := register(t, "bot")
	alice := e2eeperson.New(t, hs, register(t, "alice"))
	dir := t.TempDir()
	file := filepath.Join(t.TempDir(), "recovery-key")
	const wrong = "not-the-password-7f3a"
	first := start(t, bot, dir, nil)
	st, err := first.mach.CrossSign(deadline(t), e2ee.CrossSignOptions{RecoveryKeyFile: file, Password: wrong})
	if err == nil {
		t.Fatalf("a wrong password bootstrapped: %+v", st)
	}
	assertNoSecret(t, "the error", err.Error(), wrong)
	assertNoSecret(t, "the log", first.log.String(), wrong)
	if master := masterKey(t, bot); master != "" {
		t.Fatalf("the homeserver took master key %s with a wrong password", master)
	}
	// The recovery key was written before the upload, so no published
	// keys can ever lack it.
	recovery := readFile(t, file)
	first.stop()

	again := start(t, bot, dir, nil)
	st = again.crossSign(t, e2ee.CrossSignOptions{RecoveryKeyFile: file, Password: bot.Password})
	if !st.CrossSigned || !st.Bootstrapped {
		t.Errorf("status %+v, want cross-signed and bootstrapped", st)
	}
	if now := readFile(t, file); now != recovery {
		t.Error("the recovery key file was replaced")
	}
	if stored, published := storedMasterKey(t, bot, recovery), masterKey(t, bot); stored != published {
		t.Errorf("secret storage under the file's recovery key holds master key %s, the account publishes %s", stored, published)
	}
	if !crossSigned(t, alice, bot.UserID, again.mach.DeviceID()) {
		t.Error("alice's client does not see the bot's device as cross-signed")
	}
}

// ssoOnly answers the homeserver's auth for cross-signing keys as a
// server whose accounts live with an identity provider does: no password
// stage.
type ssoOnly struct{ next http.RoundTripper }

func (s ssoOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized || !strings.HasSuffix(req.URL.Path, "/keys/device_signing/upload") {
		return resp, err
	}
	resp.Body.Close()
	body, _ := json.Marshal(map[string]any{"session": "s", "flows": []map[string]any{{"stages": []string{"m.login.sso"}}}})
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Del("Content-Length")
	return resp, nil
}

func TestAHomeserverThatAsksForNoPasswordLeavesAReason(t *testing.T) {
	bot := register(t, "bot")
	file := filepath.Join(t.TempDir(), "recovery-key")
	a := start(t, bot, t.TempDir(), &http.Client{Transport: ssoOnly{next: http.DefaultTransport}})

	st := a.crossSign(t, e2ee.CrossSignOptions{RecoveryKeyFile: file, Password: bot.Password})
	if st.CrossSigned || st.Bootstrapped {
		t.Errorf("status %+v, want neither cross-signed nor bootstrapped", st)
	}
	for _, want := range []string{"single sign-on", file} {
		if !strings.Contains(st.Reason, want) {
			t.Errorf("reason %q does not name %q", st.Reason, want)
		}
	}
	if master := masterKey(t, bot); master != "" {
		t.Errorf("the account has master key %s", master)
	}
}

func TestCrossSignOptionsPrintWithoutThePassword(t *testing.T) {
	o := e2ee.CrossSignOptions{RecoveryKeyFile: "/secrets/recovery-key", Password: "hunter2-e9c1"}
	js, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{fmt.Sprint(o), fmt.Sprintf("%+v", o), fmt.Sprintf("%#v", o), fmt.Sprintf("%v", &o), string(js)} {
		if strings.Contains(text, o.Password) {
			t.Errorf("printed with the password: %s", text)
		}
	}
}
