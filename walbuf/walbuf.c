// A VFS that wraps the default one and gathers the writes of a WAL file
// into one buffer, passed on as a single write. walbuf.go explains why.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "walbuf.h"

#define WB_OK 0
#define WB_OPEN_WAL 0x00080000

// xSync flags (https://sqlite.org/c3ref/c_sync_dataonly.html). FULL asks
// for more than NORMAL where the system has more (F_FULLFSYNC on macOS);
// DATAONLY allows the file's metadata to be left out.
#define WB_SYNC_NORMAL 0x02
#define WB_SYNC_FULL 0x03
#define WB_SYNC_DATAONLY 0x10

// Frame layout of the WAL file format (https://sqlite.org/fileformat2.html):
// a 32-byte file header, then frames, each a 24-byte header and a page. A
// frame header's second big-endian word is nonzero only on a commit frame.
#define WB_WAL_HEADER 32
#define WB_FRAME_HEADER 24

// WB_CAP bounds one handle's buffer, so one write passed on. The unix VFS
// truncates any single write to 17 bits of length (it expects at most a
// page and its header), so it must stay under 128 KiB. A commit larger than
// this is passed on in several writes of up to WB_CAP bytes.
#define WB_CAP (124 << 10)

// Defined by the driver's amalgamation, linked into the same binary. Weak,
// so this package's own cgo link step does not need the driver.
extern wb_vfs *sqlite3_vfs_find(const char *name) __attribute__((weak));
extern int sqlite3_vfs_register(wb_vfs *vfs, int makeDefault) __attribute__((weak));

// A sync's strength: bit 0 set for SQLITE_SYNC_FULL, bit 1 set unless it
// is SQLITE_SYNC_DATAONLY. A completed sync of strength s covers a request
// of strength r when r has no bit s lacks; WB_SYNC_KINDS indexes both.
#define WB_SYNC_KINDS 4

// syncKind returns the strength of an xSync request, or -1 for flags this
// shim does not know, which it never skips and never counts.
static int syncKind(int flags) {
	int kind = flags & 0x0F;
	if ((flags & ~(0x0F | WB_SYNC_DATAONLY)) != 0 || (kind != WB_SYNC_NORMAL && kind != WB_SYNC_FULL)) {
		return -1;
	}
	return (kind == WB_SYNC_FULL ? 1 : 0) | ((flags & WB_SYNC_DATAONLY) ? 0 : 2);
}

typedef struct wal_file wal_file;

// A WAL file as every handle this process has open on it shares it, keyed
// by device and inode; mu guards what follows it.
//
// written counts the writes passed on, each once it has returned; synced[k]
// is the count that a completed sync at least as strong as kind k covered.
// A sync of kind k that finds synced[k] == written has nothing to make
// durable, whichever handle did the writes and the sync: with
// synchronous=FULL every commit syncs, and the sync a checkpoint starts
// with is then a wasted round trip to the disk. A file first seen counts one
// write, so its first sync always runs.
//
// writer is the handle that wrote to the file last. SQLite lets one
// connection at a time write the WAL, and every commit leaves its handle's
// buffer empty, so whatever another handle still holds gathered when a
// handle starts writing is left from a transaction that ended without a
// commit (rolled back after spilling pages): frames SQLite has abandoned
// and is about to write over. That handle is marked stale, and its buffer
// is dropped rather than passed on over the new frames.
typedef struct wal_inode {
	dev_t dev;
	ino_t ino;
	int refs; // under inodesMu, as is next
	pthread_mutex_t mu;
	wb_i64 written, synced[WB_SYNC_KINDS];
	wal_file *writer; // 0 once it closed
	struct wal_inode *next;
} wal_inode;

static pthread_mutex_t inodesMu = PTHREAD_MUTEX_INITIALIZER;
static wal_inode *inodes;

static wal_inode *acquireInode(const char *name) {
	struct stat st;
	if (name == 0 || stat(name, &st) != 0) {
		return 0; // never skips a sync
	}
	pthread_mutex_lock(&inodesMu);
	wal_inode *n = inodes;
	while (n != 0 && (n->dev != st.st_dev || n->ino != st.st_ino)) {
		n = n->next;
	}
	if (n == 0 && (n = calloc(1, sizeof(*n))) != 0) {
		n->dev = st.st_dev;
		n->ino = st.st_ino;
		pthread_mutex_init(&n->mu, 0);
		n->written = 1;
		n->next = inodes;
		inodes = n;
	}
	if (n != 0) {
		n->refs++;
	}
	pthread_mutex_unlock(&inodesMu);
	return n;
}

