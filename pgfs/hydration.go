package pgfs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/journal"
)

const (
	selectJournaledSeq = `SELECT seq, thread_id FROM journal_events
		WHERE principal = $1 AND event_id = $2 AND room_id = $3`
	upsertCoverage = `INSERT INTO hydration_coverage (principal, room_id, thread_id, epoch, covered_ms)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (principal, room_id, thread_id) DO UPDATE
		SET epoch = excluded.epoch, covered_ms = excluded.covered_ms`
	// A marker covers only under the epoch it was written in, and never
	// while the principal is out of the room.
	selectCovered = `SELECT EXISTS (SELECT 1 FROM hydration_coverage c JOIN rooms r
		ON r.principal = c.principal AND r.room_id = c.room_id
		WHERE c.principal = $1 AND c.room_id = $2 AND c.thread_id = $3 AND c.epoch = r.epoch AND NOT r.departed)`
	selectDebt = `SELECT v.seq, v.sender, ` + revisionIDColumn + `, v.revision_ts, coalesce(v.refresh_token, 0)
		FROM journal_events j JOIN visible_messages v ON v.seq = j.seq
		WHERE j.principal = $1 AND j.event_id = $2 AND j.room_id = $3`
	selectDebtEpoch = `SELECT coalesce(v.refresh_token, 0), r.epoch, r.departed
		FROM journal_events j JOIN visible_messages v ON v.seq = j.seq JOIN rooms r ON r.id = v.room
		WHERE j.principal = $1 AND j.event_id = $2 AND j.room_id = $3`
	// The server's copy may reduce to the original itself, which the row
	// stores as an empty revision_id.
	installRevision = `UPDATE visible_messages
		SET revision_id = CASE WHEN event_id = $1 THEN '' ELSE $1 END,
			revision_ts = $2, content_json = $3, refresh_token = NULL
		WHERE seq = $4`
)

// InstallHistory installs one chunk of history fetched for p's room under
// epoch (journal.InstallHistory).
func InstallHistory(tx *Tx, p Principal, room string, epoch int64, events []journal.Parsed) (journal.HistoryResult, error) {
	return journal.InstallHistory(newAdmission(tx, p), p.UserID, room, epoch, events)
}

// MarkCovered publishes that p's conversation (room, thread "" for the
// room) was hydrated under epoch (journal.MarkCovered).
func MarkCovered(tx *Tx, p Principal, room, thread string, epoch int64) error {
	return journal.MarkCovered(newAdmission(tx, p), room, thread, epoch)
}

// Cover implements journal.CoverageStore.
func (a *admission) Cover(room, thread string, epoch int64) error {
	_, err := a.tx.exec(upsertCoverage, a.p.ID, room, thread, epoch, a.tx.nowMS())
	return err
}

// covered reports whether p's conversation was hydrated under the room's
// current membership.
func (s *Store) covered(ctx context.Context, p Principal, room, thread string) (bool, error) {
	var covered bool
	if err := s.pool.QueryRow(ctx, selectCovered, p.ID, room, thread).Scan(&covered); err != nil {
		return false, fmt.Errorf("read coverage: %w", err)
	}
	return covered, nil
}

// refreshDebt reads the refresh debt of p's logical message eventID: its
// token and the membership epoch it is owed under. ok is false when the
// message is not on screen, owes nothing, or p is out of the room.
func (s *Store) refreshDebt(ctx context.Context, p Principal, room, eventID string) (journal.RefreshDebt, bool, error) {
	d := journal.RefreshDebt{RoomID: room, EventID: eventID}
	var departed bool
	err := s.pool.QueryRow(ctx, selectDebtEpoch, p.ID, eventID, room).Scan(&d.Token, &d.Epoch, &departed)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, false, nil
	}
	if err != nil {
		return d, false, fmt.Errorf("read refresh debt: %w", err)
	}
	return d, d.Owed(departed), nil
}

// ApplyRefetch installs the server's copy of one of p's messages owing a
// refetch (journal.ApplyRefetch).
func ApplyRefetch(tx *Tx, p Principal, r journal.Refetched) (journal.RefetchOutcome, error) {
	outcome, err := journal.ApplyRefetch(refetcher{tx: tx, p: p}, r, p.UserID)
	if err != nil {
		return 0, fmt.Errorf("refetch %s: %w", r.Debt.EventID, err)
	}
	return outcome, nil
}

// refetcher implements journal.RefetchStore for p inside tx.
type refetcher struct {
	tx *Tx
	p  Principal
}

var _ journal.RefetchStore = refetcher{}

// Membership implements journal.RefetchStore.
func (r refetcher) Membership(room string) (int64, bool, error) {
	return membershipOf(r.tx.ctx, r.tx.tx, r.p, room)
}

// Debt implements journal.RefetchStore.
func (r refetcher) Debt(room, eventID string) (journal.VisibleRow, int64, bool, error) {
	var (
		v     journal.VisibleRow
		token int64
	)
	err := r.tx.queryRow(selectDebt, r.p.ID, eventID, room).
		Scan(&v.Key, &v.Sender, &v.Revision.EventID, &v.Revision.TS, &token)
	if errors.Is(err, pgx.ErrNoRows) {
		return v, 0, false, nil
	}
	return v, token, err == nil, err
}

// Tombstoned implements journal.RefetchStore.
func (r refetcher) Tombstoned(room, eventID string) (bool, error) {
	return (&projector{tx: r.tx, p: r.p}).Tombstoned(room, eventID)
}

// Tombstone implements journal.RefetchStore. A redaction seen only as the
// server's redacted copy has no journal row of its own; the tombstone
// points at the redacted event's.
func (r refetcher) Tombstone(room, eventID string) error {
	var (
		seq    int64
		thread string
	)
	if err := r.tx.queryRow(selectJournaledSeq, r.p.ID, eventID, room).Scan(&seq, &thread); err != nil {
		return err
	}
	return (&projector{tx: r.tx, p: r.p, seq: seq}).Tombstone(room, eventID)
}

// JournalEdit implements journal.RefetchStore.
func (r refetcher) JournalEdit(edit *journal.Event) error {
	return journal.JournalContext(newAdmission(r.tx, r.p), edit)
}

// InstallRevision implements journal.RefetchStore.
func (r refetcher) InstallRevision(row journal.VisibleRow, rev journal.Revision, body []byte) error {
	_, err := r.tx.exec(installRevision, rev.EventID, rev.TS, nullableBody(body), row.Key)
	return err
}

// DropVisible implements journal.RefetchStore.
func (r refetcher) DropVisible(row journal.VisibleRow) error {
	_, err := r.tx.exec(deleteVisible, row.Key)
	return err
}
