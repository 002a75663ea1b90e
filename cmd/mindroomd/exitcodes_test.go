package main

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/pgfs"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/pg"
)

// Test SQL, run on a PostgreSQL journal from outside the daemon.
const (
	pgCreateForeignTable = `CREATE TABLE invoices (id int PRIMARY KEY, total numeric)`
	pgInsertVersion      = `INSERT INTO schema_versions (version) VALUES ($1)`
)

// A journal the binary refuses exits 4 on either backend, so a service
// manager told not to restart on it does not restart the daemon in a loop;
// every other code means the same on both backends too. Each row runs the
// real binary on the command line an operator would type.
func TestEachFailureExitsWithItsCodeOnEitherBackend(t *testing.T) {
	cluster := pg.Start(t)
	for _, tc := range []struct {
		name string
		// args is the command line; it may name the files setup made.
		args func(t *testing.T) []string
		want int
		// stderr is what the error must say.
		stderr string
	}{
		{name: "SQLite/Usage", args: func(t *testing.T) []string {
			return []string{"run", "-config", runConfig(t, t.TempDir(), ""), "stray"}
		}, want: exitUsage, stderr: `unexpected argument "stray"`},
		{name: "SQLite/Config", args: func(t *testing.T) []string {
			return []string{"run", "-config", runConfig(t, t.TempDir(), "nosuch_key: 1\n")}
		}, want: exitConfig, stderr: "nosuch_key"},
		{name: "SQLite/ForeignFile", args: func(t *testing.T) []string {
			return []string{"run", "-config", runConfig(t, foreignJournal(t), "")}
		}, want: exitJournal, stderr: "not a mindroomd journal"},
		{name: "SQLite/NewerSchema", args: func(t *testing.T) []string {
			dir := closedJournal(t)
			setVersion(t, dir, sqlitefs.SchemaVersion()+1)
			return []string{"run", "-config", runConfig(t, dir, "")}
		}, want: exitJournal, stderr: "upgrade mindroomd"},
		{name: "SQLite/Corrupt", args: func(t *testing.T) []string {
			return []string{"run", "-config", runConfig(t, corruptJournal(t), "")}
		}, want: exitJournal, stderr: "malformed"},
		{name: "SQLite/NotADatabase", args: func(t *testing.T) []string {
			return []string{"run", "-config", runConfig(t, garbageJournal(t), "")}
		}, want: exitJournal, stderr: "file is not a database"},
		{name: "SQLite/OlderSchemaReadOnly", args: func(t *testing.T) []string {
			dir := closedJournal(t)
			setVersion(t, dir, sqlitefs.SchemaVersion()-1)
			return []string{"status", "-storage", dir}
		}, want: exitJournal, stderr: "older than this binary"},
		{name: "SQLite/Other", args: func(t *testing.T) []string {
			// A journal another process holds open for writing.
			dir := t.TempDir()
			testsupport.MustOpenAt(t, dir)
			return []string{"run", "-config", runConfig(t, dir, "")}
		}, want: exitFailure, stderr: "open for writing by another process"},

		{name: "PostgreSQL/Usage", args: func(t *testing.T) []string {
			return []string{"run", "-config", runConfigOn(t, schemaURL(t, cluster)), "stray"}
		}, want: exitUsage, stderr: `unexpected argument "stray"`},
		{name: "PostgreSQL/Config", args: func(t *testing.T) []string {
			return []string{"run", "-config", runConfig(t, t.TempDir(), "database_url_file: ./absent.url\n")}
		}, want: exitConfig, stderr: "database_url_file"},
		{name: "PostgreSQL/ForeignSchema", args: func(t *testing.T) []string {
			u := schemaURL(t, cluster)
			pgExec(t, u, pgCreateForeignTable)
			return []string{"run", "-config", runConfigOn(t, u)}
		}, want: exitJournal, stderr: "not a mindroomd journal"},
		{name: "PostgreSQL/NewerSchema", args: func(t *testing.T) []string {
			u := pgJournal(t, cluster)
			pgExec(t, u, pgInsertVersion, pgfs.SchemaVersion()+1)
			return []string{"run", "-config", runConfigOn(t, u)}
		}, want: exitJournal, stderr: "upgrade mindroomd"},
		{name: "PostgreSQL/ForeignSchemaReadOnly", args: func(t *testing.T) []string {
			u := schemaURL(t, cluster)
			pgExec(t, u, pgCreateForeignTable)
			return []string{"status", "-database-url-file", urlFile(t, u)}
		}, want: exitJournal, stderr: "not a mindroomd journal"},
		{name: "PostgreSQL/NewerSchemaReadOnly", args: func(t *testing.T) []string {
			u := pgJournal(t, cluster)
			pgExec(t, u, pgInsertVersion, pgfs.SchemaVersion()+1)
			return []string{"status", "-database-url-file", urlFile(t, u)}
		}, want: exitJournal, stderr: "upgrade mindroomd"},
		{name: "PostgreSQL/Other", args: func(t *testing.T) []string {
			// A database the server does not have.
			u, err := url.Parse(schemaURL(t, cluster))
			if err != nil {
				t.Fatal(err)
			}
			u.Path = "/no_such_database"
			return []string{"run", "-config", runConfigOn(t, u.String())}
		}, want: exitFailure, stderr: "no_such_database"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args(t)
			code, out, errOut := mindroomd(t, args...)
			if code != tc.want || out != "" || !strings.Contains(errOut, tc.stderr) {
				t.Fatalf("mindroomd %s: exit %d, stdout %q, stderr %q; want exit %d and %q on stderr",
					tc.name, code, out, errOut, tc.want, tc.stderr)
			}
			if strings.Contains(errOut, dbPassword) {
				t.Fatalf("the error shows the database password: %s", errOut)
			}
		})
	}
}

// runConfig writes the configuration of one echo agent whose journal is
// under storage, with extra appended, and returns its path. Every row that
// uses it fails before the homeserver is asked anything.
func runConfig(t *testing.T, storage, extra string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "echo.password"), []byte("echo-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := `homeserver: http://127.0.0.1:1
storage: ` + strconv.Quote(storage) + `
listen: 127.0.0.1:0
agents:
  - name: echo
    user_id: "@echo:example.org"
    password_file: ./echo.password
    backend:
      type: echo
` + extra
	path := filepath.Join(dir, "mindroom.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runConfigOn is runConfig with the journal in PostgreSQL at dbURL.
func runConfigOn(t *testing.T, dbURL string) string {
	t.Helper()
	path := runConfig(t, t.TempDir(), "database_url_file: ./pg.url\n")
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), "pg.url"), []byte(dbURL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// urlFile writes dbURL to a file of its own and returns the file's path.
func urlFile(t *testing.T, dbURL string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pg.url")
	if err := os.WriteFile(path, []byte(dbURL), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// schemaURL is a fresh schema of c, as a URL holding a password.
func schemaURL(t *testing.T, c *pg.Cluster) string {
	t.Helper()
	u, err := url.Parse(c.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, set := u.User.Password(); !set {
		u.User = url.UserPassword(u.User.Username(), dbPassword)
	}
	return u.String()
}

// pgJournal is a fresh schema of c holding a journal this binary made,
// closed.
func pgJournal(t *testing.T, c *pg.Cluster) string {
	t.Helper()
	u := schemaURL(t, c)
	s, err := pgfs.Open(t.Context(), pgfs.Options{URL: u})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return u
}

// pgExec runs one statement on the database at dbURL, as another program
// would.
func pgExec(t *testing.T, dbURL, stmt string, args ...any) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, stmt, args...); err != nil {
		t.Fatal(err)
	}
}
