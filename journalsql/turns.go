package journalsql

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
)

// MaxTurnPage bounds one warm-up page of turn records.
const MaxTurnPage = 1000

// UpsertTurn writes a turn record for agent and indexes it by exactly its
// sources: a source the turn no longer answers is dropped.
func UpsertTurn(tx Tx, agent string, rec journal.TurnRecord) error {
	if rec.TurnID == "" {
		return fmt.Errorf("%w: turn ID is required", journal.ErrInvalidArgument)
	}
	if rec.State != journal.TurnResultRecorded && rec.State != journal.TurnDelivered {
		return fmt.Errorf("%w: unknown turn state %d", journal.ErrInvalidArgument, rec.State)
	}
	record := string(rec.Record)
	if record == "" {
		record = "{}"
	}
	if !json.Valid([]byte(record)) {
		return fmt.Errorf("%w: turn record is not JSON", journal.ErrInvalidArgument)
	}
	if _, err := tx.Exec(UpsertTurnRecord, agent, rec.TurnID, rec.RoomID, int(rec.State), record, rec.EventID, tx.Now().UnixMilli()); err != nil {
		return fmt.Errorf("upsert turn: %w", err)
	}
	if _, err := tx.Exec(DeleteTurnSources, agent, rec.TurnID); err != nil {
		return err
	}
	for _, src := range rec.Sources {
		if _, err := tx.Exec(UpsertTurnSource, agent, src, rec.TurnID); err != nil {
			return fmt.Errorf("index turn: %w", err)
		}
	}
	return nil
}

// completeTurn marks a turn delivered with its answer's event ID.
func completeTurn(tx Tx, agent, turnID, eventID string) error {
	if _, err := tx.Exec(CompleteTurnRecord, eventID, tx.Now().UnixMilli(), agent, turnID); err != nil {
		return fmt.Errorf("complete turn: %w", err)
	}
	return nil
}

// ForgetTurns deletes turn records and their indexes.
func ForgetTurns(tx Tx, agent string, turnIDs []string) (int, error) {
	n := 0
	for _, id := range turnIDs {
		if _, err := tx.Exec(DeleteTurnSources, agent, id); err != nil {
			return 0, err
		}
		k, err := tx.Exec(DeleteTurn, agent, id)
		if err != nil {
			return 0, err
		}
		n += int(k)
	}
	return n, nil
}

// scanTurn reads one row of the turn columns' shape.
func scanTurn(row Row) (journal.TurnRecord, error) {
	var (
		t      journal.TurnRecord
		state  int
		record string
	)
	err := row.Scan(&t.TurnID, &t.RoomID, &state, &record, &t.EventID, &t.UpdatedMS)
	t.State, t.Record = journal.TurnState(state), json.RawMessage(record)
	return t, err
}

// turnSources fills in the sources that index a record.
func turnSources(ctx context.Context, r Reader, agent string, t *journal.TurnRecord) error {
	rows, err := r.Query(ctx, SelectTurnSources, agent, t.TurnID)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return err
		}
		t.Sources = append(t.Sources, s)
	}
	return rows.Err()
}

// Turn loads one of agent's turn records.
func Turn(ctx context.Context, r Reader, agent, turnID string) (journal.TurnRecord, bool, error) {
	return oneTurn(ctx, r, SelectTurn, agent, turnID)
}

// TurnForEvent finds the record a source event indexes.
func TurnForEvent(ctx context.Context, r Reader, agent, eventID string) (journal.TurnRecord, bool, error) {
	return oneTurn(ctx, r, SelectTurnByEvent, agent, eventID)
}

// oneTurn reads a record and its sources from one snapshot.
func oneTurn(ctx context.Context, r Reader, s Stmt, agent, key string) (t journal.TurnRecord, found bool, err error) {
	err = r.Snapshot(ctx, func(r Reader) error {
		var err error
		t, err = scanTurn(r.QueryRow(ctx, s, agent, key))
		if r.NoRows(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read turn: %w", err)
		}
		found = true
		if err := turnSources(ctx, r, agent, &t); err != nil {
			return fmt.Errorf("read turn sources: %w", err)
		}
		return nil
	})
	if err != nil || !found {
		return journal.TurnRecord{}, false, err
	}
	return t, true, nil
}

// Turns pages agent's records in turn ID order, each with its sources, from
// one snapshot.
func Turns(ctx context.Context, r Reader, agent string, limit int, after string) ([]journal.TurnRecord, error) {
	if limit <= 0 || limit > MaxTurnPage {
		return nil, fmt.Errorf("%w: limit %d must be in 1..%d", journal.ErrInvalidArgument, limit, MaxTurnPage)
	}
	var out []journal.TurnRecord
	err := r.Snapshot(ctx, func(r Reader) error {
		out = nil
		rows, err := r.Query(ctx, SelectTurnsAfter, agent, after, limit)
		if err != nil {
			return fmt.Errorf("read turns: %w", err)
		}
		for rows.Next() {
			t, err := scanTurn(rows)
			if err != nil {
				rows.Close()
				return fmt.Errorf("read turns: %w", err)
			}
			out = append(out, t)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read turns: %w", err)
		}
		for i := range out {
			if err := turnSources(ctx, r, agent, &out[i]); err != nil {
				return fmt.Errorf("read turn sources: %w", err)
			}
		}
		return nil
	})
	return out, err
}
