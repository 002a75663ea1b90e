package pg_test

import (
	"context"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/testsupport/pg"
)

const (
	createItems     = `CREATE TABLE items (id int PRIMARY KEY)`
	insertItem      = `INSERT INTO items (id) VALUES ($1)`
	countItems      = `SELECT count(*) FROM items`
	itemsExist      = `SELECT to_regclass('items') IS NOT NULL`
	itemsSchema     = `SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = 'items'::regclass`
	showSearchPath  = `SHOW search_path`
	currentSchema   = `SELECT current_schema()`
	currentDatabase = `SELECT current_database()`
	schemaExists    = `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`
	databaseExists  = `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`
	serverAddr      = `SELECT host(inet_server_addr())`
	showListen      = `SHOW listen_addresses`
	showSockets     = `SHOW unix_socket_directories`
	showFsync       = `SHOW fsync`
	showSyncCommit  = `SHOW synchronous_commit`
	showFullPages   = `SHOW full_page_writes`
)

var cluster *pg.Cluster

func TestMain(m *testing.M) {
	os.Exit(pg.RunTests(m, func(c *pg.Cluster) { cluster = c }))
}

// connect opens a connection closed when t ends.
func connect(t *testing.T, rawURL string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), rawURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// scan runs a one-value query.
func scan[T any](t *testing.T, conn *pgx.Conn, query string, args ...any) T {
	t.Helper()
	var v T
	if err := conn.QueryRow(t.Context(), query, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return v
}

func exec(t *testing.T, conn *pgx.Conn, stmt string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(t.Context(), stmt, args...); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// urlPart parses rawURL and returns part of it.
func urlPart(t *testing.T, rawURL string, part func(*url.URL) string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal("the URL does not parse")
	}
	got := part(u)
	if got == "" {
		t.Fatal("the URL lacks the part the test reads")
	}
	return got
}

func searchPath(u *url.URL) string { return u.Query().Get("search_path") }

func TestTwoSchemasDoNotSeeEachOthersTables(t *testing.T) {
	t.Parallel()
	a := connect(t, cluster.Schema(t))
	b := connect(t, cluster.Schema(t))

	exec(t, a, createItems)
	exec(t, a, insertItem, 1)
	if scan[bool](t, b, itemsExist) {
		t.Fatal("a table made in one schema is visible in another")
	}
	exec(t, b, createItems)
	if n := scan[int64](t, b, countItems); n != 0 {
		t.Errorf("the second schema's items has %d rows, want 0", n)
	}
	if n := scan[int64](t, a, countItems); n != 1 {
		t.Errorf("the first schema's items has %d rows, want 1", n)
	}
}

func TestASchemaURLPutsItsConnectionsInTheSchema(t *testing.T) {
	t.Parallel()
	u := cluster.Schema(t)
	name := urlPart(t, u, searchPath)
	conn := connect(t, u)

	if got := scan[string](t, conn, showSearchPath); got != name {
		t.Errorf("search_path is %q, want %q", got, name)
	}
	// current_schema() is the first schema on the path that exists.
	if got := scan[*string](t, conn, currentSchema); got == nil || *got != name {
		t.Errorf("current_schema() is %v, want %q", got, name)
	}
	exec(t, conn, createItems)
	if got := scan[string](t, conn, itemsSchema); got != name {
		t.Errorf("an unqualified table went into %q, want %q", got, name)
	}
}

func TestASchemaIsDroppedWhenItsTestEnds(t *testing.T) {
	t.Parallel()
	admin := connect(t, cluster.URL())
	var name string
	t.Run("a test with a schema", func(t *testing.T) {
		u := cluster.Schema(t)
		name = urlPart(t, u, searchPath)
		exec(t, connect(t, u), createItems)
		if !scan[bool](t, admin, schemaExists, name) {
			t.Fatalf("schema %s does not exist during its test", name)
		}
	})
	if scan[bool](t, admin, schemaExists, name) {
		t.Errorf("schema %s outlived its test", name)
	}
}

// launch starts a cluster of the test's own, stopped when the test ends.
func launch(t *testing.T, durable bool) *pg.Cluster {
	t.Helper()
	c, err := pg.Launch(t.TempDir(), durable)
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return c
}

func TestALaunchedClusterListensOnlyOnLoopbackAndSkipsSyncs(t *testing.T) {
	t.Parallel()
	c := launch(t, false)
	conn := connect(t, c.URL())

	for query, want := range map[string]string{
		serverAddr: "127.0.0.1", showListen: "127.0.0.1", showSockets: "",
		showFsync: "off", showSyncCommit: "off", showFullPages: "off",
	} {
		if got := scan[string](t, conn, query); got != want {
			t.Errorf("%s: %q, want %q", query, got, want)
		}
	}
	_, port, err := net.SplitHostPort(c.Addr())
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	dialled := 0
	for _, a := range addrs {
		ip, ok := a.(*net.IPNet)
		if !ok || ip.IP.IsLoopback() || ip.IP.IsLinkLocalUnicast() {
			continue
		}
		target := net.JoinHostPort(ip.IP.String(), port)
		if nc, err := net.DialTimeout("tcp", target, 5*time.Second); err == nil {
			nc.Close()
			t.Errorf("the server took a connection on %s", target)
		}
		dialled++
	}
	t.Logf("the server refused %d non-loopback addresses", dialled)
}

func TestADurableClusterSyncsEveryCommitAndStops(t *testing.T) {
	t.Parallel()
	c := launch(t, true)
	conn := connect(t, c.URL())

	for query, want := range map[string]string{showFsync: "on", showSyncCommit: "on", showFullPages: "on"} {
		if got := scan[string](t, conn, query); got != want {
			t.Errorf("%s: %q, want %q", query, got, want)
		}
	}
	if log := c.LogTail(40); !strings.Contains(log, "ready to accept connections") {
		t.Errorf("the log's tail does not show the server ready:\n%s", log)
	}
	conn.Close(t.Context())
	if err := c.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if nc, err := net.DialTimeout("tcp", c.Addr(), 5*time.Second); err == nil {
		nc.Close()
		t.Error("the server still takes connections after Stop")
	}
	if err := c.Stop(); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
}
