package journalsql

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// Await implements journal.AdmissionStore.
func (a *admission) Await(seq int64, room, session string, raw json.RawMessage) error {
	if _, err := a.tx.Exec(MarkAwaiting, seq); err != nil {
		return err
	}
	_, err := a.tx.Exec(InsertAwaiting, seq, a.p.ID, room, session, string(raw), a.tx.Now().UnixMilli())
	return err
}

// keys implements journal.KeyStore for p inside tx.
type keys struct{ *admission }

var _ journal.KeyStore = keys{}

// AwaitingRow implements journal.KeyStore.
func (k keys) AwaitingRow(seq int64) (journal.AwaitingRow, bool, error) {
	var (
		row  journal.AwaitingRow
		prov int
	)
	err := k.tx.QueryRow(SelectAwaitingRow, k.p.ID, seq).Scan(&row.RoomID, &row.Epoch, &prov)
	if k.tx.NoRows(err) {
		return row, false, nil
	}
	row.Provenance = journal.Provenance(prov)
	return row, err == nil, err
}

// Decrypted implements journal.KeyStore.
func (k keys) Decrypted(seq int64, ev *journal.Event, thread string, class journal.Class, pending bool) error {
	state := 1
	if pending {
		state = 0
	}
	if _, err := k.tx.Exec(ResolveDecrypted, int(ev.Kind), int(class), thread, ev.Target, state, k.p.ID, seq); err != nil {
		return err
	}
	if pending {
		if _, err := k.tx.Exec(InsertPayload, seq, string(ev.Canonical)); err != nil {
			return err
		}
	}
	_, err := k.tx.Exec(DeleteAwaiting, k.p.ID, seq)
	return err
}

// Undecryptable implements journal.KeyStore.
func (k keys) Undecryptable(seq int64) error {
	if _, err := k.tx.Exec(SettleUndecryptable, k.p.ID, seq); err != nil {
		return err
	}
	_, err := k.tx.Exec(DeleteAwaiting, k.p.ID, seq)
	return err
}

// ResolveAwaiting installs the decrypted cleartext of p's awaiting event
// at seq (journal.ResolveAwaiting) and returns the hint its commit
// publishes.
func ResolveAwaiting(tx Tx, p Principal, seq int64, clear journal.Parsed) (journal.KeyOutcome, []hint.Hint, error) {
	out, err := journal.ResolveAwaiting(keys{newAdmission(tx, p)}, p.UserID, seq, clear)
	if err != nil || out != journal.KeyResolved {
		return out, nil, err
	}
	return out, hint.ForRooms(p.String(), map[string]int64{clear.Event.RoomID: seq}), nil
}

// ExpireAwaiting settles as undecryptable up to limit of p's events that
// have waited for their keys since before cutoffMS.
func ExpireAwaiting(tx Tx, p Principal, cutoffMS int64, limit int) (int, error) {
	rows, err := tx.Query(SelectExpiredAwaited, p.ID, cutoffMS, limit)
	if err != nil {
		return 0, fmt.Errorf("expire awaiting events: %w", err)
	}
	var seqs []int64
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			rows.Close()
			return 0, fmt.Errorf("expire awaiting events: %w", err)
		}
		seqs = append(seqs, seq)
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return 0, fmt.Errorf("expire awaiting events: %w", err)
	}
	k := keys{newAdmission(tx, p)}
	for _, seq := range seqs {
		if err := k.Undecryptable(seq); err != nil {
			return 0, fmt.Errorf("expire awaiting events: %w", err)
		}
	}
	return len(seqs), nil
}

// KeyWaits lists up to limit of the sessions p's awaiting events wait on.
func KeyWaits(ctx context.Context, r Reader, p Principal, limit int) ([]journal.KeyWait, error) {
	rows, err := r.Query(ctx, SelectKeyWaits, p.ID, limit)
	if err != nil {
		return nil, fmt.Errorf("read key waits: %w", err)
	}
	defer rows.Close()
	var out []journal.KeyWait
	for rows.Next() {
		var w journal.KeyWait
		if err := rows.Scan(&w.RoomID, &w.Session); err != nil {
			return nil, fmt.Errorf("read key waits: %w", err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read key waits: %w", err)
	}
	return out, nil
}

// AwaitingFor lists up to limit of p's events in room waiting on session,
// in receipt order.
func AwaitingFor(ctx context.Context, r Reader, p Principal, room, session string, limit int) ([]journal.AwaitingEvent, error) {
	rows, err := r.Query(ctx, SelectAwaitingFor, p.ID, room, session, limit)
	if err != nil {
		return nil, fmt.Errorf("read awaiting events: %w", err)
	}
	defer rows.Close()
	var out []journal.AwaitingEvent
	for rows.Next() {
		e := journal.AwaitingEvent{RoomID: room, Session: session}
		var (
			prov int
			raw  string
		)
		if err := rows.Scan(&e.Seq, &e.EventID, &prov, &raw, &e.ReceivedMS); err != nil {
			return nil, fmt.Errorf("read awaiting events: %w", err)
		}
		e.Provenance, e.Event = journal.Provenance(prov), json.RawMessage(raw)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read awaiting events: %w", err)
	}
	return out, nil
}