static void releaseInode(wal_inode *n) {
	if (n == 0) {
		return;
	}
	pthread_mutex_lock(&inodesMu);
	if (--n->refs == 0) {
		wal_inode **pp = &inodes;
		while (*pp != n) {
			pp = &(*pp)->next;
		}
		*pp = n->next;
		pthread_mutex_destroy(&n->mu);
		free(n);
	}
	pthread_mutex_unlock(&inodesMu);
}

static void lockInode(wal_inode *n) {
	if (n != 0) {
		pthread_mutex_lock(&n->mu);
	}
}

static void unlockInode(wal_inode *n) {
	if (n != 0) {
		pthread_mutex_unlock(&n->mu);
	}
}

struct wal_file {
	wb_file base;
	wb_file *inner;      // the wrapped VFS's file, stored after this struct
	unsigned char *buf;  // gathered bytes, allocated on first write
	int len;             // bytes in buf
	wb_i64 off;          // file offset of buf[0]
	wb_i64 end;          // just past this handle's last write; -1 before any
	int lastLen;         // length of that write
	wb_i64 pageAt;       // where the page of the commit frame whose header
	                     // was the last write starts; -1 if it was not one
	int through;         // pass every write on at once (see walWrite)
	int stale;           // buf holds abandoned frames; under inode->mu
	wal_inode *inode;    // shared counts and writer; 0 if unknown
};

static wb_vfs gathering;
static wb_vfs *wrapped;
static wb_i64 received, passed, synced, skipped;

#define WB_INNER_OFFSET ((sizeof(wal_file) + 15) & ~(size_t)15)

static wb_file *innerOf(wb_file *f) { return ((wal_file *)f)->inner; }

// passOn writes to the wrapped file and counts the write once it returned,
// so a sync that starts later is known to cover it. The caller holds
// p->inode's lock, so no other handle's first write can start until this
// one has returned.
static int passOn(wal_file *p, const void *data, int n, wb_i64 ofst) {
	__atomic_fetch_add(&passed, 1, __ATOMIC_RELAXED);
	int rc = p->inner->pMethods->xWrite(p->inner, data, n, ofst);
	if (p->inode != 0) {
		p->inode->written++;
	}
	return rc;
}

// flushLocked passes the buffer on, or drops it if it is stale. The caller
// holds p->inode's lock.
static int flushLocked(wal_file *p) {
	int n = p->len;
	p->len = 0;
	if (n == 0 || p->stale) {
		p->stale = 0;
		return WB_OK;
	}
	return passOn(p, p->buf, n, p->off);
}

static int flush(wal_file *p) {
	if (p->len == 0) {
		return WB_OK;
	}
	lockInode(p->inode);
	int rc = flushLocked(p);
	unlockInode(p->inode);
	return rc;
}

// claim makes p the file's writer before p changes the file, marking the
// previous writer's buffer stale and dropping p's own if it is.
static void claim(wal_file *p) {
	wal_inode *n = p->inode;
	if (n == 0 || __atomic_load_n(&n->writer, __ATOMIC_ACQUIRE) == p) {
		return;
	}
	pthread_mutex_lock(&n->mu);
	if (n->writer != 0) {
		n->writer->stale = 1;
	}
	if (p->stale) {
		p->stale = 0;
		p->len = 0;
	}
	__atomic_store_n(&n->writer, p, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&n->mu);
}

static int overlapsBuffer(wal_file *p, int n, wb_i64 ofst) {
	return p->len > 0 && ofst < p->off + p->len && ofst + n > p->off;
}

static int walClose(wb_file *f) {
	wal_file *p = (wal_file *)f;
	lockInode(p->inode);
	int rc = flushLocked(p);
	if (p->inode != 0 && p->inode->writer == p) {
		__atomic_store_n(&p->inode->writer, 0, __ATOMIC_RELEASE);
	}
	unlockInode(p->inode);
	int rc2 = p->inner->pMethods->xClose(p->inner);
	releaseInode(p->inode);
	p->inode = 0;
	free(p->buf);
	p->buf = 0;
	return rc != WB_OK ? rc : rc2;
}

static int walRead(wb_file *f, void *out, int n, wb_i64 ofst) {
	wal_file *p = (wal_file *)f;
	if (overlapsBuffer(p, n, ofst)) {
		int rc = flush(p);
		if (rc != WB_OK) {
			return rc;
		}
	}
	return p->inner->pMethods->xRead(p->inner, out, n, ofst);
}

static int isFrameHeader(int n, wb_i64 ofst) {
	return n == WB_FRAME_HEADER && ofst >= WB_WAL_HEADER;
}

static int isCommitFrameHeader(const unsigned char *b, int n, wb_i64 ofst) {
	return isFrameHeader(n, ofst) && (b[4] | b[5] | b[6] | b[7]) != 0;
}

