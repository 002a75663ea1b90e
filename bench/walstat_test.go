package bench

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/mattn/go-sqlite3"
)

// WAL bytes per event is the admission ceiling (docs/ARCHITECTURE.md), so it is
// measured exactly rather than inferred from file sizes: the -wal file
// never shrinks, and after a checkpoint SQLite rewrites it from the start.
//
// Method. SQLite's per-connection counter (sqlite3_db_status
// SQLITE_DBSTATUS_CACHE_WRITE) is not reachable through mattn/go-sqlite3,
// so walCounter reads the wal-index header SQLite keeps in the -shm file
// (https://www.sqlite.org/walformat.html §2.2: mxFrame, the frames in the
// WAL, and the salts, which change whenever the WAL restarts after a
// checkpoint). A commit hook on the writer's only connection samples the
// header at every commit. The hook runs before that commit writes its
// frames, so each sample sees every earlier commit; restarts happen only
// when a commit writes its first frame, after the sample. Summing the
// growth of mxFrame across samples, and the whole mxFrame of a new
// generation after a restart, counts every frame appended. A frame is
// page_size + 24 bytes. (A transaction that spills its cache into the WAL
// before committing could hide one commit's frames behind a restart; with
// the writer's cache and small batches that does not happen here.)
//
// Alongside, wchar from /proc/self/io counts every byte the process
// passed to write(2): WAL frames plus checkpoint copies into the main
// file, i.e. the whole write amplification.
type walCounter struct {
	shm *os.File

	mu       sync.Mutex
	started  bool
	pageSize int
	salt     [8]byte
	mx       uint32
	stats    walStats
	err      error

	// With record set, the counter also keeps the page numbers each WAL
	// generation wrote (the pages the checkpoint before its restart
	// copied into the database file), for the I/O floor (iofloor_test.go).
	record  bool
	gen     map[uint32]struct{}
	copied  []uint32
	scratch []byte // page numbers read from the wal-index, reused per commit
}

// walStats are cumulative counts since the counter was installed.
type walStats struct {
	// Frames is the WAL frames appended; Commits the transactions
	// committed; Restarts the times the WAL began again at frame 1 (each
	// after a completed checkpoint).
	Frames, Commits, Restarts int64
}

// walIndexVersion is the only wal-index format SQLite has shipped.
const walIndexVersion = 3007000

// installWALCounter hooks the writer connection of db (a pool of exactly
// one connection, idle at the time of the call) whose file is dbPath.
func installWALCounter(ctx context.Context, db *sql.DB, dbPath string) (*walCounter, error) {
	shm, err := os.Open(dbPath + "-shm")
	if err != nil {
		return nil, fmt.Errorf("wal counter: %w", err)
	}
	w := &walCounter{shm: shm}
	w.mu.Lock()
	w.observeLocked()
	err = w.err
	w.mu.Unlock()
	if err != nil {
		shm.Close()
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		shm.Close()
		return nil, err
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(*sqlite3.SQLiteConn)
		if !ok {
			return fmt.Errorf("wal counter: driver connection is %T", dc)
		}
		c.RegisterCommitHook(func() int {
			w.mu.Lock()
			w.stats.Commits++
			w.observeLocked()
			w.mu.Unlock()
			return 0 // never veto the commit
		})
		return nil
	})
	if err != nil {
		shm.Close()
		return nil, err
	}
	return w, nil
}

// observeLocked samples the wal-index header and accounts for the frames
// appended since the previous sample.
func (w *walCounter) observeLocked() {
	var hdr [48]byte
	if _, err := w.shm.ReadAt(hdr[:], 0); err != nil {
		w.err = fmt.Errorf("read wal-index header: %w", err)
		return
	}
	// The header is written in the machine's byte order.
	if v := binary.NativeEndian.Uint32(hdr[0:4]); v != walIndexVersion {
		w.err = fmt.Errorf("wal-index version %d, want %d", v, walIndexVersion)
		return
	}
	pageSize := int(binary.NativeEndian.Uint16(hdr[14:16]))
	if pageSize == 1 {
		pageSize = 65536
	}
	mx := binary.NativeEndian.Uint32(hdr[16:20])
	var salt [8]byte
	copy(salt[:], hdr[32:40])
	from := w.mx
	switch {
	case !w.started:
		w.started = true
	case salt != w.salt:
		w.stats.Restarts++
		w.stats.Frames += int64(mx)
		w.endGeneration()
		from = 0
	case mx >= w.mx:
		w.stats.Frames += int64(mx - w.mx)
	}
	if w.record && mx > from {
		if err := w.notePages(from+1, mx); err != nil {
			w.err = err
			return
		}
	}
	w.pageSize, w.salt, w.mx = pageSize, salt, mx
}

