package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/mindroomd/mindroomd/testsupport/pg"
)

// pgAdminTimeout bounds making or dropping the soak's schema on a server
// of pg.EnvURL's.
const pgAdminTimeout = 30 * time.Second

// pgJournal is the PostgreSQL the daemon keeps its journal in under -pg: a
// durable cluster (every commit synced to disk) launched in the working
// directory, or, when pg.EnvURL names a server, a new schema of its own
// there.
type pgJournal struct {
	// url is the daemon's: it may hold a password, so it is never printed.
	url string
	// cluster is the launched cluster, nil on a server of pg.EnvURL's.
	cluster *pg.Cluster
	// admin and schema are the server's URL and the soak's schema on it,
	// for a server of pg.EnvURL's.
	admin, schema string
	// where says, printably, where the journal is.
	where string
}

// startPG launches a durable cluster in dir/postgres, or makes a schema on
// the server pg.EnvURL names.
func startPG(ctx context.Context, dir string) (*pgJournal, error) {
	if raw := os.Getenv(pg.EnvURL); raw != "" {
		return newSchema(ctx, raw)
	}
	pgDir := filepath.Join(dir, "postgres")
	if err := os.Mkdir(pgDir, 0o700); err != nil {
		return nil, err
	}
	c, err := pg.Launch(pgDir, true)
	if err != nil {
		return nil, fmt.Errorf("launch postgres: %w", err)
	}
	return &pgJournal{url: c.URL(), cluster: c,
		where: fmt.Sprintf("a durable cluster at %s (log %s)", c.Addr(), filepath.Join(pgDir, "postgres.log"))}, nil
}

// newSchema makes a schema of a new name on the server raw names and
// returns a journal whose URL puts the daemon's tables in it. No error
// repeats raw: it may hold a password.
func newSchema(ctx context.Context, raw string) (*pgJournal, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		return nil, fmt.Errorf("%s is not a postgres://host:port/database URL", pg.EnvURL)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand's Read never fails
	j := &pgJournal{admin: raw, schema: "soak_" + hex.EncodeToString(b)}
	ctx, cancel := context.WithTimeout(ctx, pgAdminTimeout)
	defer cancel()
	if j.url, err = pg.CreateSchema(ctx, raw, j.schema); err != nil {
		return nil, fmt.Errorf("create schema %s on %s: %w", j.schema, u.Host, err)
	}
	j.where = fmt.Sprintf("schema %s of the server at %s (%s)", j.schema, u.Host, pg.EnvURL)
	return j, nil
}

// writeURL writes the daemon's URL into path, readable by its owner alone.
func (j *pgJournal) writeURL(path string) error {
	return os.WriteFile(path, []byte(j.url+"\n"), 0o600)
}

// finish stops a launched cluster, whose data and log stay in the working
// directory; on a server of pg.EnvURL's it drops the soak's schema when
// drop says so, and otherwise says where it was kept.
func (j *pgJournal) finish(drop bool, logf func(string, ...any)) error {
	if j.cluster != nil {
		return j.cluster.Stop()
	}
	if !drop {
		logf("journal kept in %s", j.where)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), pgAdminTimeout)
	defer cancel()
	return pg.DropSchema(ctx, j.admin, j.schema)
}
