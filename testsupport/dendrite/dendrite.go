// Package dendrite runs a real Matrix homeserver for tests: Dendrite, built
// once into the project's .cache/bin by `make dendrite`, started on a free
// loopback port with SQLite databases in a temporary directory, federation
// off and accounts made through the shared-secret registration endpoint.
//
// A missing binary fails the test: a test that needs a homeserver and
// silently skips without one would pass without proving anything.
package dendrite

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v3"
)

// ServerName is the homeserver's name: user IDs are @localpart:localhost.
const ServerName = "localhost"

const (
	// startTimeout bounds one start. Dendrite answers in about half a
	// second; the margin is for a machine busy with other builds.
	startTimeout = 60 * time.Second
	// stopGrace is how long a stop waits after SIGTERM before SIGKILL.
	stopGrace = 10 * time.Second
	// startAttempts covers the one race a free port has: another process
	// taking it between our probe and Dendrite's bind.
	startAttempts = 3
	// requestTimeout bounds one harness request to the server.
	requestTimeout = 30 * time.Second
	// logTail is how many lines of the server's log a failed test prints.
	logTail = 60
)

// Server is a running Dendrite.
type Server struct {
	// URL is the client-server API base, http://127.0.0.1:PORT.
	URL string
	// Dir holds the config, keys, databases and the server's log.
	Dir string
	// StartTime is how long the last start took, from exec to the first
	// answer of /_matrix/client/versions.
	StartTime time.Duration

	secret  string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	http    *http.Client
}

// Start runs Dendrite in a directory of tb's and stops it when the test
// ends. If the test failed, the tail of the server's log is printed.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s, err := Launch(tb.TempDir())
	if err != nil {
		tb.Fatalf("start dendrite: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("dendrite log (%s), last lines:\n%s", s.logPath, s.LogTail(logTail))
		}
		if err := s.Stop(); err != nil {
			tb.Errorf("stop dendrite: %v", err)
		}
	})
	return s
}

// Launch runs Dendrite in dir, which must exist. It is Start for a caller
// without a testing.TB (a TestMain sharing one server across a package),
// which must call Stop. On error the server is not running and the error
// carries the tail of its log.
func Launch(dir string) (*Server, error) {
	bins, err := binDir()
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, logPath: filepath.Join(dir, "dendrite.log"), http: &http.Client{Timeout: requestTimeout}}
	if s.secret, err = randomHex(32); err != nil {
		return nil, err
	}
	if err := s.configure(bins); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		err = s.start(bins)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errExited) || attempt == startAttempts {
			return nil, fmt.Errorf("%w\n%s", err, s.LogTail(logTail))
		}
	}
}

// errExited reports a server that exited while starting, such as one that
// lost its port to another process.
var errExited = errors.New("dendrite exited while starting")

// binDir finds .cache/bin at the module's root, above the test's working
// directory (a package directory), and checks the binaries are there.
func binDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
	bins := filepath.Join(dir, ".cache", "bin")
	for _, name := range []string{"dendrite", "generate-keys", "generate-config"} {
		if _, err := os.Stat(filepath.Join(bins, name)); err != nil {
			return "", fmt.Errorf("dendrite is not built (run `make dendrite`): %w", err)
		}
	}
	return bins, nil
}

// configure writes the signing key and dendrite.yaml into s.Dir.
func (s *Server) configure(bins string) error {
	keys := exec.Command(filepath.Join(bins, "generate-keys"), "--private-key", "matrix_key.pem")
	keys.Dir = s.Dir
	if out, err := keys.CombinedOutput(); err != nil {
		return fmt.Errorf("generate keys: %w: %s", err, out)
	}
	gen := exec.Command(filepath.Join(bins, "generate-config"), "-dir", s.Dir, "-server", ServerName)
	gen.Dir = s.Dir
	var stderr bytes.Buffer
	gen.Stderr = &stderr
	generated, err := gen.Output()
	if err != nil {
		return fmt.Errorf("generate config: %w: %s", err, stderr.Bytes())
	}
	cfg, err := editConfig(generated, s.secret)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.Dir, "dendrite.yaml"), cfg, 0o600)
}

// settings are the changes made to the generated config: a closed test
// server with no federation, registration only through the shared secret,
// no rate limits (tests send in bursts), no key servers to ask, cheap
// password hashes, the NATS stream in memory and the log on stderr (which
// the harness captures into dendrite.log).
func settings(secret string) map[string]any {
	return map[string]any{
		"global.disable_federation":             true,
		"global.jetstream.in_memory":            true,
		"global.presence.enable_inbound":        false,
		"global.presence.enable_outbound":       false,
		"client_api.registration_shared_secret": secret,
		"client_api.rate_limiting.enabled":      false,
		"federation_api.key_perspectives":       []any{},
		"user_api.bcrypt_cost":                  4,
		"logging":                               []any{map[string]any{"type": "std", "level": "info"}},
	}
}

