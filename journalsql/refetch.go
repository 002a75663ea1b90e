package journalsql

import (
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
)

// ApplyRefetch installs the server's copy of one of p's messages owing a
// refetch (journal.ApplyRefetch).
func ApplyRefetch(tx Tx, p Principal, r journal.Refetched) (journal.RefetchOutcome, error) {
	outcome, err := journal.ApplyRefetch(refetcher{tx: tx, p: p}, r, p.UserID)
	if err != nil {
		return 0, fmt.Errorf("refetch %s: %w", r.Debt.EventID, err)
	}
	return outcome, nil
}

// refetcher implements journal.RefetchStore for p inside tx.
type refetcher struct {
	tx Tx
	p  Principal
}

var _ journal.RefetchStore = refetcher{}

// Membership implements journal.RefetchStore.
func (r refetcher) Membership(room string) (int64, bool, error) { return membershipOf(r.tx, r.p, room) }

// Debt implements journal.RefetchStore.
func (r refetcher) Debt(room, eventID string) (journal.VisibleRow, int64, bool, error) {
	var (
		v     journal.VisibleRow
		token int64
	)
	err := r.tx.QueryRow(SelectDebt, r.p.ID, EventKey(eventID), room).
		Scan(&v.Key, &v.Sender, &v.Revision.EventID, &v.Revision.TS, &token)
	if r.tx.NoRows(err) {
		return v, 0, false, nil
	}
	return v, token, err == nil, err
}

// Tombstoned implements journal.RefetchStore.
func (r refetcher) Tombstoned(room, eventID string) (bool, error) {
	return exists(r.tx, SelectTombstone, r.p.ID, room, eventID)
}

// Tombstone implements journal.RefetchStore. A redaction seen only as the
// server's redacted copy has no journal row of its own; the tombstone
// points at the redacted event's.
func (r refetcher) Tombstone(room, eventID string) error {
	var (
		seq    int64
		thread string
	)
	if err := r.tx.QueryRow(SelectJournaledSeq, r.p.ID, EventKey(eventID), room).Scan(&seq, &thread); err != nil {
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
	_, err := r.tx.Exec(InstallRevision, rev.EventID, rev.TS, nullableBody(body), row.Key)
	return err
}

// DropVisible implements journal.RefetchStore.
func (r refetcher) DropVisible(row journal.VisibleRow) error {
	_, err := r.tx.Exec(DeleteVisible, row.Key)
	return err
}
