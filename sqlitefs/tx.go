package sqlitefs

import (
	"database/sql"
	"time"
)

// Tx is a write transaction as the commands in this package see it: the
// writer's transaction, the batch time, and the writer's cache of prepared
// statements so hot commands do not re-parse their SQL on every call.
type Tx struct {
	tx  *sql.Tx
	db  *DB
	now time.Time
}

// WrapTx adapts a transaction begun on db.Writer.
func (db *DB) WrapTx(tx *sql.Tx, now time.Time) *Tx { return &Tx{tx: tx, db: db, now: now} }

// stmt binds the statement prepared at open to this transaction, or
// returns nil for a query that was not prepared (it then runs unprepared).
func (t *Tx) stmt(query string) *sql.Stmt {
	if s, ok := t.db.stmts[query]; ok {
		return t.tx.Stmt(s)
	}
	return nil
}

func (t *Tx) exec(query string, args ...any) (sql.Result, error) {
	var (
		r   sql.Result
		err error
	)
	if s := t.stmt(query); s != nil {
		r, err = s.Exec(args...)
	} else {
		r, err = t.tx.Exec(query, args...)
	}
	return r, mapErr(err)
}

func (t *Tx) queryRow(query string, args ...any) *sql.Row {
	if s := t.stmt(query); s != nil {
		return s.QueryRow(args...)
	}
	return t.tx.QueryRow(query, args...)
}

// nowMS is the batch time in integer milliseconds, the stored form.
func (t *Tx) nowMS() int64 { return t.now.UnixMilli() }
