package pg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
	if err := c.ddl(ctx, createSchema, name); err != nil {
		tb.Fatalf("create schema %s on %s: %v", name, c.addr, err)
	}
	tb.Cleanup(func() {
		// tb's context is done by now; the drop gets its own.
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		if err := c.ddl(ctx, dropSchema, name); err != nil {
			tb.Errorf("drop schema %s on %s: %v", name, c.addr, err)
		}
	})
	u := c.parsedURL(tb)
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// newName is a name no other test has: a counter for this cluster, and
// random hex for the other test binaries sharing a server.
func (c *Cluster) newName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand's Read never fails
	return prefix + "_" + strconv.FormatUint(c.seq.Add(1), 10) + "_" + hex.EncodeToString(b)
}

// parsedURL is the cluster's URL, parsed. Its errors do not repeat the
// URL, which may hold a password.
func (c *Cluster) parsedURL(tb testing.TB) *url.URL {
	tb.Helper()
	u, err := url.Parse(c.url)
	if err != nil {
		tb.Fatalf("the URL of the server at %s does not parse", c.addr)
	}
	return u
}

// ddl runs one of the schema statements with name on a new connection.
func (c *Cluster) ddl(ctx context.Context, stmt, name string) error {
	conn, err := pgx.Connect(ctx, c.url)
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
