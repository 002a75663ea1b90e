package bench

import (
	"context"
	"database/sql"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestTheWALIndexNamesThePagesTheWALHolds holds the page recording of
// walCounter to the WAL file itself: every frame header names its page
// (fileformat.html, "WAL File Format"), so the pages the counter read from
// the wal-index must be exactly the pages in the file's frames. One
// transaction writes more frames than the wal-index's first block holds,
// and a restart must file the generation whole.
func TestTheWALIndexNamesThePagesTheWALHolds(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "pages.db")
	db, err := sql.Open("sqlite3", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	for _, q := range []string{
		`PRAGMA page_size = 1024`,
		`PRAGMA journal_mode = WAL`,
		`PRAGMA wal_autocheckpoint = 0`,
		`CREATE TABLE blobs (id INTEGER PRIMARY KEY, b BLOB NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	w, err := installWALCounter(ctx, db, path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	w.recordPages()

	// About 5,000 pages in one commit: past the first block's 4,062.
	if _, err := db.ExecContext(ctx, `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000)
		INSERT INTO blobs (b) SELECT randomblob(900) FROM n`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE blobs SET b = randomblob(900) WHERE id % 97 = 0`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.sample(); err != nil {
		t.Fatal(err)
	}
	want := walFramePages(t, path+"-wal")
	if len(want) <= walIndexFirstFrames {
		t.Fatalf("the WAL holds %d distinct pages; the test needs more than %d", len(want), walIndexFirstFrames)
	}
	var got []uint32
	for p := range w.gen {
		got = append(got, p)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("wal-index named %d pages, the WAL's frames %d (first difference: %v)", len(got), len(want), firstDifference(got, want))
	}

	// A checkpoint that completes lets the next commit start the WAL over;
	// the finished generation is filed whole, and the new one after it.
	if _, err := db.ExecContext(ctx, `PRAGMA wal_checkpoint(RESTART)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE blobs SET b = randomblob(900) WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.sample(); err != nil {
		t.Fatal(err)
	}
	next := walFramePages(t, path+"-wal")
	if filed := w.takePages(); !slices.Equal(filed, append(want, next...)) {
		t.Fatalf("filed %d pages, want the first generation's %d and then the second's %d", len(filed), len(want), len(next))
	}
}

// walFramePages reads the distinct page numbers of a WAL file's frames
// (big-endian, the first field of each 24-byte frame header after the
// 32-byte file header), stopping at the first frame of a stale generation.
func walFramePages(t *testing.T, walPath string) []uint32 {
	t.Helper()
	b, err := os.ReadFile(walPath)
	if err != nil {
		t.Fatal(err)
	}
	pageSize := int(binary.BigEndian.Uint32(b[8:12]))
	salt := b[16:24]
	seen := map[uint32]struct{}{}
	for off := 32; off+24+pageSize <= len(b); off += 24 + pageSize {
		if string(b[off+8:off+16]) != string(salt) {
			break
		}
		seen[binary.BigEndian.Uint32(b[off:off+4])] = struct{}{}
	}
	pages := make([]uint32, 0, len(seen))
	for p := range seen {
		pages = append(pages, p)
	}
	slices.Sort(pages)
	return pages
}

func firstDifference(a, b []uint32) any {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return []uint32{a[i], b[i]}
		}
	}
	return "one is a prefix of the other"
}
