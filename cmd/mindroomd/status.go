package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/pgfs"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store"
)

// runStatus prints the journal's identity and sizes, then one line per
// principal: its journal rows, pending work and visible messages, its
// outbox by state, the departure echoes it is owed, and how long before
// now its last sync stored its token. It opens the journal read-only, so
// it runs beside the daemon without waiting for it or changing anything,
// and a mistyped path is an error rather than a new file. Neither a
// database URL nor its host is printed.
func runStatus(ctx context.Context, out io.Writer, journalAt store.Options, now func() time.Time) error {
	journalAt.ReadOnly, journalAt.Readers, journalAt.MaxConns = true, 1, 1
	s, err := store.Open(ctx, journalAt)
	if err != nil {
		return err
	}
	defer s.Close()
	gen, err := s.Generation(ctx)
	if err != nil {
		return err
	}
	st, err := s.Status(ctx)
	if err != nil {
		return err
	}
	if pg := s.Postgres(); pg != nil {
		sz, err := pg.Size(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "journal in PostgreSQL (generation %s, schema v%d)\n", gen, pgfs.SchemaVersion())
		fmt.Fprintf(out, "tables and indexes %s\n\n", size(sz))
	} else {
		sz, err := s.DB().Sizes()
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "journal %s (generation %s, schema v%d)\n", s.DB().Path, gen, sqlitefs.SchemaVersion())
		fmt.Fprintf(out, "database %s, WAL %s\n\n", size(sz.Database), size(sz.WAL))
	}
	if err := writeStatus(out, st, now()); err != nil {
		return err
	}
	if err := writeRetention(ctx, out, s, st, now()); err != nil {
		return err
	}
	if pg := s.Postgres(); pg != nil {
		if err := writeReplicas(ctx, out, pg, now()); err != nil {
			return err
		}
	}
	return writeDevices(out, journalAt.StorageDir, st)
}

// writeRetention prints, for the principals retention has run for, its
// passes, when the last ended, the rows it pruned and the bytes of bodies
// and payloads it cleared, and the origin time of the oldest message
// still kept. Nothing when it never ran.
func writeRetention(ctx context.Context, out io.Writer, s *store.Store, st []journal.PrincipalStatus, at time.Time) error {
	var lines []string
	for _, p := range st {
		v, err := s.Principal(ctx, p.Agent, p.UserID)
		if err != nil {
			return err
		}
		r, err := v.RetentionStatus(ctx)
		if err != nil {
			return err
		}
		if r.Passes == 0 {
			continue
		}
		oldest := "none"
		if r.OldestBodyMS > 0 {
			oldest = time.UnixMilli(r.OldestBodyMS).UTC().Format(time.RFC3339)
		}
		lines = append(lines, fmt.Sprintf("%s@%s\t%d\t%s ago\t%d\t%s\t%s\n", p.Agent, p.UserID, r.Passes,
			max(0, at.Sub(time.UnixMilli(r.LastPassMS))).Round(time.Second), r.Total.Rows(), size(r.Total.Bytes), oldest))
	}
	if len(lines) == 0 {
		return nil
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nRETENTION\tPASSES\tLAST PASS\tROWS PRUNED\tBYTES CLEARED\tOLDEST MESSAGE KEPT")
	for _, l := range lines {
		fmt.Fprint(w, l)
	}
	return w.Flush()
}

// writeReplicas prints, when several daemons share the journal, each
// replica with its last heartbeat, and each principal's lease: the replica
// holding it, since when, and the generation it took. Nothing when no
// replica ever beat.
func writeReplicas(ctx context.Context, out io.Writer, pg *pgfs.Store, at time.Time) error {
	replicas, err := pg.Replicas(ctx)
	if err != nil || len(replicas) == 0 {
		return err
	}
	holders, err := pg.Holders(ctx)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nREPLICA\tAPI URL\tSTARTED\tLAST BEAT\tSTATE")
	for _, r := range replicas {
		state := "live"
		if !r.Live {
			state = "silent"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s ago\t%s\n", r.ID, r.APIURL, time.UnixMilli(r.StartedMS).UTC().Format(time.RFC3339),
			r.Age.Round(time.Second), state)
	}
	fmt.Fprintln(w, "\nLEASE\tHOLDER\tSINCE\tGENERATION")
	for _, h := range holders {
		holder, since := h.Replica, "-"
		if holder == "" {
			holder = "none"
		} else {
			since = fmt.Sprintf("%s (%s ago)", time.UnixMilli(h.SinceMS).UTC().Format(time.RFC3339),
				max(0, at.Sub(time.UnixMilli(h.SinceMS))).Round(time.Second))
		}
		fmt.Fprintf(w, "%s@%s\t%s\t%s\t%d\n", h.Agent, h.UserID, holder, since, h.Generation)
	}
	return w.Flush()
}

// writeStatus prints one line per principal.
func writeStatus(out io.Writer, st []journal.PrincipalStatus, at time.Time) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PRINCIPAL\tEVENTS\tPENDING\tVISIBLE\tQUEUED\tATTEMPTED\tACKNOWLEDGED\tFAILED\tRETIRED\tOWED DEPARTURES\tAWAITING KEYS\tUNDECRYPTABLE\tSYNC TOKEN AGE")
	for _, s := range st {
		fmt.Fprintf(w, "%s@%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", s.Agent, s.UserID, s.Events, s.Pending, s.Visible,
			s.Queued, s.Attempted, s.Acknowledged, s.Failed, s.Retired, s.OwedDepartures, s.AwaitingKeys, s.Undecryptable, syncAge(s, at))
	}
	return w.Flush()
}

