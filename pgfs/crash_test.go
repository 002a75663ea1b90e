package pgfs_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/mindroomd/mindroomd/store"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mindroomd/mindroomd/testsupport/crash"
)

// crashChildURLEnv, when set, makes TestCrashChildProcess the child of the
// crash proof (package crash), admitting into the journal at that URL; the
// TestMain then starts no cluster of its own. The URL may hold a password.
const crashChildURLEnv = "MINDROOMD_CRASH_CHILD_PG_URL"

const (
	listCrashEvents = `SELECT event_id FROM journal_events`
	// countSessions counts the server's sessions of one client, by the
	// application name the child connects under.
	countSessions = `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`
)

// quiescePoll spaces the looks at pg_stat_activity after a kill; a dead
// client's sessions usually end within milliseconds.
const quiescePoll = 5 * time.Millisecond

func openCrashStore(ctx context.Context, dbURL string) (*store.Store, error) {
	return store.Open(ctx, store.Options{DatabaseURL: dbURL})
}

// connectCrash connects to the journal's schema. A parse error would quote
// the URL, which may hold a password, so none is passed on.
func connectCrash(ctx context.Context, dbURL string) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return nil, errors.New("the database URL does not parse")
	}
	return conn, err
}

// crashEventIDs reads the journal's rows beneath the store, on a
// connection of its own.
func crashEventIDs(dbURL string) func(context.Context, *store.Store) ([]string, error) {
	return func(ctx context.Context, _ *store.Store) ([]string, error) {
		conn, err := connectCrash(ctx, dbURL)
		if err != nil {
			return nil, err
		}
		defer conn.Close(context.Background())
		rows, err := conn.Query(ctx, listCrashEvents)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[string])
	}
}

// crashQuiesce waits until the server has ended every session of the
// killed child. A session the kill left running may still be executing
// what the child sent last, a COMMIT included, and so change the journal
// after the parent looked. The server announces the end of a session
// nowhere a client can wait on, so this polls, bounded by ctx.
func crashQuiesce(dbURL, app string) func(context.Context) error {
	return func(ctx context.Context) error {
		conn, err := connectCrash(ctx, dbURL)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		tick := time.NewTicker(quiescePoll)
		defer tick.Stop()
		for {
			var n int
			if err := conn.QueryRow(ctx, countSessions, app).Scan(&n); err != nil {
				return fmt.Errorf("count the child's sessions: %w", err)
			}
			if n == 0 {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%d sessions of the killed child still open: %w", n, ctx.Err())
			case <-tick.C:
			}
		}
	}
}

// TestCrashChildProcess is the child half of the crash proof; run normally
// it returns at once. As the child it never returns: it admits batches until
// it is killed.
func TestCrashChildProcess(t *testing.T) {
	dbURL := os.Getenv(crashChildURLEnv)
	if dbURL == "" {
		return
	}
	crash.Child(t, func(ctx context.Context) (*store.Store, error) { return openCrashStore(ctx, dbURL) })
}

// The kill ends the client alone: the server keeps running, and must roll
// back whatever the dead client left uncommitted.
func TestCrashSIGKILLMidAdmissionLosesNoAcknowledgedBatchAndTearsNone(t *testing.T) {
	if os.Getenv(crashChildURLEnv) != "" {
		return // this process is a child
	}
	schema := cluster.Schema(t)
	// The child connects under an application name of its own, so the
	// parent can tell its sessions from every other.
	app := fmt.Sprintf("mindroomd-crash-child-%d", os.Getpid())
	u, err := url.Parse(schema)
	if err != nil {
		t.Fatal("the schema's URL does not parse")
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	childURL := u.String()
	quiesce := crashQuiesce(schema, app)
	checkQuiesceSeesChild(t, schema, childURL, app, quiesce)
	crash.Run(t, crash.Seed(t), crash.Journal[*store.Store]{
		ChildTest: "TestCrashChildProcess",
		Env:       []string{crashChildURLEnv + "=" + childURL},
		Open:      func(ctx context.Context) (*store.Store, error) { return openCrashStore(ctx, schema) },
		EventIDs:  crashEventIDs(schema),
		Quiesce:   quiesce,
	})
}

// checkQuiesceSeesChild proves the wait after a kill is not vacuous: a
// journal opened on the child's URL has sessions under app, and quiesce
// returns once they are gone.
func checkQuiesceSeesChild(t *testing.T, schema, childURL, app string, quiesce func(context.Context) error) {
	t.Helper()
	ctx := t.Context()
	s, err := openCrashStore(ctx, childURL)
	if err != nil {
		t.Fatalf("open journal as the child: %v", err)
	}
	conn, err := connectCrash(ctx, schema)
	if err != nil {
		_ = s.Close()
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(ctx, countSessions, app).Scan(&n)
	if cerr := s.Close(); cerr != nil {
		t.Fatalf("close journal: %v", cerr)
	}
	if err != nil {
		t.Fatalf("count the child's sessions: %v", err)
	}
	if n == 0 {
		t.Fatalf("no session under the child's application name while its journal is open")
	}
	if err := quiesce(ctx); err != nil {
		t.Fatalf("after close: %v", err)
	}
}
