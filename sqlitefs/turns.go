package sqlitefs

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
)

// MaxTurnPage bounds one warm-up page of turn records.
const MaxTurnPage = 1000

const (
	turnColumns = `turn_id, room_id, state, record_json, event_id, updated_ms`
	upsertTurn  = `INSERT INTO turn_records (agent, turn_id, room_id, state, record_json, event_id, updated_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (agent, turn_id) DO UPDATE SET room_id = excluded.room_id, state = excluded.state,
		record_json = excluded.record_json, event_id = excluded.event_id, updated_ms = excluded.updated_ms`
	completeTurnRecord = `UPDATE turn_records SET state = 2, event_id = ?, updated_ms = ? WHERE agent = ? AND turn_id = ?`
	deleteTurnSources  = `DELETE FROM turn_sources WHERE agent = ? AND turn_id = ?`
	// A source re-anchored to another turn leaves no row under its old one.
	upsertTurnSource = `INSERT INTO turn_sources (agent, event_id, turn_id) VALUES (?, ?, ?)
		ON CONFLICT (agent, event_id) DO UPDATE SET turn_id = excluded.turn_id`
	deleteTurn        = `DELETE FROM turn_records WHERE agent = ? AND turn_id = ?`
	selectTurn        = `SELECT ` + turnColumns + ` FROM turn_records WHERE agent = ? AND turn_id = ?`
	selectTurnByEvent = `SELECT t.turn_id, t.room_id, t.state, t.record_json, t.event_id, t.updated_ms
		FROM turn_sources s JOIN turn_records t ON t.agent = s.agent AND t.turn_id = s.turn_id
		WHERE s.agent = ? AND s.event_id = ?`
	selectTurnSources = `SELECT event_id FROM turn_sources WHERE agent = ? AND turn_id = ? ORDER BY event_id`
	selectTurnsAfter  = `SELECT ` + turnColumns + ` FROM turn_records WHERE agent = ? AND turn_id > ? ORDER BY turn_id LIMIT ?`
)

// UpsertTurn writes a turn record for agent and indexes it by exactly its
// sources: a source the turn no longer answers is dropped.
func UpsertTurn(tx *Tx, agent string, rec journal.TurnRecord) error {
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
	if _, err := tx.exec(upsertTurn, agent, rec.TurnID, rec.RoomID, int(rec.State), record, rec.EventID, tx.nowMS()); err != nil {
		return fmt.Errorf("upsert turn: %w", err)
	}
	if _, err := tx.exec(deleteTurnSources, agent, rec.TurnID); err != nil {
		return err
	}
	for _, src := range rec.Sources {
		if _, err := tx.exec(upsertTurnSource, agent, src, rec.TurnID); err != nil {
			return fmt.Errorf("index turn: %w", err)
		}
	}
	return nil
}

// completeTurn marks a turn delivered with its answer's event ID.
func completeTurn(tx *Tx, agent, turnID, eventID string) error {
	if _, err := tx.exec(completeTurnRecord, eventID, tx.nowMS(), agent, turnID); err != nil {
		return fmt.Errorf("complete turn: %w", err)
	}
	return nil
}

// ForgetTurns deletes turn records and their indexes.
func ForgetTurns(tx *Tx, agent string, turnIDs []string) (int, error) {
	n := 0
	for _, id := range turnIDs {
		if _, err := tx.exec(deleteTurnSources, agent, id); err != nil {
			return 0, err
		}
		r, err := tx.exec(deleteTurn, agent, id)
		if err != nil {
			return 0, err
		}
		k, _ := r.RowsAffected()
		n += int(k)
	}
	return n, nil
}

func scanTurn(row interface{ Scan(...any) error }) (journal.TurnRecord, error) {
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
func turnSources(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, agent string, t *journal.TurnRecord) error {
	rows, err := q.QueryContext(ctx, selectTurnSources, agent, t.TurnID)
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
func (db *DB) Turn(ctx context.Context, agent, turnID string) (journal.TurnRecord, bool, error) {
	return db.oneTurn(ctx, agent, selectTurn, turnID)
}

// TurnForEvent finds the record a source event indexes.
func (db *DB) TurnForEvent(ctx context.Context, agent, eventID string) (journal.TurnRecord, bool, error) {
	return db.oneTurn(ctx, agent, selectTurnByEvent, eventID)
}

func (db *DB) oneTurn(ctx context.Context, agent, query, key string) (journal.TurnRecord, bool, error) {
	tx, err := db.readers.BeginTx(ctx, nil)
	if err != nil {
		return journal.TurnRecord{}, false, err
	}
	defer tx.Rollback()
	t, err := scanTurn(tx.QueryRowContext(ctx, query, agent, key))
	if errors.Is(err, sql.ErrNoRows) {
		return journal.TurnRecord{}, false, nil
	}
	if err != nil {
		return journal.TurnRecord{}, false, fmt.Errorf("read turn: %w", err)
	}
	if err := turnSources(ctx, tx, agent, &t); err != nil {
		return journal.TurnRecord{}, false, fmt.Errorf("read turn sources: %w", err)
	}
	return t, true, nil
}

// Turns pages agent's records in turn ID order.
func (db *DB) Turns(ctx context.Context, agent string, limit int, after string) ([]journal.TurnRecord, error) {
	if limit <= 0 || limit > MaxTurnPage {
		return nil, fmt.Errorf("%w: limit %d must be in 1..%d", journal.ErrInvalidArgument, limit, MaxTurnPage)
	}
	tx, err := db.readers.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, selectTurnsAfter, agent, after, limit)
	if err != nil {
		return nil, fmt.Errorf("read turns: %w", err)
	}
	var out []journal.TurnRecord
	for rows.Next() {
		t, err := scanTurn(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("read turns: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	for i := range out {
		if err := turnSources(ctx, tx, agent, &out[i]); err != nil {
			return nil, fmt.Errorf("read turn sources: %w", err)
		}
	}
	return out, nil
}
