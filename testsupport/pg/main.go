package pg

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
)

// EnvURL names the variable that points the tests at a running server
// instead of a launched one: a postgres:// URL whose user may create
// schemas and databases. The URL may hold a password, so only the
// server's host and port are ever printed.
const EnvURL = "MINDROOM_TEST_PG_URL"

// RunTests is a TestMain for a package whose tests share one PostgreSQL:
// it launches a cluster (fsync off) in a temporary directory, or takes
// the server EnvURL names, hands it to use, runs the tests, prints the
// tail of the server's log when they failed, stops the cluster and
// removes its directory. It returns the exit code for os.Exit, non-zero
// when the cluster could not be had or stopped.
func RunTests(m *testing.M, use func(*Cluster)) int {
	if raw := os.Getenv(EnvURL); raw != "" {
		c, err := external(raw)
		if err != nil {
			fmt.Fprintln(os.Stderr, "postgres from "+EnvURL+":", err)
			return 1
		}
		return run(m, c, use)
	}
	dir, err := os.MkdirTemp("", "pg-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	c, err := Launch(dir, false)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start postgres:", err)
		return 1
	}
	return run(m, c, use)
}

// run is RunTests once it has a cluster.
func run(m *testing.M, c *Cluster, use func(*Cluster)) int {
	use(c)
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "postgres log, last lines:\n%s\n", c.LogTail(logTail))
	}
	if err := c.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop postgres:", err)
		return 1
	}
	return code
}

// external is the running server raw names, once it has answered. No
// error repeats raw: it may hold a password.
func external(raw string) (*Cluster, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		return nil, errors.New("not a postgres://host:port/database URL")
	}
	c := &Cluster{url: raw, addr: u.Host}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, raw)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", c.addr, err)
	}
	defer conn.Close(context.Background())
	if err := conn.Ping(ctx); err != nil {
		return nil, fmt.Errorf("ping %s: %w", c.addr, err)
	}
	return c, nil
}

// Start is one test's own PostgreSQL: the server EnvURL names, or a
// cluster (fsync off) launched in a directory of the test's and stopped
// when it ends. For a package whose tests do not share one.
func Start(tb testing.TB) *Cluster {
	tb.Helper()
	if raw := os.Getenv(EnvURL); raw != "" {
		c, err := external(raw)
		if err != nil {
			tb.Fatalf("postgres from %s: %v", EnvURL, err)
		}
		return c
	}
	c, err := Launch(tb.TempDir(), false)
	if err != nil {
		tb.Fatalf("start postgres: %v", err)
	}
	tb.Cleanup(func() {
		if err := c.Stop(); err != nil {
			tb.Errorf("stop postgres: %v", err)
		}
	})
	return c
}
