package pgfs

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journalsql"
)

// Group runs run as one of principal's commands through the group commit.
func (s *Store) Group(ctx context.Context, principal int64, run func(*Tx) error) error {
	return s.group(ctx, principal, func(t journalsql.Tx) ([]hint.Hint, error) { return nil, run(t.(*Tx)) })
}

// Waiting counts principal's commands waiting for a transaction.
func (s *Store) Waiting(principal int64) int {
	q := s.queueOf(principal)
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiting)
}

// Raw runs a statement of the test's own in the transaction.
func (t *Tx) Raw(query string, args ...any) error {
	_, err := t.exec(query, args...)
	return err
}

// ID is the transaction's ID.
func (t *Tx) ID() (int64, error) {
	var id int64
	err := t.tx.QueryRow(t.ctx, `SELECT txid_current()`).Scan(&id)
	return id, err
}

// Pool is the store's connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// LeaseKey is the advisory lock key of principal's lease.
func (s *Store) LeaseKey(principal int64) int64 { return s.leaseKey(principal) }
