package pgfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/journal"
)

// MaxTurnPage bounds one warm-up page of turn records.
const MaxTurnPage = 1000

const (
	// A record is read with its sources in one statement, so the two come
	// from one snapshot; array_agg over no sources is NULL, read as nil.
	turnColumns = `t.turn_id, t.room_id, t.state, t.record_json, t.event_id, t.updated_ms,
		(SELECT array_agg(s.event_id ORDER BY s.event_id) FROM turn_sources s
		 WHERE s.agent = t.agent AND s.turn_id = t.turn_id)`
	upsertTurn = `INSERT INTO turn_records (agent, turn_id, room_id, state, record_json, event_id, updated_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (agent, turn_id) DO UPDATE SET room_id = excluded.room_id, state = excluded.state,
		record_json = excluded.record_json, event_id = excluded.event_id, updated_ms = excluded.updated_ms`
	completeTurnRecord = `UPDATE turn_records SET state = 2, event_id = $1, updated_ms = $2 WHERE agent = $3 AND turn_id = $4`
	deleteTurnSources  = `DELETE FROM turn_sources WHERE agent = $1 AND turn_id = ANY($2)`
	// A source re-anchored to another turn leaves no row under its old one.
	upsertTurnSource = `INSERT INTO turn_sources (agent, event_id, turn_id) VALUES ($1, $2, $3)
		ON CONFLICT (agent, event_id) DO UPDATE SET turn_id = excluded.turn_id`
	deleteTurns       = `DELETE FROM turn_records WHERE agent = $1 AND turn_id = ANY($2)`
	selectTurn        = `SELECT ` + turnColumns + ` FROM turn_records t WHERE t.agent = $1 AND t.turn_id = $2`
	selectTurnByEvent = `SELECT ` + turnColumns + `
		FROM turn_sources e JOIN turn_records t ON t.agent = e.agent AND t.turn_id = e.turn_id
		WHERE e.agent = $1 AND e.event_id = $2`
	selectTurnsAfter = `SELECT ` + turnColumns + ` FROM turn_records t
		WHERE t.agent = $1 AND t.turn_id > $2 ORDER BY t.turn_id LIMIT $3`
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
	if _, err := tx.exec(deleteTurnSources, agent, []string{rec.TurnID}); err != nil {
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
	if _, err := tx.exec(deleteTurnSources, agent, turnIDs); err != nil {
		return 0, err
	}
	tag, err := tx.exec(deleteTurns, agent, turnIDs)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

func scanTurn(row pgx.Row) (journal.TurnRecord, error) {
	var (
		t      journal.TurnRecord
		state  int
		record string
	)
	err := row.Scan(&t.TurnID, &t.RoomID, &state, &record, &t.EventID, &t.UpdatedMS, &t.Sources)
	t.State, t.Record = journal.TurnState(state), json.RawMessage(record)
	return t, err
}

// turn loads one of agent's turn records.
func (s *Store) turn(ctx context.Context, agent, turnID string) (journal.TurnRecord, bool, error) {
	return s.oneTurn(ctx, selectTurn, agent, turnID)
}

// turnForEvent finds the record a source event indexes.
func (s *Store) turnForEvent(ctx context.Context, agent, eventID string) (journal.TurnRecord, bool, error) {
	return s.oneTurn(ctx, selectTurnByEvent, agent, eventID)
}

func (s *Store) oneTurn(ctx context.Context, query, agent, key string) (journal.TurnRecord, bool, error) {
	t, err := scanTurn(s.pool.QueryRow(ctx, query, agent, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return journal.TurnRecord{}, false, nil
	}
	if err != nil {
		return journal.TurnRecord{}, false, fmt.Errorf("read turn: %w", err)
	}
	return t, true, nil
}

// turns pages agent's records in turn ID order.
func (s *Store) turns(ctx context.Context, agent string, limit int, after string) ([]journal.TurnRecord, error) {
	if limit <= 0 || limit > MaxTurnPage {
		return nil, fmt.Errorf("%w: limit %d must be in 1..%d", journal.ErrInvalidArgument, limit, MaxTurnPage)
	}
	rows, err := s.pool.Query(ctx, selectTurnsAfter, agent, after, limit)
	if err != nil {
		return nil, fmt.Errorf("read turns: %w", err)
	}
	// A page with no records is nil, as every backend's is.
	out, err := pgx.AppendRows([]journal.TurnRecord(nil), rows, func(r pgx.CollectableRow) (journal.TurnRecord, error) { return scanTurn(r) })
	if err != nil {
		return nil, fmt.Errorf("read turns: %w", err)
	}
	return out, nil
}