// walWrite gathers a run of writes that each begin where the one before
// ended, and passes everything on before SQLite can publish a commit in the
// WAL index, which it does, whatever the synchronous setting, as soon as its
// last write for the commit returns. That last write is not always the
// commit frame's page:
//
//   - A commit frame's header is gathered only as a fresh append, which
//     SQLite follows at once with the frame's page; that page is passed on
//     with everything before it.
//   - Once a commit frame's page is written, SQLite may still write within
//     the same commit: it rewrites the headers of frames it overwrote in
//     place (a page spilled and dirtied again in one transaction), the
//     commit frame's own header last and with no page after it, and it pads
//     the commit to a sector boundary, splitting a frame around a sync. So
//     every write from a commit frame's page on is passed on at once
//     ("through"), until one starts the next run: the WAL header of a
//     restarted log, or a frame header appended after a page.
//   - A commit frame's header that is not appended to this handle's last
//     write is passed on at once, even outside that stretch.
static int walWrite(wb_file *f, const void *data, int n, wb_i64 ofst) {
	wal_file *p = (wal_file *)f;
	__atomic_fetch_add(&received, 1, __ATOMIC_RELAXED);
	claim(p);
	int appends = ofst == p->end;
	int commitHeader = isCommitFrameHeader(data, n, ofst);
	int commitPage = ofst == p->pageAt;
	if ((ofst == 0 && n == WB_WAL_HEADER) || (appends && isFrameHeader(n, ofst) && p->lastLen != WB_FRAME_HEADER)) {
		p->through = 0;
	}
	p->end = ofst + n;
	p->lastLen = n;
	p->pageAt = commitHeader ? ofst + n : -1;
	if (p->buf == 0) {
		p->buf = malloc(WB_CAP);
	}
	int rc;
	if (p->buf == 0 || n > WB_CAP || p->through || (commitHeader && !appends)) {
		lockInode(p->inode);
		rc = flushLocked(p);
		if (rc == WB_OK) {
			rc = passOn(p, data, n, ofst);
		}
		unlockInode(p->inode);
	} else {
		if (p->len == 0 || ofst != p->off + p->len || p->len + n > WB_CAP) {
			rc = flush(p);
			if (rc != WB_OK) {
				return rc;
			}
			p->off = ofst;
		}
		memcpy(p->buf + p->len, data, n);
		p->len += n;
		rc = commitPage ? flush(p) : WB_OK;
	}
	if (commitPage) {
		p->through = 1;
	}
	return rc;
}

static int walTruncate(wb_file *f, wb_i64 size) {
	wal_file *p = (wal_file *)f;
	claim(p);
	lockInode(p->inode);
	int rc = flushLocked(p);
	if (rc == WB_OK) {
		rc = p->inner->pMethods->xTruncate(p->inner, size);
		if (p->inode != 0) {
			p->inode->written++;
		}
	}
	unlockInode(p->inode);
	return rc;
}

// walSync skips a sync only when the counts prove that a completed sync at
// least as strong covered every write: a request with SQLITE_SYNC_FULL
// needs an earlier FULL sync, one without SQLITE_SYNC_DATAONLY an earlier
// sync without it; a NORMAL DATAONLY request is covered by any. A handle
// whose file is unknown, and flags this shim does not know, always sync.
// The unix VFS also syncs the directory on a WAL handle's first sync; the
// file's first sync in this process always runs, so the directory entry is
// never left to a skipped one.
static int walSync(wb_file *f, int flags) {
	wal_file *p = (wal_file *)f;
	int rc = flush(p);
	if (rc != WB_OK) {
		return rc;
	}
	wal_inode *n = p->inode;
	int kind = syncKind(flags);
	wb_i64 covers = 0;
	if (n != 0 && kind >= 0) {
		pthread_mutex_lock(&n->mu);
		covers = n->written;
		int clean = n->synced[kind] >= covers;
		pthread_mutex_unlock(&n->mu);
		if (clean) {
			__atomic_fetch_add(&skipped, 1, __ATOMIC_RELAXED);
			return WB_OK;
		}
	}
	__atomic_fetch_add(&synced, 1, __ATOMIC_RELAXED);
	rc = p->inner->pMethods->xSync(p->inner, flags);
	if (rc == WB_OK && n != 0 && kind >= 0) {
		pthread_mutex_lock(&n->mu);
		for (int k = 0; k < WB_SYNC_KINDS; k++) {
			if ((k & ~kind) == 0 && n->synced[k] < covers) {
				n->synced[k] = covers;
			}
		}
		pthread_mutex_unlock(&n->mu);
	}
	return rc;
}

