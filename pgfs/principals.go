package pgfs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/journal"
)

const (
	insertPrincipal = `INSERT INTO principals (agent, user_id) VALUES ($1, $2)
		ON CONFLICT (agent, user_id) DO UPDATE SET agent = excluded.agent
		RETURNING id`
	selectPrincipalID = `SELECT id FROM principals WHERE agent = $1 AND user_id = $2`
	selectSyncToken   = `SELECT sync_token FROM principals WHERE id = $1`
	// The token's time is the batch's: the time of the principal's last
	// completed sync, whose age status reports.
	updateSyncToken  = `UPDATE principals SET sync_token = $1, sync_token_ms = $2 WHERE id = $3`
	selectMembership = `SELECT epoch, departed FROM rooms WHERE principal = $1 AND room_id = $2`
)

// Principal is a principal with its row ID. Commands take it from a
// principal-bound view, never from a caller.
type Principal struct {
	journal.Principal
	ID int64
}

// Principal implements journal.Store: the view bound to one principal,
// registered on first use (looked up alone on a read-only store).
func (s *Store) Principal(ctx context.Context, agent, userID string) (journal.PrincipalStore, error) {
	jp, err := journal.NewPrincipal(agent, userID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.principals[jp]; ok {
		return v, nil
	}
	var id int64
	if s.readOnly {
		// Nothing may be registered: a principal the journal never saw
		// is an error.
		err := s.pool.QueryRow(ctx, selectPrincipalID, agent, userID).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("%w: %s", ErrUnknownPrincipal, jp)
		}
		if err != nil {
			return nil, fmt.Errorf("lookup principal: %w", err)
		}
	} else if err := s.pool.QueryRow(ctx, insertPrincipal, agent, userID).Scan(&id); err != nil {
		return nil, fmt.Errorf("register principal: %w", err)
	}
	v := &View{s: s, p: Principal{Principal: jp, ID: id}}
	s.principals[jp] = v
	return v, nil
}

// syncToken reads p's stored sync token.
func (s *Store) syncToken(ctx context.Context, p Principal) (string, error) {
	var tok string
	if err := s.pool.QueryRow(ctx, selectSyncToken, p.ID).Scan(&tok); err != nil {
		return "", fmt.Errorf("read sync token: %w", err)
	}
	return tok, nil
}

// querier is a transaction or the pool: what a read runs on.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// membershipOf reads p's epoch in room and whether p is out of it; a room
// never seen is at epoch 0, joined.
func membershipOf(ctx context.Context, q querier, p Principal, room string) (epoch int64, departed bool, err error) {
	err = q.QueryRow(ctx, selectMembership, p.ID, room).Scan(&epoch, &departed)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return epoch, departed, err
}
