package sqlitefs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
)

const (
	selectPrincipalID = `SELECT id FROM principals WHERE agent = ? AND user_id = ?`
	insertPrincipal   = `INSERT INTO principals (agent, user_id) VALUES (?, ?)
		ON CONFLICT (agent, user_id) DO UPDATE SET agent = excluded.agent
		RETURNING id`
	selectSyncToken = `SELECT sync_token FROM principals WHERE id = ?`
	// The token's time is the batch's: the time of the principal's last
	// completed sync, whose age status reports.
	updateSyncToken = `UPDATE principals SET sync_token = ?, sync_token_ms = ? WHERE id = ?`
)

// Principal is a principal with its interned row ID. Commands take it from
// a principal-bound view, never from a caller.
type Principal struct {
	journal.Principal
	ID int64
}

// LookupPrincipal finds an already registered principal through a reader.
func (db *DB) LookupPrincipal(ctx context.Context, p journal.Principal) (Principal, bool, error) {
	var id int64
	err := db.readers.QueryRowContext(ctx, selectPrincipalID, p.Agent, p.UserID).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return Principal{}, false, nil
	}
	if err != nil {
		return Principal{}, false, fmt.Errorf("lookup principal: %w", err)
	}
	return Principal{Principal: p, ID: id}, true, nil
}

// RegisterPrincipal interns a principal, returning the existing row if any.
func RegisterPrincipal(tx *Tx, p journal.Principal) (Principal, error) {
	var id int64
	if err := tx.queryRow(insertPrincipal, p.Agent, p.UserID).Scan(&id); err != nil {
		return Principal{}, fmt.Errorf("register principal: %w", err)
	}
	return Principal{Principal: p, ID: id}, nil
}

// SyncToken returns the principal's stored sync token.
func (db *DB) SyncToken(ctx context.Context, p Principal) (string, error) {
	var tok string
	if err := db.readers.QueryRowContext(ctx, selectSyncToken, p.ID).Scan(&tok); err != nil {
		return "", fmt.Errorf("read sync token: %w", err)
	}
	return tok, nil
}
