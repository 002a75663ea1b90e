package pgfs

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Leases: when several daemons share one database, each principal is served
// by the one replica that holds its lease. The lease is a session-level
// advisory lock, on a connection of the replica's own kept only for it, so
// it drops with that connection when the replica dies or loses the server;
// and taking it bumps the principal's lease generation. A store opened
// with Options.Leases commits a write only inside the principal's row lock
// and only while the generation there is the one its lease took: a replica
// that lost its lease (paused past it, cut off, slow to notice) commits
// nothing more, whatever it still believes. The generation is a fencing
// token.
const (
	tryLease     = `SELECT pg_try_advisory_lock($1)`
	releaseLease = `SELECT pg_advisory_unlock($1)`
	bumpLease    = `UPDATE principals SET lease_generation = lease_generation + 1, lease_holder = $2, lease_since_ms = $3
		WHERE id = $1 RETURNING lease_generation`
	// clearHolder runs as the lease is handed back, while this replica
	// still holds it: the holder it names is then gone from status at once.
	clearHolder = `UPDATE principals SET lease_holder = '' WHERE id = $1 AND lease_generation = $2`
	pingLease   = `SELECT 1`

	// DefaultTakeover is Options.Takeover's default.
	DefaultTakeover = 10 * time.Second
)

// LeaseTopic is the hint a replica publishes, to every replica sharing the
// journal, when it hands a lease back: no principal is named so.
const LeaseTopic = "mindroomd leases"

// ErrLeaseLost refuses a write of a principal whose lease this replica
// does not hold, or no longer holds.
var ErrLeaseLost = errors.New("this replica does not hold the principal's lease")

// Lease is this replica's hold on one principal.
type Lease struct {
	// Principal is the principal's row ID; Generation the lease generation
	// taking the lease set.
	Principal  int64
	Generation int64

	// SinceMS is when this replica took it.
	SinceMS int64

	s    *Store
	conn *pgx.Conn
	lost chan struct{}
	stop chan struct{}
	once sync.Once
	done sync.WaitGroup
}

// Lost is closed once the lease is gone: its connection failed, or it was
// released.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// TryLease takes principal's lease, when no replica holds it: on a
// connection of its own, the advisory lock, then the generation bumped.
// held is false when another replica holds it.
func (s *Store) TryLease(ctx context.Context, principal int64) (l *Lease, held bool, err error) {
	if !s.leasing {
		return nil, false, errors.New("the store was not opened for leases")
	}
	conn, err := pgx.ConnectConfig(ctx, s.leaseConfig.Copy())
	if err != nil {
		return nil, false, fmt.Errorf("lease: %w", redact(err))
	}
	if err := conn.QueryRow(ctx, tryLease, s.leaseKey(principal)).Scan(&held); err != nil || !held {
		_ = conn.Close(context.Background())
		if err != nil {
			return nil, false, fmt.Errorf("lease: %w", err)
		}
		return nil, false, nil
	}
	l = &Lease{Principal: principal, SinceMS: s.now().UnixMilli(), s: s, conn: conn, lost: make(chan struct{}),
		stop: make(chan struct{})}
	// The bump takes the principal's row lock: it waits for any write of
	// the last holder still running, and every write after it sees the
	// new generation. A holder stalled inside a transaction holds that
	// lock only until the server ends its idle transaction (Takeover/2).
	if err := conn.QueryRow(ctx, bumpLease, principal, s.replica, l.SinceMS).Scan(&l.Generation); err != nil {
		_ = conn.Close(context.Background())
		return nil, false, fmt.Errorf("lease: bump the generation: %w", err)
	}
	s.leases.Store(principal, l)
	l.done.Add(1)
	go l.watch()
	return l, true, nil
}

// watch checks the lease's connection every LeaseCheck and gives the lease
// up the moment it fails: the server has dropped the lock with it. Until
// Release stops it, the watcher is the only user of the connection (a
// pgx connection is not safe for concurrent use), so it is also the one
// that closes it once the lease is given up, here or by a refused write.
func (l *Lease) watch() {
	defer l.done.Done()
	t := time.NewTicker(l.s.leaseCheck)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.lost:
			_ = l.conn.Close(context.Background())
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.s.leaseCheck)
		_, err := l.conn.Exec(ctx, pingLease)
		cancel()
		if err != nil {
			l.s.log.Warn().Err(redact(err)).Int64("principal", l.Principal).Int64("generation", l.Generation).
				Msg("A lease's connection failed; the lease is lost")
			l.give()
			_ = l.conn.Close(context.Background())
			return
		}
	}
}

// Release hands the lease back at once: another replica may take it.
func (l *Lease) Release(ctx context.Context) error {
	var err error
	l.once.Do(func() {
		close(l.stop)
		l.done.Wait()
		l.forget()
		_, err = l.conn.Exec(ctx, clearHolder, l.Principal, l.Generation)
		var ok bool
		if uerr := l.conn.QueryRow(ctx, releaseLease, l.s.leaseKey(l.Principal)).Scan(&ok); err == nil {
			err = uerr
		}
		if err == nil {
			// The other replicas try for it now, not at their next round.
			err = l.s.notifyLeases(ctx, l.conn)
		}
		if cerr := l.conn.Close(context.Background()); err == nil {
			err = cerr
		}
		close(l.lost)
	})
	return err
}

// give drops a lease found lost: its connection failed, or a write found
// the generation moved on. The watcher closes the connection.
func (l *Lease) give() {
	l.once.Do(func() {
		l.forget()
		close(l.lost)
	})
}

// forget stops the store's writes under the lease.
func (l *Lease) forget() { l.s.leases.CompareAndDelete(l.Principal, l) }

// leaseKey is the advisory lock of principal's lease: advisory locks are
// the database's, not a schema's, so the key is the journal's generation
// and the principal's row ID, hashed; two journals in one database never
// share a lease.
func (s *Store) leaseKey(principal int64) int64 {
	h := fnv.New64a()
	_, _ = fmt.Fprintf(h, "mindroomd lease %s %d", s.generation, principal)
	return int64(h.Sum64())
}

// checkLease refuses, inside a write transaction that read the principal's
// generation under its row lock, a write this replica may not make. A
// generation that moved on means another replica took the lease: this
// one's is given up at once, whatever its connection still says.
func (s *Store) checkLease(principal, generation int64) error {
	if !s.leasing {
		return nil
	}
	v, ok := s.leases.Load(principal)
	if !ok {
		s.fenced.Add(1)
		return fmt.Errorf("%w: principal %d", ErrLeaseLost, principal)
	}
	if l := v.(*Lease); l.Generation != generation {
		s.fenced.Add(1)
		s.log.Warn().Int64("principal", principal).Int64("generation", generation).Int64("lease_generation", l.Generation).
			Msg("A write was refused: another replica took the principal's lease")
		l.give()
		return fmt.Errorf("%w: principal %d is at generation %d, the lease took %d", ErrLeaseLost, principal, generation, l.Generation)
	}
	return nil
}

// FencedWrites counts the writes refused because this replica did not, or
// no longer, held the principal's lease.
func (s *Store) FencedWrites() int64 { return s.fenced.Load() }