static int walFileSize(wb_file *f, wb_i64 *size) {
	wal_file *p = (wal_file *)f;
	int rc = flush(p);
	return rc != WB_OK ? rc : p->inner->pMethods->xFileSize(p->inner, size);
}

static int walFileControl(wb_file *f, int op, void *arg) {
	wal_file *p = (wal_file *)f;
	int rc = flush(p);
	return rc != WB_OK ? rc : p->inner->pMethods->xFileControl(p->inner, op, arg);
}

// The remaining methods pass straight through to the wrapped file.
static int walLock(wb_file *f, int l) { return innerOf(f)->pMethods->xLock(innerOf(f), l); }
static int walUnlock(wb_file *f, int l) { return innerOf(f)->pMethods->xUnlock(innerOf(f), l); }
static int walCheckReservedLock(wb_file *f, int *out) {
	return innerOf(f)->pMethods->xCheckReservedLock(innerOf(f), out);
}
static int walSectorSize(wb_file *f) { return innerOf(f)->pMethods->xSectorSize(innerOf(f)); }
static int walDeviceCharacteristics(wb_file *f) {
	return innerOf(f)->pMethods->xDeviceCharacteristics(innerOf(f));
}
static int walShmMap(wb_file *f, int pg, int pgsz, int extend, void volatile **pp) {
	return innerOf(f)->pMethods->xShmMap(innerOf(f), pg, pgsz, extend, pp);
}
static int walShmLock(wb_file *f, int offset, int n, int flags) {
	return innerOf(f)->pMethods->xShmLock(innerOf(f), offset, n, flags);
}
static void walShmBarrier(wb_file *f) { innerOf(f)->pMethods->xShmBarrier(innerOf(f)); }
static int walShmUnmap(wb_file *f, int deleteFlag) {
	return innerOf(f)->pMethods->xShmUnmap(innerOf(f), deleteFlag);
}
static int walFetch(wb_file *f, wb_i64 ofst, int n, void **pp) {
	// Memory-mapped reads would bypass the buffer; WAL files are never
	// mapped by SQLite, but refuse politely if one ever asks.
	*pp = 0;
	return WB_OK;
}
static int walUnfetch(wb_file *f, wb_i64 ofst, void *pp) { return WB_OK; }

static const wb_io_methods walMethods = {
	3,
	walClose,
	walRead,
	walWrite,
	walTruncate,
	walSync,
	walFileSize,
	walLock,
	walUnlock,
	walCheckReservedLock,
	walFileControl,
	walSectorSize,
	walDeviceCharacteristics,
	walShmMap,
	walShmLock,
	walShmBarrier,
	walShmUnmap,
	walFetch,
	walUnfetch,
};

static int gatheringOpen(wb_vfs *vfs, const char *name, wb_file *f, int flags, int *outFlags) {
	if ((flags & WB_OPEN_WAL) == 0) {
		// Every other file is the wrapped VFS's own, unchanged.
		return wrapped->xOpen(wrapped, name, f, flags, outFlags);
	}
	wal_file *p = (wal_file *)f;
	memset(p, 0, sizeof(*p));
	p->end = -1;
	p->pageAt = -1;
	p->inner = (wb_file *)((char *)f + WB_INNER_OFFSET);
	p->inner->pMethods = 0;
	int rc = wrapped->xOpen(wrapped, name, p->inner, flags, outFlags);
	if (rc == WB_OK) {
		p->inode = acquireInode(name);
	}
	// SQLite closes a file whose open failed only if pMethods is set.
	p->base.pMethods = p->inner->pMethods ? &walMethods : 0;
	return rc;
}

int walbuf_register(const char *name) {
	if (sqlite3_vfs_find == 0 || sqlite3_vfs_register == 0) {
		return 1; // SQLITE_ERROR: no SQLite linked in
	}
	if (wrapped != 0) {
		return WB_OK;
	}
	wb_vfs *base = sqlite3_vfs_find(0);
	if (base == 0) {
		return 1;
	}
	gathering = *base;
	gathering.pNext = 0;
	gathering.zName = name;
	gathering.szOsFile = (int)WB_INNER_OFFSET + base->szOsFile;
	gathering.xOpen = gatheringOpen;
	wrapped = base;
	return sqlite3_vfs_register(&gathering, 0);
}

void walbuf_stats(wb_i64 *r, wb_i64 *p, wb_i64 *s, wb_i64 *k) {
	*r = __atomic_load_n(&received, __ATOMIC_RELAXED);
	*p = __atomic_load_n(&passed, __ATOMIC_RELAXED);
	*s = __atomic_load_n(&synced, __ATOMIC_RELAXED);
	*k = __atomic_load_n(&skipped, __ATOMIC_RELAXED);
}
