package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/mindroomd/mindroomd/sqlitefs"
)

// runStatus prints one line per principal. It reads the journal read-only
// (sqlitefs.OpenReadOnly), so it runs beside the daemon without waiting for
// it or changing the file, and a mistyped path is an error rather than a
// new file.
func runStatus(ctx context.Context, out io.Writer, storage string) error {
	db, err := sqlitefs.OpenReadOnly(ctx, sqlitefs.Options{StorageDir: storage, Readers: 1})
	if err != nil {
		return err
	}
	defer db.Close()
	gen, err := db.Generation(ctx)
	if err != nil {
		return err
	}
	st, err := db.Status(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "journal %s (generation %s, schema v%d)\n", db.Path, gen, sqlitefs.SchemaVersion())
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PRINCIPAL\tEVENTS\tPENDING\tVISIBLE\tUNDELIVERED")
	for _, s := range st {
		fmt.Fprintf(w, "%s@%s\t%d\t%d\t%d\t%d\n", s.Agent, s.UserID, s.Events, s.Pending, s.Visible, s.Undelivered)
	}
	return w.Flush()
}

// runBackup writes a consistent copy of the journal under storage to the
// new file to and verifies it. It reads the journal read-only, so it runs
// beside the daemon without stopping it.
func runBackup(ctx context.Context, out io.Writer, storage, to string) error {
	db, err := sqlitefs.OpenReadOnly(ctx, sqlitefs.Options{StorageDir: storage, Readers: 1})
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.Backup(ctx, to); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "backup of %s written to %s and verified\n", db.Path, to)
	return err
}
