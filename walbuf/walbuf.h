// The subset of SQLite's VFS interface (https://sqlite.org/c3ref/vfs.html)
// this shim needs, declared here because the driver does not export its
// header. The layouts are SQLite's stable public ABI.
#ifndef WALBUF_H
#define WALBUF_H

typedef long long wb_i64;

typedef struct wb_file wb_file;
typedef struct wb_io_methods wb_io_methods;
typedef struct wb_vfs wb_vfs;

struct wb_file {
	const wb_io_methods *pMethods;
};

struct wb_io_methods {
	int iVersion;
	int (*xClose)(wb_file *);
	int (*xRead)(wb_file *, void *, int iAmt, wb_i64 iOfst);
	int (*xWrite)(wb_file *, const void *, int iAmt, wb_i64 iOfst);
	int (*xTruncate)(wb_file *, wb_i64 size);
	int (*xSync)(wb_file *, int flags);
	int (*xFileSize)(wb_file *, wb_i64 *pSize);
	int (*xLock)(wb_file *, int);
	int (*xUnlock)(wb_file *, int);
	int (*xCheckReservedLock)(wb_file *, int *pResOut);
	int (*xFileControl)(wb_file *, int op, void *pArg);
	int (*xSectorSize)(wb_file *);
	int (*xDeviceCharacteristics)(wb_file *);
	int (*xShmMap)(wb_file *, int iPg, int pgsz, int, void volatile **);
	int (*xShmLock)(wb_file *, int offset, int n, int flags);
	void (*xShmBarrier)(wb_file *);
	int (*xShmUnmap)(wb_file *, int deleteFlag);
	int (*xFetch)(wb_file *, wb_i64 iOfst, int iAmt, void **pp);
	int (*xUnfetch)(wb_file *, wb_i64 iOfst, void *p);
};

typedef void (*wb_syscall_ptr)(void);

struct wb_vfs {
	int iVersion;
	int szOsFile;
	int mxPathname;
	wb_vfs *pNext;
	const char *zName;
	void *pAppData;
	int (*xOpen)(wb_vfs *, const char *zName, wb_file *, int flags, int *pOutFlags);
	int (*xDelete)(wb_vfs *, const char *zName, int syncDir);
	int (*xAccess)(wb_vfs *, const char *zName, int flags, int *pResOut);
	int (*xFullPathname)(wb_vfs *, const char *zName, int nOut, char *zOut);
	void *(*xDlOpen)(wb_vfs *, const char *zFilename);
	void (*xDlError)(wb_vfs *, int nByte, char *zErrMsg);
	void (*(*xDlSym)(wb_vfs *, void *, const char *zSymbol))(void);
	void (*xDlClose)(wb_vfs *, void *);
	int (*xRandomness)(wb_vfs *, int nByte, char *zOut);
	int (*xSleep)(wb_vfs *, int microseconds);
	int (*xCurrentTime)(wb_vfs *, double *);
	int (*xGetLastError)(wb_vfs *, int, char *);
	int (*xCurrentTimeInt64)(wb_vfs *, wb_i64 *);
	int (*xSetSystemCall)(wb_vfs *, const char *zName, wb_syscall_ptr);
	wb_syscall_ptr (*xGetSystemCall)(wb_vfs *, const char *zName);
	const char *(*xNextSystemCall)(wb_vfs *, const char *zName);
};

// walbuf_register registers the gathering VFS under name, wrapping the
// default VFS. It returns an SQLite result code.
int walbuf_register(const char *name);

// walbuf_stats reports, since the process started, how many writes the
// gathering VFS received from SQLite and passed on, and how many WAL syncs
// it passed on and skipped as having nothing to make durable.
void walbuf_stats(wb_i64 *received, wb_i64 *passed, wb_i64 *synced, wb_i64 *skipped);

#endif
