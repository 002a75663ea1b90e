package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store"
)

// Fixtures are built by bulk insertion, not admission: admitting 10^6
// events one sync batch at a time would take minutes, while the rows
// admission writes for a settled text message are simple and fixed (a
// test, TestFixtureMatchesAdmission, holds the two to the same bytes).
// The build uses throwaway pragmas (no journal, no fsync, a large cache);
// benchmarks then open a copy through store.Open, which sets the real ones.

// fixtureTxRows is the rows per build transaction: large enough that
// commits cost nothing, small enough to bound the dirty cache.
const fixtureTxRows = 50_000

// Build-only pragmas. journal_mode=OFF is safe because a failed build is
// thrown away: the file only reaches the cache by rename once complete.
var buildPragmas = []string{
	`PRAGMA journal_mode = OFF`,
	`PRAGMA synchronous = OFF`,
	`PRAGMA cache_size = -262144`,
	`PRAGMA temp_store = MEMORY`,
}

const (
	fixtureInsertJournal = `INSERT INTO journal_events
		(seq, principal, id_hash, event_id, room_id, thread_id, target_id, kind, class, provenance, state, epoch, received_ms)
		VALUES (?, ?, ?, ?, ?, '', '', ?, ?, ?, 1, 0, ?)`
	fixtureInsertVisible = `INSERT INTO visible_messages
		(seq, room, thread_id, event_id, sender, created_ts, revision_id, revision_ts, content_json, refresh_token, epoch)
		VALUES (?, ?, '', ?, ?, ?, '', ?, ?, NULL, 0)`
	// Rooms are interned on first sight, as admission does, so the keys
	// come out the same.
	fixtureInsertRoom = `INSERT INTO rooms (principal, room_id) VALUES (?, ?)`
)

// countInRoom counts the visible rows of (principal, room ID).
const countInRoom = `SELECT count(*) FROM visible_messages v JOIN rooms r ON r.id = v.room
	WHERE r.principal = ? AND r.room_id = ?`

// fixtureName keys a cached file by everything that decides its bytes.
func fixtureName(kind string, spec fixtureSpec, schema int) string {
	return fmt.Sprintf("%s-%s-schema%d-gen%d-n%d.db", kind, spec.Layout, schema, genVersion, spec.N)
}

// staleFixtures matches the same fixture under any schema or generator
// version, so a rebuild can drop the copies it supersedes (each full-size
// one is hundreds of MB).
func staleFixtures(kind string, spec fixtureSpec) string {
	return fmt.Sprintf("%s-%s-schema*-gen*-n%d.db", kind, spec.Layout, spec.N)
}

