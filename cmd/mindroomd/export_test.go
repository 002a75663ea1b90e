package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/mindroomd/mindroomd/store"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/api"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const (
	exportRoom  = "!export:example.org"
	exportAlice = "@alice:example.org"
	// exportToken is the helper agent's API token in the tests without a
	// homeserver.
	exportToken = "export-api-token-5d0c"
)

// exportConfig writes a configuration for the storage directory with one
// agent per name, each with a password file and an API token file (the
// first agent's holds exportToken), and returns its path. No daemon runs from it: the
// homeserver is never asked.
func exportConfig(t *testing.T, storage, listen string, agents ...string) string {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	fmt.Fprintf(&b, "homeserver: http://127.0.0.1:1\nstorage: %s\nlisten: %s\nagents:\n", storage, listen)
	for i, a := range agents {
		token := exportToken
		if i > 0 {
			token += "-" + a // each agent needs its own
		}
		for file, secret := range map[string]string{a + ".password": "pw", a + ".api-token": token + "\n"} {
			if err := os.WriteFile(filepath.Join(dir, file), []byte(secret), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Fprintf(&b, "  - name: %s\n    user_id: \"@%s:example.org\"\n    password_file: %s.password\n"+
			"    api_token_file: %s.api-token\n    backend:\n      type: http\n", a, a, a, a)
	}
	path := filepath.Join(dir, "mindroom.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// exportFixture admits a conversation that takes several pages of three:
// messages, an edit, a message without text, a thread, and three messages
// owing a refetch (two sidecar previews and a redacted edit on screen). It
// returns the store's storage directory and an agent API over the store
// that exports in pages of pageSize.
func exportFixture(t *testing.T, pageSize int) (storage string, srv *httptest.Server) {
	t.Helper()
	ctx := context.Background()
	s, dir := testsupport.MustOpen(t)
	v, err := s.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	evs := []mx.Ev{
		mx.Message("$m0", exportAlice, 1000, "the thread's root"),
		mx.Message("$m1", exportAlice, 1001, "first"),
		mx.Edit("$m1e", exportAlice, 1002, "$m1", "first, edited"),
		mx.Sidecar("$side1", exportAlice, 1003, "a long text"),
		mx.Message("$m2", exportAlice, 1004, "second"),
		mx.Edit("$m2e", exportAlice, 1005, "$m2", "second, edited"),
		mx.Redaction("$m2r", exportAlice, 1006, "$m2e"),
		mx.Message("$file", exportAlice, 1007, "").With("content", map[string]any{"msgtype": "m.file"}),
		mx.ThreadReply("$t1", exportAlice, 1008, "$m0", "in the thread"),
		mx.ThreadReply("$t2", exportAlice, 1009, "$m0", "in the thread again"),
		mx.Sidecar("$side2", exportAlice, 1010, "another long text"),
	}
	for i := range 8 {
		evs = append(evs, mx.Message(fmt.Sprintf("$n%d", i), exportAlice, int64(1100+i), fmt.Sprintf("message %d", i)))
	}
	if _, err := v.AdmitBatch(ctx, mx.Live(exportRoom, evs...), "s_1"); err != nil {
		t.Fatal(err)
	}
	srv = httptest.NewServer(api.New(api.Deps{
		Agents:     map[string]api.Agent{"helper": {Store: v, Token: exportToken, Hints: s.Hints()}},
		Log:        zerolog.Nop(),
		ExportPage: pageSize,
	}))
	t.Cleanup(srv.Close)
	return dir, srv
}

// apiExport is the agent API's own export of a conversation.
func apiExport(t *testing.T, base, agent, room, query string) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/v1/agents/"+agent+"/rooms/"+room+"/export?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+exportToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET export?%s: %s %v\n%s", query, resp.Status, err, b)
	}
	return b
}

// An export read from the journal itself is the agent API's export byte
// for byte, in both formats, for the room and for a thread, over a
// conversation of several pages with messages owing a refetch: the two
// walks, the page order and the lines are the same.
func TestAnOfflineExportIsTheAPIsExportByteForByte(t *testing.T) {
	storage, srv := exportFixture(t, 3)
	helper := journal.Principal{Agent: "helper", UserID: "@helper:example.org"}
	root := "$m0"
	for _, tc := range []struct {
		name   string
		thread *string
		format string
	}{
		{"RoomJSONLines", nil, formatJSONLines},
		{"RoomMarkdown", nil, formatMarkdown},
		{"ThreadJSONLines", &root, formatJSONLines},
		{"ThreadMarkdown", &root, formatMarkdown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			query := "format=" + tc.format
			if tc.thread != nil {
				query += "&thread=" + *tc.thread
			}
			want := apiExport(t, srv.URL, "helper", exportRoom, query)
			var got bytes.Buffer
			if err := exportOffline(context.Background(), &got, nil, journalReader(store.Options{StorageDir: storage}), helper, exportRoom, tc.thread, tc.format, 3); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("offline export:\n%s\nthe API's:\n%s", got.Bytes(), want)
			}
		})
	}
	// The comparison saw what it is meant to: several pages, and a page's
	// line of messages owed a refetch.
	lines := apiExport(t, srv.URL, "helper", exportRoom, "format=jsonl")
	if n := bytes.Count(lines, []byte("\n")); n < 10 || !bytes.Contains(lines, []byte(`{"owed_refetch":["$side2"]}`)) ||
		!bytes.Contains(lines, []byte(`"first, edited"`)) {
		t.Fatalf("the room's export (%d lines) lacks several pages, an edit or an owed line:\n%s", n, lines)
	}
}