// editConfig applies settings to the generated YAML. Every key must already
// exist, so a Dendrite whose config layout moved fails here rather than
// running with a setting silently ignored. It also checks that every
// database is a SQLite file.
func editConfig(generated []byte, secret string) ([]byte, error) {
	var cfg map[string]any
	if err := yaml.Unmarshal(generated, &cfg); err != nil {
		return nil, fmt.Errorf("read generated config: %w", err)
	}
	for path, value := range settings(secret) {
		keys := strings.Split(path, ".")
		m := cfg
		for _, k := range keys[:len(keys)-1] {
			next, ok := m[k].(map[string]any)
			if !ok {
				return nil, fmt.Errorf("generated config has no %q", path)
			}
			m = next
		}
		if _, ok := m[keys[len(keys)-1]]; !ok {
			return nil, fmt.Errorf("generated config has no %q", path)
		}
		m[keys[len(keys)-1]] = value
	}
	if err := checkSQLite(cfg, ""); err != nil {
		return nil, err
	}
	return yaml.Marshal(cfg)
}

// checkSQLite refuses any database connection string that is not a
// SQLite file (an empty global default is fine: each component names its
// own).
func checkSQLite(m map[string]any, path string) error {
	for k, v := range m {
		sub, ok := v.(map[string]any)
		if !ok {
			continue
		}
		if k == "database" {
			conn, _ := sub["connection_string"].(string)
			if conn != "" && !strings.HasPrefix(conn, "file:") {
				return fmt.Errorf("config %s%s is not a SQLite file: %q", path, k, conn)
			}
		}
		if err := checkSQLite(sub, path+k+"."); err != nil {
			return err
		}
	}
	return nil
}

// start runs the server on a free port and waits for it to answer.
func (s *Server) start(bins string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(filepath.Join(bins, "dendrite"),
		"--config", filepath.Join(s.Dir, "dendrite.yaml"), "--http-bind-address", addr)
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec dendrite: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited, s.URL = cmd, exited, "http://"+addr
	if err := s.awaitReady(began); err != nil {
		if !errors.Is(err, errExited) {
			_ = s.Stop()
		}
		return err
	}
	return nil
}

// awaitReady polls /_matrix/client/versions until it answers 200, the
// process exits or the start deadline passes.
func (s *Server) awaitReady(began time.Time) error {
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	probe := &http.Client{Timeout: time.Second}
	for {
		resp, err := probe.Get(s.URL + "/_matrix/client/versions")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				s.StartTime = time.Since(began)
				return nil
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("%w: %s", errExited, s.cmd.ProcessState)
		case <-deadline.C:
			return fmt.Errorf("dendrite did not answer on %s within %s", s.URL, startTimeout)
		case <-tick.C:
		}
	}
}

// Stop ends the server: SIGTERM, then SIGKILL if it has not exited after a
// grace period. Stopping a stopped server does nothing.
func (s *Server) Stop() error {
	if s.cmd == nil {
		return nil
	}
	select {
	case <-s.exited:
		return nil
	default:
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal dendrite: %w", err)
	}
	grace := time.NewTimer(stopGrace)
	defer grace.Stop()
	select {
	case <-s.exited:
		return nil
	case <-grace.C:
	}
	if err := s.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill dendrite: %w", err)
	}
	<-s.exited
	return fmt.Errorf("dendrite ignored SIGTERM for %s and was killed", stopGrace)
}

// LogTail returns the last n lines of the server's log.
func (s *Server) LogTail(n int) string {
	data, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// Account is a registered user's credentials.
type Account struct {
	UserID      string
	Password    string
	AccessToken string
	DeviceID    string
}

// Register creates a user through the shared-secret registration endpoint
// and returns its first device's credentials.
func (s *Server) Register(tb testing.TB, localpart, password string) Account {
	tb.Helper()
	acct, err := s.RegisterAccount(tb.Context(), localpart, password)
	if err != nil {
		tb.Fatalf("register %s: %v", localpart, err)
	}
	return acct
}

// RegisterAccount is Register for a caller without a testing.TB (the demo).
func (s *Server) RegisterAccount(ctx context.Context, localpart, password string) (Account, error) {
	const endpoint = "/_synapse/admin/v1/register"
	var nonce struct {
		Nonce string `json:"nonce"`
	}
	if err := s.call(ctx, http.MethodGet, endpoint, nil, &nonce); err != nil {
		return Account{}, fmt.Errorf("nonce: %w", err)
	}
	mac := hmac.New(sha1.New, []byte(s.secret))
	mac.Write([]byte(nonce.Nonce + "\x00" + localpart + "\x00" + password + "\x00notadmin"))
	req := map[string]any{
		"nonce": nonce.Nonce, "username": localpart, "password": password, "admin": false,
		"mac": hex.EncodeToString(mac.Sum(nil)),
	}
	var resp struct {
		UserID      string `json:"user_id"`
		AccessToken string `json:"access_token"`
		DeviceID    string `json:"device_id"`
	}
	if err := s.call(ctx, http.MethodPost, endpoint, req, &resp); err != nil {
		return Account{}, err
	}
	if resp.UserID == "" || resp.AccessToken == "" || resp.DeviceID == "" {
		return Account{}, errors.New("registration answered without user, token or device")
	}
	return Account{UserID: resp.UserID, Password: password, AccessToken: resp.AccessToken, DeviceID: resp.DeviceID}, nil
}

// call makes one unauthenticated JSON request to the server.
func (s *Server) call(ctx context.Context, method, path string, body, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, data)
	}
	return json.Unmarshal(data, out)
}
