package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/logbuf"
	"github.com/mindroomd/mindroomd/testsupport/modelstub"
)

// The secrets of the leak test. Each has characters that escaping and
// encoding change, so a leak in an escaped form differs from the
// verbatim one and is looked for too.
const (
	keeperPassword = "kp/Secret+Pass=4f1!q"
	keeperAPIToken = "keeper-api/tok+7d2="
	sageAPIToken   = "sage-api/tok+91c="
	sageAPIKey     = "sk-sage/key+3be=never-shown"
	// homeserverPassword rides in the homeserver URL's user information,
	// baseURLPassword in the model server's; both as a proxy in front of
	// them might ask.
	homeserverPassword = "hs-userinfo/pw+6a0="
	baseURLPassword    = "model-userinfo/pw+c52="
	// wrongPasswordDSN is the wrong password of the failed login: a
	// Postgres URL, as a mistaken paste of a database's connection string
	// would be, with the password wrongDSNPassword inside.
	wrongDSNPassword = "pg/Wrong+pw=e07"
	wrongPasswordDSN = "postgres://mindroom:" + wrongDSNPassword + "@db.internal:5432/journal?sslmode=disable"
	// configDSNPassword is in a Postgres URL written where the homeserver
	// or the model server's URL goes: the configuration refuses it without
	// showing it. It has no slash, so the URL parses and is refused for
	// its scheme.
	configDSNPassword = "pgConfig+pw=5d8~"
	refusedToken      = "syt_refused/token+000="
)

// leakForms are the spellings of secret a leak could take: verbatim,
// escaped for a URL, a JSON string or a Go string, and base64 or hex
// encoded.
func leakForms(secret string) map[string]string {
	j, _ := json.Marshal(secret)
	forms := map[string]string{
		"verbatim":      secret,
		"query-escaped": url.QueryEscape(secret),
		"path-escaped":  url.PathEscape(secret),
		"json-escaped":  string(j[1 : len(j)-1]),
		"go-quoted":     strconv.Quote(secret)[1 : len(strconv.Quote(secret))-1],
		"base64":        base64.StdEncoding.EncodeToString([]byte(secret)),
		"base64url":     base64.RawURLEncoding.EncodeToString([]byte(secret)),
		"hex":           hex.EncodeToString([]byte(secret)),
	}
	return forms
}

// transcript is everything the daemon and its commands showed: logs, error
// output, command output and API answers, each under a label.
type transcript struct{ parts []string }

func (tr *transcript) add(label, text string) {
	tr.parts = append(tr.parts, "=== "+label+"\n"+text)
}

// findLeaks fails the test for every form of every secret in the
// transcript.
func (tr *transcript) findLeaks(t *testing.T, secrets map[string]string) {
	t.Helper()
	all := strings.Join(tr.parts, "\n")
	for name, secret := range secrets {
		for form, s := range leakForms(secret) {
			if at := strings.Index(all, s); at >= 0 {
				t.Errorf("the %s is shown (%s) near: %q", name, form, all[max(0, at-200):min(len(all), at+len(s)+50)])
			}
		}
	}
}

