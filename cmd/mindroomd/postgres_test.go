package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/pg"
)

// dbPassword is put in the database URL; the cluster trusts loopback, so
// it is never checked, only never to be printed.
const dbPassword = "db-pw-3f8a61-never-printed"

// postgresURL is a fresh schema of a throwaway cluster (or of the server
// MINDROOM_TEST_PG_URL names), as a URL holding a password.
func postgresURL(t *testing.T) string {
	t.Helper()
	return schemaURL(t, pg.Start(t))
}

func TestTheDaemonRunsOnPostgreSQLAndAnswersEachMessageOnceAcrossARestart(t *testing.T) {
	dbURL := postgresURL(t)
	hs := dendrite.Start(t)
	bot := hs.Register(t, "pgecho", "pgecho-password-91b2")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	storage := t.TempDir()
	// The journal moves to PostgreSQL by one key, the URL in a file.
	cfg := onPostgres(t, hs.URL, bot, storage, dbURL)
	urlFile := filepath.Join(filepath.Dir(cfg), "pg.url")

	awaitEcho := func(text string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		alice.AwaitEvent(ctx, room, dendrite.Says(bot.UserID, "echo: "+text))
	}
	var logs strings.Builder
	d := runInProcess(cfg)
	questions := []string{alice.SendText(room, "hello")}
	awaitEcho("hello")
	d.stopCleanly(t)
	logs.WriteString(d.log.String())

	// Restarted, it answers what came meanwhile, once.
	questions = append(questions, alice.SendText(room, "while away"))
	d = runInProcess(cfg)
	awaitEcho("while away")
	d.stopCleanly(t)
	logs.WriteString(d.log.String())

	answers := 0
	for _, raw := range alice.Messages(room) {
		var ev struct {
			Sender string `json:"sender"`
		}
		if json.Unmarshal(raw, &ev) == nil && ev.Sender == bot.UserID && strings.Contains(string(raw), `"echo: `) {
			answers++
		}
	}
	if answers != 2 {
		t.Fatalf("the room holds %d answers, want one per message", answers)
	}
	if !strings.Contains(logs.String(), `"journal":"postgresql"`) {
		t.Errorf("the daemon did not say it runs on PostgreSQL; its log:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), dbPassword) {
		t.Fatal("the daemon logged the database password")
	}
	if _, err := os.Stat(sqlitefs.Path(storage)); !os.IsNotExist(err) {
		t.Errorf("a SQLite journal appeared under storage (%v); the journal belongs in PostgreSQL", err)
	}
	// status reads the same journal, read-only, and shows no secret.
	out, err := run(t, "status", "-database-url-file", urlFile)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if !strings.Contains(out, "journal in PostgreSQL") || !strings.Contains(out, "echo@"+bot.UserID) {
		t.Errorf("status does not summarise the PostgreSQL journal:\n%s", out)
	}
	if strings.Contains(out, dbPassword) {
		t.Fatal("status printed the database password")
	}
	// An offline export reads the conversation from PostgreSQL too.
	out, err = run(t, "export", "-config", cfg, "-offline", "-room", room)
	if err != nil {
		t.Fatalf("offline export: %v\n%s", err, out)
	}
	for _, want := range []string{`"hello"`, `"echo: hello"`, `"while away"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the offline export lacks %s:\n%s", want, out)
		}
	}
	// The journal in PostgreSQL holds both messages, answered.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range questions {
		var state int
		if err := conn.QueryRow(ctx, `SELECT state FROM journal_events WHERE event_id = $1`, q).Scan(&state); err != nil {
			t.Fatalf("question %s in the PostgreSQL journal: %v", q, err)
		}
		if state != 1 {
			t.Errorf("question %s is in state %d, want settled (1)", q, state)
		}
	}
}

func TestStatusOnPostgreSQLRefusesADatabaseWithoutAJournalAndCreatesNothing(t *testing.T) {
	dbURL := postgresURL(t)
	file := filepath.Join(t.TempDir(), "pg.url")
	if err := os.WriteFile(file, []byte(dbURL), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "status", "-database-url-file", file)
	if err == nil || !strings.Contains(err.Error(), "no mindroomd journal") {
		t.Fatalf("status of an empty schema: %v\n%s", err, out)
	}
	if strings.Contains(err.Error(), dbPassword) {
		t.Fatalf("the error shows the password: %v", err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var tables int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("status created %d tables", tables)
	}
}

// onPostgres writes a daemon configuration for bot with storage, its
// journal in the database at dbURL.
func onPostgres(t *testing.T, homeserver string, bot dendrite.Account, storage, dbURL string) string {
	t.Helper()
	cfg := writeDaemonConfig(t, homeserver, bot, storage)
	urlFile := filepath.Join(filepath.Dir(cfg), "pg.url")
	if err := os.WriteFile(urlFile, []byte(dbURL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("database_url_file: ./pg.url\n"); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestOnPostgreSQLADaemonOnAnotherHostSignsTheAgentInOnTheSameDevice(t *testing.T) {
	dbURL := postgresURL(t)
	hs := dendrite.Start(t)
	bot := hs.Register(t, "pgecho", "pgecho-password-4d17")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	echoed := func(text string) func(json.RawMessage) bool { return dendrite.Says(bot.UserID, "echo: "+text) }
	first := t.TempDir()
	d := runInProcess(onPostgres(t, hs.URL, bot, first, dbURL))
	alice.AwaitEvent(ctx, room, dendrite.Joined(bot.UserID, 1))
	alice.SendText(room, "hello")
	alice.AwaitEvent(ctx, room, echoed("hello"))
	d.stopCleanly(t)

	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	readDevice := func() string {
		t.Helper()
		var device string
		if err := conn.QueryRow(ctx, `SELECT device_id FROM matrix_sessions WHERE agent = 'echo'`).Scan(&device); err != nil {
			t.Fatalf("the agent's session in the database: %v", err)
		}
		return device
	}
	device := readDevice()
	if _, err := os.Stat(filepath.Join(first, "matrix", "echo.session.json")); !os.IsNotExist(err) {
		t.Errorf("a session file was written under storage (%v); the session belongs in the database", err)
	}

	// Another host: a storage directory of its own, the same database, and
	// the same pickle key, which opens the agent's olm account there.
	second := t.TempDir()
	key, err := os.ReadFile(filepath.Join(first, "pickle.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(second, "pickle.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	d = runInProcess(onPostgres(t, hs.URL, bot, second, dbURL))
	defer func() {
		if t.Failed() {
			t.Logf("the second host's log:\n%s", d.log)
		}
	}()
	alice.SendText(room, "from another host")
	alice.AwaitEvent(ctx, room, echoed("from another host"))
	d.stopCleanly(t)
	if got := readDevice(); got != device {
		t.Fatalf("the second host signed in on device %s, want the first's %s", got, device)
	}
	if strings.Contains(d.log.String(), "Matrix device changed") {
		t.Fatalf("the second host changed the agent's device; its log:\n%s", d.log)
	}
}
