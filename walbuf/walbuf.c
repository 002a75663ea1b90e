// A VFS that wraps the default one and gathers the writes of a WAL file
// into one buffer, passed on as a single write. walbuf.go explains why.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "walbuf.h"

#define WB_OK 0
#define WB_OPEN_WAL 0x00080000

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

// A WAL file as every handle this process has open on it shares it, keyed
// by device and inode. written counts the writes passed on, each once it
// has returned; synced is the count a completed sync covered. A sync that
// finds synced == written has nothing to make durable, whichever handle
// did the writes and the sync: with synchronous=FULL every commit syncs,
// and the sync a checkpoint starts with is then a wasted round trip to the
// disk. A file first seen counts one write, so its first sync always runs.
typedef struct wal_inode {
	dev_t dev;
	ino_t ino;
	int refs;
	wb_i64 written, synced;
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
		free(n);
	}
	pthread_mutex_unlock(&inodesMu);
}

static void noteWritten(wal_inode *n) {
	if (n != 0) {
		pthread_mutex_lock(&inodesMu);
		n->written++;
		pthread_mutex_unlock(&inodesMu);
	}
}

typedef struct wal_file {
	wb_file base;
	wb_file *inner;      // the wrapped VFS's file, stored after this struct
	unsigned char *buf;  // gathered bytes, allocated on first write
	int len;             // bytes in buf
	wb_i64 off;          // file offset of buf[0]
	int commitPending;   // the next write is a commit frame's page
	wal_inode *inode;    // shared write and sync counts; 0 if unknown
} wal_file;

static wb_vfs gathering;
static wb_vfs *wrapped;
static wb_i64 received, passed, synced, skipped;

#define WB_INNER_OFFSET ((sizeof(wal_file) + 15) & ~(size_t)15)

static wb_file *innerOf(wb_file *f) { return ((wal_file *)f)->inner; }

// passOn writes to the wrapped file and counts the write once it returned,
// so a sync that starts later is known to cover it.
static int passOn(wal_file *p, const void *data, int n, wb_i64 ofst) {
	__atomic_fetch_add(&passed, 1, __ATOMIC_RELAXED);
	int rc = p->inner->pMethods->xWrite(p->inner, data, n, ofst);
	noteWritten(p->inode);
	return rc;
}

static int flush(wal_file *p) {
	if (p->len == 0) {
		return WB_OK;
	}
	int n = p->len;
	p->len = 0;
	return passOn(p, p->buf, n, p->off);
}

static int overlapsBuffer(wal_file *p, int n, wb_i64 ofst) {
	return p->len > 0 && ofst < p->off + p->len && ofst + n > p->off;
}

static int walClose(wb_file *f) {
	wal_file *p = (wal_file *)f;
	int rc = flush(p);
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

static int isCommitFrameHeader(const unsigned char *b, int n, wb_i64 ofst) {
	return n == WB_FRAME_HEADER && ofst >= WB_WAL_HEADER && (b[4] | b[5] | b[6] | b[7]) != 0;
}

static int walWrite(wb_file *f, const void *data, int n, wb_i64 ofst) {
	wal_file *p = (wal_file *)f;
	__atomic_fetch_add(&received, 1, __ATOMIC_RELAXED);
	if (p->buf == 0) {
		p->buf = malloc(WB_CAP);
	}
	if (p->buf == 0 || n > WB_CAP) {
		int rc = flush(p);
		if (rc != WB_OK) {
			return rc;
		}
		return passOn(p, data, n, ofst);
	}
	if (p->len == 0 || ofst != p->off + p->len || p->len + n > WB_CAP) {
		int rc = flush(p);
		if (rc != WB_OK) {
			return rc;
		}
		p->off = ofst;
	}
	memcpy(p->buf + p->len, data, n);
	p->len += n;
	// A commit's last frame is passed on at once, so its frames reach the
	// file before SQLite publishes the commit to other connections, whatever
	// the connection's synchronous setting.
	if (p->commitPending) {
		p->commitPending = 0;
		return flush(p);
	}
	p->commitPending = isCommitFrameHeader(data, n, ofst);
	return WB_OK;
}

static int walTruncate(wb_file *f, wb_i64 size) {
	wal_file *p = (wal_file *)f;
	int rc = flush(p);
	if (rc != WB_OK) {
		return rc;
	}
	rc = p->inner->pMethods->xTruncate(p->inner, size);
	noteWritten(p->inode);
	return rc;
}

static int walSync(wb_file *f, int flags) {
	wal_file *p = (wal_file *)f;
	int rc = flush(p);
	if (rc != WB_OK) {
		return rc;
	}
	wal_inode *n = p->inode;
	wb_i64 covers = 0;
	if (n != 0) {
		pthread_mutex_lock(&inodesMu);
		covers = n->written;
		int clean = n->synced >= covers;
		pthread_mutex_unlock(&inodesMu);
		if (clean) {
			__atomic_fetch_add(&skipped, 1, __ATOMIC_RELAXED);
			return WB_OK;
		}
	}
	__atomic_fetch_add(&synced, 1, __ATOMIC_RELAXED);
	rc = p->inner->pMethods->xSync(p->inner, flags);
	if (rc == WB_OK && n != 0) {
		pthread_mutex_lock(&inodesMu);
		if (n->synced < covers) {
			n->synced = covers;
		}
		pthread_mutex_unlock(&inodesMu);
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
