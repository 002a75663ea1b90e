package sqlitefs

import (
	"context"
	"database/sql"
	"fmt"
)

// Space retention frees: deleted rows leave free pages, which new rows
// reuse, so a journal under retention stops growing either way. To hand
// them back to the file system, a journal created by this version is in
// incremental auto-vacuum mode (set before its first table), and
// ReclaimOn moves free pages to the end of the file and truncates them, a
// bounded chunk at a time between the writer's batches. A journal created
// before keeps its size and reuses its free pages.
const (
	pragmaAutoVacuumIncremental = `PRAGMA auto_vacuum = INCREMENTAL`
	queryAutoVacuum             = `PRAGMA auto_vacuum`
	queryFreelistCount          = `PRAGMA freelist_count`
	queryPageCount              = `PRAGMA page_count`
	// ReclaimChunk is the most free pages one ReclaimOn hands back: with
	// 1 KiB pages, a megabyte of the file, a few milliseconds of the
	// writer's time.
	ReclaimChunk          = 1024
	pragmaIncrementalStep = `PRAGMA incremental_vacuum(1024)`
	autoVacuumIncremental = 2
	// reclaimShare is the share of the file, in free pages, below which
	// they are left to be reused: under steady retention each pass frees
	// about what the next hour's admissions take again, and moving those
	// pages twice an hour would only cost writes.
	reclaimShare = 4
)

// ReclaimOn hands up to ReclaimChunk free pages back to the file system
// on the writer's connection while they are more than a quarter of the
// file, and reports the bytes it handed back and the pages that stay free.
// A journal not in incremental mode hands back none.
func ReclaimOn(ctx context.Context, conn *sql.Conn) (freed, left int64, err error) {
	var mode int
	if err := conn.QueryRowContext(ctx, queryAutoVacuum).Scan(&mode); err != nil {
		return 0, 0, fmt.Errorf("read auto_vacuum: %w", err)
	}
	var before int64
	if err := conn.QueryRowContext(ctx, queryFreelistCount).Scan(&before); err != nil {
		return 0, 0, fmt.Errorf("read freelist_count: %w", err)
	}
	var pages int64
	if err := conn.QueryRowContext(ctx, queryPageCount).Scan(&pages); err != nil {
		return 0, 0, fmt.Errorf("read page_count: %w", err)
	}
	if mode != autoVacuumIncremental || before == 0 || before*reclaimShare < pages {
		return 0, before, nil
	}
	if _, err := conn.ExecContext(ctx, pragmaIncrementalStep); err != nil {
		return 0, before, fmt.Errorf("incremental_vacuum: %w", err)
	}
	if err := conn.QueryRowContext(ctx, queryFreelistCount).Scan(&left); err != nil {
		return 0, before, fmt.Errorf("read freelist_count: %w", err)
	}
	var pageSize int64
	if err := conn.QueryRowContext(ctx, queryPageSize).Scan(&pageSize); err != nil {
		return 0, left, fmt.Errorf("read page_size: %w", err)
	}
	return (before - left) * pageSize, left, nil
}