// capture runs one command line in this process and returns its exit
// code, output and error output.
func capture(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code := execute(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// daemonRun is `mindroomd run` in this process with its output captured.
type daemonRun struct {
	*inProcess
	out *logbuf.Buffer
}

func startCaptured(cfg string) *daemonRun {
	ctx, cancel := context.WithCancel(context.Background())
	d := &daemonRun{inProcess: &inProcess{log: &logbuf.Buffer{}, done: make(chan int, 1), cancel: cancel}, out: &logbuf.Buffer{}}
	go func() { d.done <- execute(ctx, []string{"run", "-config", cfg}, d.out, d.log) }()
	return d
}

// exited waits for a daemon that stops by itself and returns its code.
func (d *daemonRun) exited(t *testing.T) int {
	t.Helper()
	select {
	case code := <-d.done:
		return code
	case <-time.After(2 * time.Minute):
		t.Fatalf("the daemon did not stop by itself; its log:\n%s", d.log)
		return -1
	}
}

// rawCall makes one API request and returns its status and body.
func rawCall(t *testing.T, method, target, auth, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, target, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, fmt.Sprintf("%d %v %s", resp.StatusCode, resp.Header, b)
}

// withUserinfo puts user and password into an http URL.
func withUserinfo(t *testing.T, raw, user, password string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

// writeFiles writes each file under dir, private to this user.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// No secret the daemon is given or handed shows in anything it writes:
// its log through a start, syncs, a turn the model refuses (echoing the
// API key back), refused API calls and a shutdown; a second start whose
// password login fails; a third whose access token is refused; the
// refusal of a configuration with a password in a URL; and the output and
// errors of status, export through the API (with a valid and a refused
// token) and export -offline. Checked verbatim and in escaped and encoded
// forms.
func TestNoSecretShowsInAnyLogErrorOrOutput(t *testing.T) {
	hs := dendrite.Start(t)
	keeper := hs.Register(t, "keeper", keeperPassword)
	sage := hs.Register(t, "sage", "sage-registration-password")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	keeperRoom := alice.CreateRoom(keeper.UserID)
	sageRoom := alice.CreateRoom(sage.UserID)
	asked := make(chan struct{}, 16)
	model := startModelStub(t, func(r modelstub.Request) modelstub.Reply {
		select {
		case asked <- struct{}{}:
		default:
		}
		// As some servers do: the refusal quotes the key it refused.
		return modelstub.Reply{Status: http.StatusUnauthorized,
			Text: "Incorrect API key provided: " + strings.TrimPrefix(r.Authorization, "Bearer ")}
	})

	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"keeper.password": keeperPassword + "\n", "keeper.api-token": keeperAPIToken + "\n",
		"sage.access-token": sage.AccessToken + "\n", "sage.api-token": sageAPIToken + "\n",
		"sage.api-key": sageAPIKey + "\n",
	})
	cfg := filepath.Join(dir, "mindroom.yaml")
	writeFiles(t, dir, map[string]string{"mindroom.yaml": fmt.Sprintf(`homeserver: %s
storage: ./storage
listen: 127.0.0.1:0
agents:
  - name: keeper
    user_id: "%s"
    password_file: keeper.password
    api_token_file: keeper.api-token
    auto_join: true
    backend:
      type: http
  - name: sage
    user_id: "%s"
    access_token_file: sage.access-token
    api_token_file: sage.api-token
    auto_join: true
    backend:
      type: openai
      base_url: %s
      model: stub-model
      api_key_file: sage.api-key
`, withUserinfo(t, hs.URL, "mindroom", homeserverPassword), keeper.UserID, sage.UserID,
		withUserinfo(t, model.URL, "mindroom", baseURLPassword))})
	secrets := map[string]string{
		"keeper's password":                  keeperPassword,
		"keeper's API token":                 keeperAPIToken,
		"sage's API token":                   sageAPIToken,
		"sage's access token":                sage.AccessToken,
		"sage's model API key":               sageAPIKey,
		"homeserver URL's password":          homeserverPassword,
		"homeserver URL's basic credentials": "mindroom:" + homeserverPassword,
		"model URL's password":               baseURLPassword,
		"model URL's basic credentials":      "mindroom:" + baseURLPassword,
		"wrong password (a Postgres URL)":    wrongPasswordDSN,
		"wrong Postgres URL's password":      wrongDSNPassword,
		"configured Postgres URL's password": configDSNPassword,
		"refused access token":               refusedToken,
	}
	var tr transcript

	// The first run: everything works but the model, which refuses.
	d := startCaptured(cfg)
	addr := daemonAddress(t, d.log)
	base := "http://" + addr + "/v1/agents/"
	question := alice.SendText(keeperRoom, "hello keeper")
	var page struct {
		Events []struct {
			EventID string `json:"event_id"`
		} `json:"events"`
	}
	for polls := 0; len(page.Events) == 0; polls++ {
		if polls == 4 {
			t.Fatalf("the message was not admitted in four long-polls; the log:\n%s", d.log)
		}
		if code := apiCall(t, http.MethodGet, base+"keeper/pending?wait=30s", keeperAPIToken, "", &page); code != http.StatusOK {
			t.Fatalf("pending: status %d", code)
		}
	}
	if page.Events[0].EventID != question {
		t.Fatalf("pending = %+v, want %s", page.Events, question)
	}
	for _, c := range []struct {
		method, path, auth, body string
		want                     int
	}{
		{http.MethodGet, "keeper/pending", "", "", http.StatusUnauthorized},
		{http.MethodGet, "keeper/pending", "Bearer " + keeperAPIToken + "x", "", http.StatusUnauthorized},
		{http.MethodGet, "keeper/pending", "Basic " + keeperAPIToken, "", http.StatusUnauthorized},
		{http.MethodGet, "keeper/pending", "Bearer " + sageAPIToken, "", http.StatusForbidden},
		{http.MethodGet, "sage/pending", "Bearer " + keeperAPIToken, "", http.StatusForbidden},
		{http.MethodPost, "keeper/events/" + question + "/reply", "Bearer " + keeperAPIToken, `{"body":5}`, http.StatusBadRequest},
		{http.MethodPost, "keeper/events/" + question + "/reply", "Bearer " + keeperAPIToken, `{"body":"kept safe"}`, http.StatusOK},
	} {
		code, shown := rawCall(t, c.method, base+c.path, c.auth, c.body)
		if code != c.want {
			t.Fatalf("%s %s: %s, want %d", c.method, c.path, shown, c.want)
		}
		tr.add("API "+c.method+" "+c.path, shown)
	}
	alice.SendText(sageRoom, "hello sage")
	select {
	case <-asked:
	case <-time.After(time.Minute):
		t.Fatalf("the model was never asked; the log:\n%s", d.log)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(d.log.String(), "Turn failed") {
		if time.Now().After(deadline) {
			t.Fatalf("the refused turn was never logged; the log:\n%s", d.log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	code, out, errOut := capture(t, "export", "-config", cfg, "-agent", "keeper", "-room", keeperRoom, "-api", "http://"+addr)
	if code != exitOK || !strings.Contains(out, "hello keeper") {
		t.Fatalf("export through the API: %d\n%s\n%s", code, out, errOut)
	}
	tr.add("export through the API", out+errOut)
	wrongToken := filepath.Join(dir, "wrong.token")
	writeFiles(t, dir, map[string]string{"wrong.token": "a-guess"})
	code, out, errOut = capture(t, "export", "-config", cfg, "-agent", "keeper", "-room", keeperRoom, "-api",
		"http://"+addr, "-token-file", wrongToken)
	if code != exitFailure || !strings.Contains(errOut, "401") {
		t.Fatalf("export with a wrong token: %d\n%s\n%s", code, out, errOut)
	}
	tr.add("export with a refused token", out+errOut)
	tr.add("metrics", metricsOf(t, d.log))
	if code := d.stop(t); code != exitOK {
		t.Fatalf("the first run exited %d; its log:\n%s", code, d.log)
	}
	tr.add("first run, log", d.log.String())
	tr.add("first run, output", d.out.String())
	storage := filepath.Join(dir, "storage")
	session := filepath.Join(storage, "matrix", "keeper.session.json")
	var stored struct {
		AccessToken string `json:"access_token"`
	}
	if b, err := os.ReadFile(session); err != nil || json.Unmarshal(b, &stored) != nil || stored.AccessToken == "" {
		t.Fatalf("keeper's session file: %v %s", err, b)
	}
	secrets["keeper's access token from its login"] = stored.AccessToken

	code, out, errOut = capture(t, "status", "-storage", storage)
	if code != exitOK || !strings.Contains(out, "keeper@"+keeper.UserID) {
		t.Fatalf("status: %d\n%s\n%s", code, out, errOut)
	}
	tr.add("status", out+errOut)
	code, out, errOut = capture(t, "export", "-config", cfg, "-agent", "keeper", "-room", keeperRoom, "-offline",
		"-format", "markdown")
	if code != exitOK || !strings.Contains(out, "hello keeper") {
		t.Fatalf("export -offline: %d\n%s\n%s", code, out, errOut)
	}
	tr.add("export -offline", out+errOut)

	// The second run: keeper's password is wrong, and no session is left
	// to spare the login.
	writeFiles(t, dir, map[string]string{"keeper.password": wrongPasswordDSN})
	if err := os.Remove(session); err != nil {
		t.Fatal(err)
	}
	d = startCaptured(cfg)
	if code := d.exited(t); code != exitFailure || !strings.Contains(d.log.String(), "log in with password") {
		t.Fatalf("the run with a wrong password exited %d; its log:\n%s", code, d.log)
	}
	tr.add("second run, log", d.log.String())
	tr.add("second run, output", d.out.String())

	// The third run: keeper logs in again; sage's access token is refused,
	// and its session's token, which would be tried next, is gone.
	writeFiles(t, dir, map[string]string{"keeper.password": keeperPassword, "sage.access-token": refusedToken})
	if err := os.Remove(filepath.Join(storage, "matrix", "sage.session.json")); err != nil {
		t.Fatal(err)
	}
	d = startCaptured(cfg)
	if code := d.exited(t); code != exitFailure || !strings.Contains(d.log.String(), "access token") {
		t.Fatalf("the run with a refused access token exited %d; its log:\n%s", code, d.log)
	}
	tr.add("third run, log", d.log.String())
	tr.add("third run, output", d.out.String())
	if b, err := os.ReadFile(session); err == nil && json.Unmarshal(b, &stored) == nil {
		secrets["keeper's access token from its second login"] = stored.AccessToken
	}

	// A configuration with a password in a URL is refused without it,
	// whether the URL parses or not.
	dsn := "postgres://mindroom:" + configDSNPassword + "@db.internal:5432/journal"
	for i, c := range []struct{ homeserver, baseURL, field string }{
		{dsn, "", "homeserver"},
		{"http://mindroom:" + configDSNPassword + "@[::1", "", "homeserver"},
		{"http://mindroom:" + configDSNPassword + "@", "", "homeserver"},
		{hs.URL, dsn, "agents[0].backend.base_url"},
		{hs.URL, "http://mindroom:" + configDSNPassword + "@%zz/v1", "agents[0].backend.base_url"},
	} {
		backend := "{type: echo}"
		if c.baseURL != "" {
			backend = fmt.Sprintf("{type: openai, model: m, base_url: %q}", c.baseURL)
		}
		name := fmt.Sprintf("bad%d.yaml", i)
		writeFiles(t, dir, map[string]string{name: fmt.Sprintf("homeserver: %q\nstorage: ./storage\n"+
			"agents:\n  - name: keeper\n    user_id: \"%s\"\n    password_file: keeper.password\n    backend: %s\n",
			c.homeserver, keeper.UserID, backend)})
		code, out, errOut := capture(t, "run", "-config", filepath.Join(dir, name))
		if code != exitConfig || !strings.HasPrefix(errOut, "mindroomd: "+c.field+": ") {
			t.Fatalf("configuration %d: exit %d, want %d naming %s\n%s%s", i, code, exitConfig, c.field, out, errOut)
		}
		tr.add("refused configuration "+strconv.Itoa(i), out+errOut)
	}
	tr.findLeaks(t, secrets)
}

// fileModes lists the permission bits of everything under root, by its
// path relative to root.
func fileModes(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	modes := map[string]fs.FileMode{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // a temporary file renamed or removed meanwhile
		}
		if err != nil {
			return err
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		modes[rel] = info.Mode()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return modes
}

// wantPrivate fails the test unless every directory under root is 0700,
// every file 0600, and each of want is there.
func wantPrivate(t *testing.T, root string, want ...string) {
	t.Helper()
	modes := fileModes(t, root)
	for _, rel := range want {
		if _, ok := modes[rel]; !ok {
			t.Errorf("%s is missing from the storage directory (it holds %v)", rel, modes)
		}
	}
	for rel, mode := range modes {
		switch {
		case mode.IsDir() && mode.Perm() != 0o700:
			t.Errorf("directory %s is %v, want drwx------", rel, mode)
		case mode.IsRegular() && mode.Perm() != 0o600:
			t.Errorf("file %s is %v, want -rw-------", rel, mode)
		case !mode.IsDir() && !mode.IsRegular():
			t.Errorf("%s is neither a file nor a directory: %v", rel, mode)
		}
	}
}

// umaskZero runs bin with args under umask 0, so any file it creates
// without an explicit mode would be world-readable. The shell first
// creates probe, whose mode shows the umask really was 0.
func umaskZero(bin, probe string, args ...string) *exec.Cmd {
	cmd := exec.Command("/bin/sh", append([]string{"-c", `umask 000 && : > "$PROBE" && exec "$0" "$@"`, bin}, args...)...)
	cmd.Env = append(os.Environ(), "PROBE="+probe, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return cmd
}

// The journal, its WAL, shared memory and lock, and the Matrix session
// with its access token are private to the daemon's user, as are their
// directories and a backup, even under a umask of 0: their modes are set
// by the code, not left to the umask. Checked while the daemon runs (the
// WAL and shared memory exist only then) and after it stopped.
func TestTheDaemonKeepsItsStoragePrivateWhateverTheUmask(t *testing.T) {
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	hs := dendrite.Start(t)
	bot := hs.Register(t, "echo", "echo-password-0a7f")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	work := t.TempDir()
	storage := filepath.Join(work, "storage") // the daemon creates it
	cfg := writeDaemonConfig(t, hs.URL, bot, storage)

	probe := filepath.Join(work, "umask-probe")
	cmd := umaskZero(bin, probe, "run", "-config", cfg)
	log := &logbuf.Buffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	daemonAddress(t, log)
	if info, err := os.Stat(probe); err != nil || info.Mode().Perm() != 0o666 {
		t.Fatalf("the daemon's umask was not 0: the probe is %v (%v)", info.Mode(), err)
	}
	alice.SendText(room, "anyone there?")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice.AwaitEvent(ctx, room, func(raw json.RawMessage) bool {
		return strings.Contains(string(raw), `"echo: anyone there?"`)
	})
	journal := filepath.Join("tracking", "event_journal.db")
	session := filepath.Join("matrix", "echo.session.json")
	wantPrivate(t, storage, ".", "tracking", journal, journal+"-wal", journal+"-shm", journal+".lock", "matrix", session)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the daemon's shutdown failed: %v\n%s", err, log)
	}
	wantPrivate(t, storage, ".", "tracking", journal, journal+".lock", "matrix", session)

	backups := filepath.Join(work, "backups")
	if err := os.Mkdir(backups, 0o700); err != nil {
		t.Fatal(err)
	}
	backup := umaskZero(bin, probe+"-backup", "backup", "-storage", storage, "-to", filepath.Join(backups, "journal.db"))
	if out, err := backup.CombinedOutput(); err != nil {
		t.Fatalf("backup: %v\n%s", err, out)
	}
	wantPrivate(t, backups, ".", "journal.db")
}

// Off loopback, /metrics is served only to a request bearing an agent's
// API token; an agent without a token (whose token is empty) opens
// nothing, and no other credential or spelling passes.
func TestMetricsOffLoopbackNeedAnAgentsToken(t *testing.T) {
	d := &daemon{apiAgents: map[string]api.Agent{"keeper": {Token: keeperAPIToken}, "tokenless": {}}}
	const body = "mindroomd_served_metrics 1\n"
	served := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) })
	open := d.metricsAccess(&net.TCPAddr{IP: net.ParseIP("10.0.0.5"), Port: 8787}, served)
	for auth, want := range map[string]int{
		"":                               http.StatusUnauthorized,
		"Bearer ":                        http.StatusUnauthorized,
		"Bearer " + keeperAPIToken[:5]:   http.StatusUnauthorized,
		"Bearer " + keeperAPIToken + "x": http.StatusUnauthorized,
		"Basic " + keeperAPIToken:        http.StatusUnauthorized,
		keeperAPIToken:                   http.StatusUnauthorized,
		"Bearer " + keeperAPIToken:       http.StatusOK,
		"Bearer " + strings.ToUpper(keeperAPIToken): http.StatusUnauthorized,
	} {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		open.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("%q: status %d, want %d", auth, rec.Code, want)
		}
		if rec.Code != http.StatusOK && (strings.Contains(rec.Body.String(), body) ||
			strings.Contains(rec.Body.String(), keeperAPIToken)) {
			t.Errorf("%q: the refusal shows %s", auth, rec.Body)
		}
	}
	loopback := d.metricsAccess(&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 8787}, served)
	rec := httptest.NewRecorder()
	loopback.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("metrics on loopback: %d", rec.Code)
	}
}