// The wal-index keeps the page number of every frame (walformat.html, its
// hash tables): blocks of 32 KiB, each an array of page numbers followed
// by a hash table; the first block starts after the 136-byte header and so
// holds fewer.
const (
	walIndexBlock        = 32 << 10
	walIndexHeader       = 136
	walIndexFirstFrames  = (walIndexBlock/2 - walIndexHeader) / 4
	walIndexFramesPerBlk = walIndexBlock / 2 / 4
)

// framePageOffset is where the wal-index holds frame's page number.
func framePageOffset(frame uint32) int64 {
	if frame <= walIndexFirstFrames {
		return walIndexHeader + int64(frame-1)*4
	}
	k := int64(frame - walIndexFirstFrames - 1)
	return (1+k/walIndexFramesPerBlk)*walIndexBlock + k%walIndexFramesPerBlk*4
}

// notePages adds the pages of frames from..to (inclusive) to the current
// generation, reading each block's run of page numbers at once: the hook
// runs on the writer's thread, inside the commit being measured.
func (w *walCounter) notePages(from, to uint32) error {
	if w.gen == nil {
		w.gen = map[uint32]struct{}{}
	}
	for from <= to {
		last := to
		if from <= walIndexFirstFrames {
			last = min(to, walIndexFirstFrames)
		} else {
			blockEnd := walIndexFirstFrames + ((from-walIndexFirstFrames-1)/walIndexFramesPerBlk+1)*walIndexFramesPerBlk
			last = min(to, blockEnd)
		}
		buf := slices.Grow(w.scratch[:0], int(4*(last-from+1)))[:4*(last-from+1)]
		w.scratch = buf
		if _, err := w.shm.ReadAt(buf, framePageOffset(from)); err != nil {
			return fmt.Errorf("read wal-index page numbers: %w", err)
		}
		for i := 0; i < len(buf); i += 4 {
			w.gen[binary.NativeEndian.Uint32(buf[i:])] = struct{}{}
		}
		from = last + 1
	}
	return nil
}

// endGeneration files the finished generation's pages, in the page order
// a checkpoint copies them in.
func (w *walCounter) endGeneration() {
	start := len(w.copied)
	for p := range w.gen {
		w.copied = append(w.copied, p)
	}
	slices.Sort(w.copied[start:])
	clear(w.gen)
}

// recordPages starts keeping the pages of each WAL generation from now on.
func (w *walCounter) recordPages() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.record, w.copied = true, nil
	clear(w.gen)
}

// takePages returns the pages each generation since recordPages (or the
// last takePages) wrote, the current one included (the next checkpoint
// copies those), and forgets them.
func (w *walCounter) takePages() []uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.endGeneration()
	p := w.copied
	w.copied = nil
	return p
}

// sample takes a fresh reading (call it while the writer is idle, so the
// last commit's frames are counted) and returns the totals so far.
func (w *walCounter) sample() (walStats, int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.observeLocked()
	return w.stats, w.pageSize, w.err
}

// close releases the -shm handle. The hook stays on the connection until
// it closes; later samples only record an error nobody reads.
func (w *walCounter) close() { w.shm.Close() }

// walBytes converts frames to bytes: each frame is a 24-byte header and
// one page.
func walBytes(frames int64, pageSize int) int64 { return frames * int64(pageSize+24) }

// processWriteChars returns wchar from /proc/self/io: bytes this process
// passed to write-family system calls. ok is false where /proc is absent.
func processWriteChars() (int64, bool) {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "wchar:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