// Through the API, export writes exactly what the export route answers,
// with the token from the agent's api_token_file; -offline writes the same
// from the journal.
func TestExportWritesWhatTheAPIAnswersAndOfflineTheSame(t *testing.T) {
	storage, srv := exportFixture(t, api.DefaultExportPage)
	cfg := exportConfig(t, storage, "127.0.0.1:8787", "helper")
	for _, format := range []string{formatJSONLines, formatMarkdown} {
		want := apiExport(t, srv.URL, "helper", exportRoom, "format="+format)
		got, err := run(t, "export", "-config", cfg, "-api", srv.URL, "-room", exportRoom, "-format", format)
		if err != nil || got != string(want) {
			t.Fatalf("%s export through the API: %v\n%s\nwant:\n%s", format, err, got, want)
		}
		offline, err := run(t, "export", "-config", cfg, "-offline", "-room", exportRoom, "-format", format)
		if err != nil || offline != string(want) {
			t.Fatalf("%s export offline: %v\n%s\nwant:\n%s", format, err, offline, want)
		}
	}
}

// The token comes from -token-file, else $MINDROOM_API_TOKEN, else the
// agent's api_token_file; no error ever shows it.
func TestExportTakesTheTokenFromTheFlagTheEnvironmentOrTheConfiguration(t *testing.T) {
	seen := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Authorization")
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	cfg := exportConfig(t, t.TempDir(), "127.0.0.1:8787", "helper")
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("from-the-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"export", "-config", cfg, "-api", srv.URL, "-room", exportRoom}
	for _, tc := range []struct {
		name, env string
		flags     []string
		want      string
	}{
		{"Configuration", "", nil, exportToken},
		{"Environment", "from-the-environment", nil, "from-the-environment"},
		{"File", "from-the-environment", []string{"-token-file", file}, "from-the-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envAPIToken, tc.env)
			if _, err := run(t, append(args, tc.flags...)...); err != nil {
				t.Fatal(err)
			}
			if got := <-seen; got != "Bearer "+tc.want {
				t.Fatalf("Authorization = %q, want the token %q", got, tc.want)
			}
		})
	}
}

// A refusal names the daemon's status and reason, exits 1, and never
// shows the token that was refused.
func TestARefusedExportSaysWhyWithoutShowingTheToken(t *testing.T) {
	storage, srv := exportFixture(t, api.DefaultExportPage)
	cfg := exportConfig(t, storage, "127.0.0.1:8787", "helper")
	const wrong = "not-the-helpers-token-93ab"
	t.Setenv(envAPIToken, wrong)
	var stdout, stderr bytes.Buffer
	code := execute(context.Background(), []string{"export", "-config", cfg, "-api", srv.URL, "-room", exportRoom},
		&stdout, &stderr)
	if code != exitFailure || stdout.Len() != 0 ||
		!strings.Contains(stderr.String(), "the daemon answered 401 unauthorized: the bearer token is not valid") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and the daemon's reason", code, stdout.String(), stderr.String())
	}
	if strings.Contains(stderr.String(), wrong) || strings.Contains(stderr.String(), exportToken) {
		t.Fatalf("the error shows a token: %s", stderr.String())
	}
}

