package sqlitefs

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Tx is a write transaction as the commands in this package see it: the
// writer's connection with its batch transaction open, the batch time, and
// the statements prepared on that connection.
type Tx struct {
	conn        *sql.Conn
	db          *DB
	now         time.Time
	afterCommit func(func())
}

// WrapTx adapts the writer's connection, inside its batch transaction.
// afterCommit, when set, runs a function once the transaction has committed
// (writer.Tx.AfterCommit); without it nothing learned in the transaction is
// cached.
func (db *DB) WrapTx(conn *sql.Conn, now time.Time, afterCommit func(func())) *Tx {
	return &Tx{conn: conn, db: db, now: now, afterCommit: afterCommit}
}

// stmt returns the statement for a constant query prepared on the writer's
// connection, preparing it on first use. Statements live as long as the
// connection, so each is parsed once per process, not once per call.
func (t *Tx) stmt(query string) (*sql.Stmt, error) {
	t.db.stmtMu.Lock()
	defer t.db.stmtMu.Unlock()
	if t.db.stmtConn != t.conn {
		for _, s := range t.db.stmts {
			_ = s.Close()
		}
		t.db.stmts, t.db.stmtConn = make(map[string]*sql.Stmt), t.conn
	}
	if s, ok := t.db.stmts[query]; ok {
		return s, nil
	}
	s, err := t.conn.PrepareContext(context.Background(), query)
	if err != nil {
		return nil, fmt.Errorf("prepare %q: %w", query, err)
	}
	t.db.stmts[query] = s
	return s, nil
}

func (t *Tx) exec(query string, args ...any) (sql.Result, error) {
	s, err := t.stmt(query)
	if err != nil {
		return nil, err
	}
	r, err := s.Exec(args...)
	return r, mapErr(err)
}

func (t *Tx) query(query string, args ...any) (*sql.Rows, error) {
	s, err := t.stmt(query)
	if err != nil {
		return nil, err
	}
	rows, err := s.Query(args...)
	return rows, mapErr(err)
}

// queryRow runs a one-row query; a prepare failure surfaces from Scan.
func (t *Tx) queryRow(query string, args ...any) *sql.Row {
	s, err := t.stmt(query)
	if err != nil {
		return t.conn.QueryRowContext(context.Background(), query, args...)
	}
	return s.QueryRow(args...)
}

// nowMS is the batch time in integer milliseconds, the stored form.
func (t *Tx) nowMS() int64 { return t.now.UnixMilli() }
