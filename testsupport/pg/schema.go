package pg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
)

// An identifier cannot be a bound parameter, so schemas are made and
// dropped through a function of the session's own (pg_temp, gone with the
// connection, so it leaves nothing in a shared server and two test
// binaries never race to define it) that quotes the name it is given.
const (
	createDDLFunction = `CREATE FUNCTION pg_temp.ddl(tmpl text, name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE format(tmpl, name);
END
$$`
	createSchema = `SELECT pg_temp.ddl('CREATE SCHEMA %I', $1)`
	dropSchema   = `SELECT pg_temp.ddl('DROP SCHEMA IF EXISTS %I CASCADE', $1)`
)

// Schema makes a fresh schema in the cluster's default database for tb
// and returns a URL of that database whose connections have search_path
// set to the schema alone, so a test's unqualified tables are its own.
// The schema and everything in it is dropped when tb ends; a connection
// still open then in a transaction that holds its locks would stall the
// drop, so close connections in a cleanup registered after Schema (which
// runs before Schema's).
func (c *Cluster) Schema(tb testing.TB) string {
	tb.Helper()
	name := c.newName("t")
	ctx, cancel := context.WithTimeout(tb.Context(), adminTimeout)
	defer cancel()
	u, err := CreateSchema(ctx, c.url, name)
	if err != nil {
		tb.Fatalf("create schema %s on %s: %v", name, c.addr, err)
	}
	tb.Cleanup(func() {
		// tb's context is done by now; the drop gets its own.
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		if err := DropSchema(ctx, c.url, name); err != nil {
			tb.Errorf("drop schema %s on %s: %v", name, c.addr, err)
		}
	})
	return u
}

// CreateSchema makes the schema name on the server server names and
// returns a URL of that server whose connections have search_path set to
// the schema alone. For programs that are not tests (Cluster.Schema is the
// tests' way); no error repeats server, which may hold a password.
func CreateSchema(ctx context.Context, server, name string) (string, error) {
	u, err := url.Parse(server)
	if err != nil {
		return "", errors.New("the server's URL does not parse")
	}
	if err := ddl(ctx, server, createSchema, name); err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// DropSchema drops the schema name, and everything in it, on the server
// server names.
func DropSchema(ctx context.Context, server, name string) error {
	return ddl(ctx, server, dropSchema, name)
}

// newName is a name no other test has: a counter for this cluster, and
// random hex for the other test binaries sharing a server.
func (c *Cluster) newName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand's Read never fails
	return prefix + "_" + strconv.FormatUint(c.seq.Add(1), 10) + "_" + hex.EncodeToString(b)
}

// ddl runs one of the schema statements with name on a new connection to
// server.
func ddl(ctx context.Context, server, stmt, name string) error {
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, createDDLFunction); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, stmt, name)
	return err
}