// cachedFixture returns the cached file for name, building it with build
// (into a private directory, renamed into place when complete) if absent.
// A build removes the superseded files matching stale.
func cachedFixture(tb testing.TB, name, stale string, build func(dir string) (string, error)) string {
	tb.Helper()
	dir, err := cacheDir()
	if err != nil {
		tb.Fatalf("fixture cache: %v", err)
	}
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err == nil {
		return path
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		tb.Fatalf("fixture build dir: %v", err)
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	built, err := build(tmp)
	if err != nil {
		tb.Fatalf("build fixture %s: %v", name, err)
	}
	for _, side := range []string{"-wal", "-shm", "-journal"} {
		if _, err := os.Stat(built + side); err == nil {
			tb.Fatalf("build fixture %s: %s left behind; the file is not self-contained", name, side)
		}
	}
	if err := os.Rename(built, path); err != nil {
		tb.Fatalf("cache fixture %s: %v", name, err)
	}
	tb.Logf("built fixture %s in %v (%d MB)", name, time.Since(start).Round(time.Millisecond), fileSize(path)>>20)
	old, _ := filepath.Glob(filepath.Join(dir, stale))
	for _, f := range old {
		if f != path {
			os.Remove(f)
		}
	}
	return path
}

// storeFixture returns the cached journal file holding spec's messages,
// settled, in the real schema.
func storeFixture(tb testing.TB, spec fixtureSpec) string {
	tb.Helper()
	name := fixtureName("journal", spec, sqlitefs.SchemaVersion())
	return cachedFixture(tb, name, staleFixtures("journal", spec), func(dir string) (string, error) {
		return buildStoreFixture(context.Background(), dir, spec)
	})
}

// buildStoreFixture creates a journal under dir holding spec's messages
// as admission leaves settled live text messages, and returns its path.
func buildStoreFixture(ctx context.Context, dir string, spec fixtureSpec) (string, error) {
	// The principals go through the store itself, so their rows (and the
	// schema, application id and generation) are exactly what it writes.
	s, err := store.Open(ctx, store.Options{StorageDir: dir})
	if err != nil {
		return "", err
	}
	ids := make([]int64, spec.Principals)
	for p := range ids {
		if _, err := s.Principal(ctx, agentName(p), agentUser(p)); err != nil {
			s.Close()
			return "", err
		}
		sp, ok, err := journalsql.LookupPrincipal(ctx, s.DB().Reader(), journal.Principal{Agent: agentName(p), UserID: agentUser(p)})
		if err != nil || !ok {
			s.Close()
			return "", fmt.Errorf("principal %d not registered: %v", p, err)
		}
		ids[p] = sp.ID
	}
	path := s.DB().Path
	if err := s.Close(); err != nil {
		return "", err
	}
	roomKeys := map[[2]int]int64{}
	if err := bulkLoad(ctx, path, []string{fixtureInsertJournal, fixtureInsertVisible, fixtureInsertRoom}, spec,
		func(stmts []*sql.Stmt, i int, m fixtureMessage) error {
			seq := int64(i + 1)
			key, ok := roomKeys[[2]int{m.Principal, m.Room}]
			if !ok {
				r, err := stmts[2].Exec(ids[m.Principal], roomID(m.Room))
				if err != nil {
					return err
				}
				if key, err = r.LastInsertId(); err != nil {
					return err
				}
				roomKeys[[2]int{m.Principal, m.Room}] = key
			}
			if _, err := stmts[0].Exec(seq, ids[m.Principal], sqlitefs.IDHash(m.EventID), m.EventID, roomID(m.Room),
				int(journal.KindMessage), int(journal.Actionable), int(journal.Live), fixtureReceivedMS); err != nil {
				return err
			}
			_, err := stmts[1].Exec(seq, key, m.EventID, m.Sender, m.TS, m.TS, contentJSON(m.Body))
			return err
		}); err != nil {
		return "", err
	}
	return path, mergeAll(ctx, dir)
}

// mergeAll opens the journal under dir and merges its page index's whole
// tail, as the store does when admission pauses, so a fixture starts the
// way a journal at rest is.
func mergeAll(ctx context.Context, dir string) error {
	s, err := store.Open(ctx, store.Options{StorageDir: dir})
	if err != nil {
		return err
	}
	if _, err := s.MergePageTail(ctx); err != nil {
		s.Close()
		return err
	}
	return s.Close()
}

// bulkLoad inserts spec's messages into the file at path through the
// given statements, fixtureTxRows per transaction, then switches the file
// back to WAL so the cached bytes are what a real open expects.
func bulkLoad(ctx context.Context, path string, queries []string, spec fixtureSpec,
	insert func(stmts []*sql.Stmt, i int, m fixtureMessage) error) (err error) {
	db, err := openBuild(ctx, path)
	if err != nil {
		return err
	}
	defer func() {
		if e := db.Close(); err == nil {
			err = e
		}
	}()
	prepared := make([]*sql.Stmt, len(queries))
	for i, q := range queries {
		if prepared[i], err = db.PrepareContext(ctx, q); err != nil {
			return fmt.Errorf("prepare: %w", err)
		}
		defer prepared[i].Close()
	}
	var (
		tx    *sql.Tx
		stmts = make([]*sql.Stmt, len(queries))
	)
	err = spec.each(func(i int, m fixtureMessage) error {
		if i%fixtureTxRows == 0 {
			if tx != nil {
				if err := tx.Commit(); err != nil {
					return err
				}
			}
			if tx, err = db.BeginTx(ctx, nil); err != nil {
				return err
			}
			for k, p := range prepared {
				stmts[k] = tx.Stmt(p)
			}
		}
		return insert(stmts, i, m)
	})
	if tx != nil {
		if err == nil {
			err = tx.Commit()
		} else {
			_ = tx.Rollback()
		}
	}
	if err != nil {
		return err
	}
	var mode string
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode = WAL`).Scan(&mode); err != nil || mode != "wal" {
		return fmt.Errorf("restore WAL: %q %v", mode, err)
	}
	return nil
}

// openBuild opens one connection with the build-only pragmas.
func openBuild(ctx context.Context, path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite3", "file:"+path)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	for _, p := range buildPragmas {
		rows, err := db.QueryContext(ctx, p)
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		rows.Close()
	}
	return db, nil
}

// principalIDs returns the interned ID of every fixture principal.
func principalIDs(ctx context.Context, s *store.Store, n int) ([]int64, error) {
	ids := make([]int64, n)
	for p := range ids {
		sp, ok, err := journalsql.LookupPrincipal(ctx, s.DB().Reader(), journal.Principal{Agent: agentName(p), UserID: agentUser(p)})
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("fixture principal %s missing", agentName(p))
		}
		ids[p] = sp.ID
	}
	return ids, nil
}

// verifyConversation checks, through the public reader, that a room holds
// n messages in page order: the first page is full, ascending and ends
// with the cursor, and the next pages continue strictly older.
func verifyConversation(ctx context.Context, s *store.Store, v journal.ConversationReader, pid int64, room string, n int) error {
	var count int
	if err := s.DB().QueryPool().QueryRowContext(ctx,
		countInRoom, pid, room).Scan(&count); err != nil {
		return err
	}
	if count != n {
		return fmt.Errorf("room holds %d visible rows, want %d", count, n)
	}
	const limit = 50
	var (
		before *journal.Cursor
		seen   int
	)
	for pageNo := 0; pageNo < 3; pageNo++ {
		page, err := v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: limit, Before: before})
		if err != nil {
			return err
		}
		want := min(limit, n-seen)
		if len(page.Messages) != want || len(page.OwedRefetch) != 0 {
			return fmt.Errorf("page %d: %d messages, %d owed; want %d, 0", pageNo, len(page.Messages), len(page.OwedRefetch), want)
		}
		for i := 1; i < len(page.Messages); i++ {
			if !older(page.Messages[i-1], page.Messages[i]) {
				return fmt.Errorf("page %d: messages %d and %d out of order", pageNo, i-1, i)
			}
		}
		if before != nil && len(page.Messages) > 0 {
			newest := page.Messages[len(page.Messages)-1]
			if !older(newest, journal.Message{CreatedTS: before.CreatedTS, EventID: before.EventID}) {
				return fmt.Errorf("page %d does not continue below its cursor", pageNo)
			}
		}
		seen += len(page.Messages)
		if page.NextCursor == nil {
			if seen != n {
				return fmt.Errorf("walk ended after %d of %d messages", seen, n)
			}
			return nil
		}
		oldest := page.Messages[0]
		if page.NextCursor.CreatedTS != oldest.CreatedTS || page.NextCursor.EventID != oldest.EventID {
			return errors.New("next cursor is not the page's oldest message")
		}
		before = page.NextCursor
	}
	return nil
}

// older reports a < b in page order: (created_ts, event_id), byte order.
func older(a, b journal.Message) bool {
	if a.CreatedTS != b.CreatedTS {
		return a.CreatedTS < b.CreatedTS
	}
	return a.EventID < b.EventID
}
