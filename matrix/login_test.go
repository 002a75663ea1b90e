package matrix_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/matrix"
)

// storedSession reads the session file a login left.
func storedSession(t *testing.T, cfg matrix.Config) (userID, deviceID, token string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(cfg.StorageDir, "matrix", cfg.Agent+".session.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		UserID      string `json:"user_id"`
		DeviceID    string `json:"device_id"`
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return s.UserID, s.DeviceID, s.AccessToken
}

func TestAPasswordLoginIsReusedAfterARestartFromAPrivateSessionFile(t *testing.T) {
	acct := register(t)
	cfg := config(t, acct)
	first := login(t, cfg)
	if first.UserID() != acct.UserID || first.DeviceID() == "" {
		t.Fatalf("logged in as %s on device %q, want %s on a device", first.UserID(), first.DeviceID(), acct.UserID)
	}
	dir := filepath.Join(cfg.StorageDir, "matrix")
	path := filepath.Join(dir, "bot.session.json")
	for p, want := range map[string]os.FileMode{dir: 0o700, path: 0o600} {
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Mode().Perm(); got != want {
			t.Errorf("%s mode = %o, want %o", p, got, want)
		}
	}
	userID, deviceID, token := storedSession(t, cfg)
	if userID != acct.UserID || deviceID != first.DeviceID() || token == "" {
		t.Fatalf("session file = %s on %q (token set: %t), want %s on %s", userID, deviceID, token != "", acct.UserID, first.DeviceID())
	}

	restarted := login(t, cfg)
	if restarted.DeviceID() != first.DeviceID() || restarted.DeviceChanged() {
		t.Errorf("after a restart: device %s (changed: %t), want %s", restarted.DeviceID(), restarted.DeviceChanged(), first.DeviceID())
	}
	// A new password login would have issued a new token.
	if _, _, again := storedSession(t, cfg); again != token {
		t.Errorf("the restart replaced the stored token instead of reusing it")
	}
	if _, device, err := restarted.WhoAmI(t.Context()); err != nil || device != first.DeviceID() {
		t.Errorf("whoami after the restart = %q, %v; want %s", device, err, first.DeviceID())
	}
}

// Dendrite deletes a device on logout, yet a password login naming the
// stored device ID brings the same ID back: the agent keeps its device,
// whether its token is refused while it runs or at the next start.
func TestARevokedTokenIsReplacedByAPasswordLoginOnTheSameDevice(t *testing.T) {
	acct := register(t)
	cfg := config(t, acct)
	first := login(t, cfg)
	_, _, revoked := storedSession(t, cfg)
	logout(t, revoked)
	// Refused while running: the client logs in again and is answered.
	if _, device, err := first.WhoAmI(t.Context()); err != nil || device != first.DeviceID() {
		t.Fatalf("whoami after the revocation = %s, %v; want %s after a new login", device, err, first.DeviceID())
	}
	if first.Session() != 1 || first.DeviceChanged() {
		t.Errorf("session %d (device changed: %t), want one re-login on the same device", first.Session(), first.DeviceChanged())
	}
	_, deviceID, token := storedSession(t, cfg)
	if token == revoked || deviceID != first.DeviceID() {
		t.Fatalf("session file kept the revoked token or lost the device (%s)", deviceID)
	}

	// Refused at the next start.
	logout(t, token)
	again := login(t, cfg)
	if again.DeviceID() != first.DeviceID() || again.DeviceChanged() {
		t.Errorf("after the revocation: device %s (changed: %t), want %s kept", again.DeviceID(), again.DeviceChanged(), first.DeviceID())
	}
	_, deviceID, latest := storedSession(t, cfg)
	if latest == token || deviceID != first.DeviceID() {
		t.Errorf("session file kept the revoked token or lost the device (%s)", deviceID)
	}
	if _, _, err := again.WhoAmI(t.Context()); err != nil {
		t.Errorf("whoami with the new token: %v", err)
	}
}

func TestADeviceChangeIsLoggedAndReported(t *testing.T) {
	acct := register(t)
	cfg := config(t, acct)
	first := login(t, cfg)
	_, _, firstToken := storedSession(t, cfg)

	// The operator configures a token of another device (the one
	// registration made): the agent now sends from that device.
	var logs bytes.Buffer
	cfg.AccessToken, cfg.Log = acct.AccessToken, zerolog.New(&logs)
	moved := login(t, cfg)
	if moved.DeviceID() != acct.DeviceID || !moved.DeviceChanged() {
		t.Fatalf("device %s (changed: %t), want %s reported as a change", moved.DeviceID(), moved.DeviceChanged(), acct.DeviceID)
	}
	var record map[string]any
	if err := json.Unmarshal(logs.Bytes(), &record); err != nil {
		t.Fatalf("log %q: %v", logs.String(), err)
	}
	if record["level"] != "warn" || record["agent"] != "bot" || record["old_device_id"] != first.DeviceID() || record["device_id"] != acct.DeviceID {
		t.Errorf("log record = %v, want a warning naming agent, old_device_id %s and device_id %s", record, first.DeviceID(), acct.DeviceID)
	}
	for _, secret := range []string{acct.Password, acct.AccessToken, firstToken} {
		if secret != "" && strings.Contains(logs.String(), secret) {
			t.Errorf("the log carries a secret")
		}
	}
	if _, deviceID, _ := storedSession(t, cfg); deviceID != acct.DeviceID {
		t.Errorf("session file names device %s, want %s", deviceID, acct.DeviceID)
	}
	if restarted := login(t, cfg); restarted.DeviceChanged() {
		t.Errorf("the next start reports the change again")
	}
}

func TestATokenOnlyConfig(t *testing.T) {
	acct := register(t)
	t.Run("OK", func(t *testing.T) {
		cfg := config(t, acct)
		cfg.Password, cfg.AccessToken = "", acct.AccessToken
		c := login(t, cfg)
		if c.DeviceID() != acct.DeviceID {
			t.Errorf("device %s, want the token's %s", c.DeviceID(), acct.DeviceID)
		}
		if _, deviceID, _ := storedSession(t, cfg); deviceID != acct.DeviceID {
			t.Errorf("session file names device %s, want %s", deviceID, acct.DeviceID)
		}
	})
	t.Run("ErrInvalidToken", func(t *testing.T) {
		cfg := config(t, acct)
		cfg.Password, cfg.AccessToken = "", "syt_not_a_real_token_0123"
		_, err := matrix.Login(t.Context(), cfg)
		if !errors.Is(err, matrix.ErrInvalidToken) {
			t.Fatalf("login with a bad token and no password: %v, want ErrInvalidToken", err)
		}
		if strings.Contains(err.Error(), cfg.AccessToken) {
			t.Errorf("error %q carries the token", err)
		}
		if _, err := os.Stat(filepath.Join(cfg.StorageDir, "matrix")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused login wrote a session: %v", err)
		}
	})
	t.Run("ErrWrongUser", func(t *testing.T) {
		other := register(t)
		cfg := config(t, acct)
		cfg.Password, cfg.AccessToken = "", other.AccessToken
		if _, err := matrix.Login(t.Context(), cfg); !errors.Is(err, matrix.ErrWrongUser) {
			t.Fatalf("login with another user's token: %v, want ErrWrongUser", err)
		}
	})
}

func TestABadPasswordIsAForbiddenLogin(t *testing.T) {
	acct := register(t)
	cfg := config(t, acct)
	cfg.Password = "wrong-password"
	_, err := matrix.Login(t.Context(), cfg)
	var he *matrix.HTTPError
	if !errors.As(err, &he) || he.Status != 403 || he.ErrCode != "M_FORBIDDEN" {
		t.Fatalf("login with a wrong password: %v, want HTTP 403 M_FORBIDDEN", err)
	}
	if strings.Contains(err.Error(), cfg.Password) {
		t.Errorf("error %q carries the password", err)
	}
}

func TestAConfigNeverPrintsItsSecrets(t *testing.T) {
	// A homeserver URL may carry a password too, readable or not.
	for _, hs := range []string{"http://hs", "https://bot:url-secret@hs", "https://bot:url%zzsecret@hs"} {
		cfg := matrix.Config{Homeserver: hs, UserID: "@bot:hs", Agent: "bot",
			Password: "hunter2-password", AccessToken: "syt_secret_token"}
		js, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, out := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), string(js)} {
			for _, secret := range []string{cfg.Password, cfg.AccessToken, "url-secret", "url%zzsecret"} {
				if strings.Contains(out, secret) {
					t.Errorf("%q carries a secret", out)
				}
			}
		}
	}
}

func TestALoginNeedsAUsableConfig(t *testing.T) {
	base := matrix.Config{Homeserver: hs.URL, UserID: "@bot:localhost", Agent: "bot", StorageDir: t.TempDir(), Password: "p"}
	for name, mutate := range map[string]func(*matrix.Config){
		"NoCredentials": func(c *matrix.Config) { c.Password = "" },
		"NoStorage":     func(c *matrix.Config) { c.StorageDir = "" },
		"BadAgent":      func(c *matrix.Config) { c.Agent = "../bot" },
		"BadUser":       func(c *matrix.Config) { c.UserID = "bot" },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := base
			mutate(&cfg)
			if _, err := matrix.Login(t.Context(), cfg); !errors.Is(err, matrix.ErrInvalidConfig) {
				t.Errorf("login: %v, want ErrInvalidConfig", err)
			}
		})
	}
}