// writeDevices prints each agent's Matrix device as the daemon last
// recorded it under storage: its ID, and whether its account's
// self-signing key signed it (or what is missing for that).
func writeDevices(out io.Writer, storage string, st []journal.PrincipalStatus) error {
	if storage == "" {
		return nil
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nAGENT\tDEVICE\tCROSS-SIGNED")
	seen := map[string]bool{}
	for _, s := range st {
		if seen[s.Agent] {
			continue
		}
		seen[s.Agent] = true
		d, ok, err := e2ee.ReadDeviceStatus(storage, s.Agent)
		switch {
		case err != nil:
			return err
		case !ok:
			fmt.Fprintf(w, "%s\t(not recorded)\t-\n", s.Agent)
		case d.CrossSigned:
			fmt.Fprintf(w, "%s\t%s\tyes\n", s.Agent, d.DeviceID)
		default:
			fmt.Fprintf(w, "%s\t%s\tno: %s\n", s.Agent, d.DeviceID, d.Reason)
		}
	}
	return w.Flush()
}

// syncAge is how long before now a principal's sync token was stored:
// "none" before its first completed sync, "unknown" for a token stored by
// a mindroomd that did not keep the time. A time ahead of now (the clock
// was set back) reads as 0s.
func syncAge(s journal.PrincipalStatus, now time.Time) string {
	switch {
	case !s.HasSyncToken:
		return "none"
	case s.SyncTokenMS == 0:
		return "unknown"
	}
	return max(0, now.Sub(time.UnixMilli(s.SyncTokenMS))).Round(time.Second).String()
}

// size spells a file size in binary units, with the exact bytes beside
// anything larger than a KiB.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB (%d bytes)", float64(n)/float64(div), "KMGTP"[exp], n)
}

// runBackup writes a consistent copy of the SQLite journal cfg names to
// the new file to, then verifies it. A PostgreSQL journal is backed up with
// PostgreSQL's own tools.
func runBackup(ctx context.Context, out io.Writer, cfg *config.Config, to string) error {
	if cfg.DatabaseURL.IsSet() {
		return errors.New("backup copies a SQLite journal; the journal is in PostgreSQL: use pg_dump")
	}
	db, err := sqlitefs.OpenReadOnly(ctx, sqlitefs.Options{StorageDir: cfg.Storage, Readers: 1})
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.Backup(ctx, to); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(out, "backup of %s written to %s and verified\n", db.Path, to); err != nil {
		return err
	}
	// The agents' olm accounts and room keys: without them a restored
	// journal cannot read what its encrypted rooms say.
	from, cryptoTo := filepath.Join(cfg.Storage, e2ee.FileName), to+"."+e2ee.FileName
	n, err := e2ee.BackupSQLite(ctx, from, cryptoTo)
	if errors.Is(err, e2ee.ErrNoCryptoStore) {
		_, err = fmt.Fprintf(out, "no crypto store at %s: nothing more to copy\n", from)
		return err
	}
	if err != nil {
		return err
	}
	pickle := cfg.PickleKeyFile
	if pickle == "" {
		pickle = filepath.Join(cfg.Storage, config.DefaultPickleKeyFile)
	}
	_, err = fmt.Fprintf(out, "backup of %s (%d olm accounts) written to %s and verified; keep it with the pickle key %s\n",
		from, n, cryptoTo, pickle)
	return err
}