func TestExportSaysWhenTheDaemonCannotBeReached(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close() // its port is now closed
	cfg := exportConfig(t, t.TempDir(), strings.TrimPrefix(srv.URL, "http://"), "helper")
	var stderr bytes.Buffer
	code := execute(context.Background(), []string{"export", "-config", cfg, "-room", exportRoom}, io.Discard, &stderr)
	if code != exitFailure || !strings.Contains(stderr.String(), "cannot reach the daemon's agent API at "+srv.URL) ||
		!strings.Contains(stderr.String(), "-offline") {
		t.Fatalf("exit %d, stderr %q; want exit 1, the address tried and the way round it", code, stderr.String())
	}
}

// A daemon that cuts the export midway (a read failed after the 200 went
// out) leaves an output that is not whole; export says so and fails.
func TestAnExportCutShortIsAnError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"event_id":"$a"}`+"\n")
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}))
	defer srv.Close()
	cfg := exportConfig(t, t.TempDir(), "127.0.0.1:8787", "helper")
	out, err := run(t, "export", "-config", cfg, "-api", srv.URL, "-room", exportRoom)
	if !errors.Is(err, errCutShort) || exitCode(err) != exitFailure {
		t.Fatalf("export of a cut body: %v (output %q), want it cut short", err, out)
	}
}

func TestAnOfflineExportOfAnAgentTheJournalNeverSawFails(t *testing.T) {
	storage, _ := exportFixture(t, api.DefaultExportPage)
	cfg := exportConfig(t, storage, "127.0.0.1:8787", "stranger")
	if _, err := run(t, "export", "-config", cfg, "-offline", "-room", exportRoom); !errors.Is(err, errNoPrincipal) {
		t.Fatalf("offline export for an agent the journal never saw: %v, want %v", err, errNoPrincipal)
	}
}

// A command line export cannot run exits 2 before it reads anything, and
// a configuration it cannot use exits 3.
func TestExportRefusesACommandLineItCannotRun(t *testing.T) {
	one := exportConfig(t, t.TempDir(), "127.0.0.1:8787", "helper")
	two := exportConfig(t, t.TempDir(), "127.0.0.1:8787", "helper", "other")
	portZero := exportConfig(t, t.TempDir(), "127.0.0.1:0", "helper")
	for _, tc := range []struct {
		name   string
		args   []string
		want   int
		stderr string
	}{
		{"NoRoom", []string{"-config", one}, exitUsage, "-room is required"},
		{"NotARoom", []string{"-config", one, "-room", "#alias:example.org"}, exitUsage, "is not a room ID"},
		{"NotAThreadRoot", []string{"-config", one, "-room", exportRoom, "-thread", "m0"}, exitUsage, "is not an event ID"},
		{"UnknownFormat", []string{"-config", one, "-room", exportRoom, "-format", "pdf"}, exitUsage, "-format must be jsonl or markdown"},
		{"OfflineWithAPI", []string{"-config", one, "-room", exportRoom, "-offline", "-api", "http://127.0.0.1:8787"}, exitUsage, "-offline reads the journal itself"},
		{"NotAnAPIURL", []string{"-config", one, "-room", exportRoom, "-api", "127.0.0.1:8787"}, exitUsage, "is not an http(s) base URL"},
		{"WhichAgent", []string{"-config", two, "-room", exportRoom}, exitUsage, "-agent is required: the configuration has 2 agents (helper, other)"},
		{"UnknownAgent", []string{"-config", one, "-room", exportRoom, "-agent", "nobody"}, exitUsage, `no agent "nobody"`},
		{"PortChosenAtStart", []string{"-config", portZero, "-room", exportRoom}, exitUsage, "give -api"},
		{"NoConfiguration", []string{"-config", filepath.Join(t.TempDir(), "absent.yaml"), "-room", exportRoom}, exitConfig, "read config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := execute(context.Background(), append([]string{"export"}, tc.args...), &stdout, &stderr)
			if code != tc.want || stdout.Len() != 0 || !strings.Contains(stderr.String(), tc.stderr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d and %q", code, stdout.String(), stderr.String(), tc.want, tc.stderr)
			}
		})
	}
}

func TestTheAPIIsReachedAtTheListenAddress(t *testing.T) {
	for listen, want := range map[string]string{
		"127.0.0.1:8787": "http://127.0.0.1:8787",
		"0.0.0.0:8787":   "http://127.0.0.1:8787",
		":8787":          "http://127.0.0.1:8787",
		"[::]:9000":      "http://[::1]:9000",
		"[::1]:9000":     "http://[::1]:9000",
		"host.lan:8787":  "http://host.lan:8787",
	} {
		if got, err := listenURL(listen); err != nil || got != want {
			t.Errorf("listenURL(%q) = %q, %v; want %q", listen, got, err, want)
		}
	}
}

// Against a real daemon and a real homeserver: the export through the
// daemon's agent API and the export from its journal, read beside it, are
// the same conversation byte for byte, and the real binary, writing to a
// pipe, shows no progress.
func TestExportThroughTheDaemonAndOfflineAreTheSameConversation(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "keeper", "keeper-password-2b7f")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	const token = "api-token-of-the-keeper"
	// The http back-end leaves the work to an agent that never comes, so
	// the conversation is Alice's alone and stays as she wrote it.
	cfg := writeHTTPAgentConfig(t, hs.URL, bot, "keeper", token)
	d := runInProcess(cfg)
	defer d.stopCleanly(t)
	base := "http://" + daemonAddress(t, d.log)

	one := alice.SendText(room, "one")
	two := alice.SendText(room, "two")
	alice.ThreadReply(room, one, "a reply in one's thread")
	alice.Edit(room, two, "two, edited")
	last := alice.SendText(room, "three")
	awaitPending(t, base+"/v1/agents/keeper", token, last)

	exports := func(extra ...string) (viaAPI, offline string) {
		t.Helper()
		args := append([]string{"export", "-config", cfg, "-room", room}, extra...)
		viaAPI, err := run(t, append(args, "-api", base)...)
		if err != nil {
			t.Fatalf("export %q through the API: %v", extra, err)
		}
		if offline, err = run(t, append(args, "-offline")...); err != nil {
			t.Fatalf("export %q offline: %v", extra, err)
		}
		return viaAPI, offline
	}
	viaAPI, offline := exports()
	if viaAPI != offline {
		t.Fatalf("through the API:\n%s\noffline:\n%s", viaAPI, offline)
	}
	var bodies []string
	for _, line := range strings.Split(strings.TrimSpace(viaAPI), "\n") {
		var m struct {
			Content struct {
				Body string `json:"body"`
			} `json:"content"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("export line %q: %v", line, err)
		}
		bodies = append(bodies, m.Content.Body)
	}
	if got, want := strings.Join(bodies, "|"), "one|two, edited|three"; got != want {
		t.Fatalf("the room's export holds %q, want %q:\n%s", got, want, viaAPI)
	}
	for _, extra := range [][]string{{"-format", "markdown"}, {"-thread", one}} {
		if viaAPI, offline := exports(extra...); viaAPI != offline || viaAPI == "" {
			t.Fatalf("export %q through the API:\n%s\noffline:\n%s", extra, viaAPI, offline)
		}
	}

	// The real binary with a pipe for stderr: the conversation on stdout,
	// nothing on stderr.
	code, stdout, stderr := mindroomd(t, "export", "-config", cfg, "-room", room, "-api", base)
	if code != exitOK || stdout != viaAPI || stderr != "" {
		t.Fatalf("mindroomd export into pipes: exit %d, stderr %q, stdout equal: %v", code, stderr, stdout == viaAPI)
	}
	code, stdout, stderr = mindroomd(t, "export", "-config", cfg, "-room", room, "-offline")
	if code != exitOK || stdout != viaAPI || stderr != "" {
		t.Fatalf("mindroomd export -offline into pipes: exit %d, stderr %q, stdout equal: %v", code, stderr, stdout == viaAPI)
	}
}

// awaitPending long-polls the agent's pending work until eventID is
// among it: it and everything synced before it are then in the journal.
func awaitPending(t *testing.T, agentURL, token, eventID string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	after := int64(0)
	for time.Now().Before(deadline) {
		var page struct {
			Events []struct {
				EventID string `json:"event_id"`
			} `json:"events"`
			NextAfter int64 `json:"next_after"`
		}
		if code := apiCall(t, "GET", fmt.Sprintf("%s/pending?wait=30s&after=%d", agentURL, after), token, "", &page); code != http.StatusOK {
			t.Fatalf("pending: status %d", code)
		}
		for _, e := range page.Events {
			if e.EventID == eventID {
				return
			}
		}
		after = page.NextAfter
	}
	t.Fatalf("%s never became pending", eventID)
}