// The metrics gate compares tokens as the agent API does: with
// subtle.ConstantTimeCompare, and never with == or != (but against ""),
// so its timing does not tell how much of a guess was right. It proves how
// the comparison is written, not how long it takes.
func TestTheMetricsGateComparesTokensInConstantTime(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "run.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var gate *ast.FuncDecl
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "metricsAccess" {
			gate = fn
		}
	}
	if gate == nil {
		t.Fatal("metricsAccess not found in run.go")
	}
	names := func(e ast.Expr) []string {
		var ids []string
		ast.Inspect(e, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok {
				ids = append(ids, strings.ToLower(id.Name))
			}
			if c, ok := n.(*ast.CallExpr); ok {
				if sel, ok := c.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "ConstantTimeCompare" {
					return false // its verdict is not a token
				}
			}
			return true
		})
		return ids
	}
	tokenish := func(e ast.Expr) bool {
		return slices.ContainsFunc(names(e), func(s string) bool { return strings.Contains(s, "token") })
	}
	constantTime := false
	ast.Inspect(gate, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.BinaryExpr:
			empty := func(e ast.Expr) bool { l, ok := e.(*ast.BasicLit); return ok && l.Value == `""` }
			if (x.Op == token.EQL || x.Op == token.NEQ) && (tokenish(x.X) || tokenish(x.Y)) && !empty(x.X) && !empty(x.Y) {
				t.Errorf("%s: a token compared with %s", fset.Position(x.Pos()), x.Op)
			}
		case *ast.CallExpr:
			sel, ok := x.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if sel.Sel.Name == "ConstantTimeCompare" && len(x.Args) == 2 && tokenish(x.Args[0]) && tokenish(x.Args[1]) {
				constantTime = true
			}
			if slices.Contains([]string{"EqualFold", "Equal", "Compare", "DeepEqual"}, sel.Sel.Name) &&
				slices.ContainsFunc(x.Args, tokenish) {
				t.Errorf("%s: a token compared with %s", fset.Position(x.Pos()), sel.Sel.Name)
			}
		}
		return true
	})
	if !constantTime {
		t.Error("metricsAccess does not compare tokens with subtle.ConstantTimeCompare")
	}
}
