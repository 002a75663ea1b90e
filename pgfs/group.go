package pgfs

import (
	"context"
	"sync"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journalsql"
)

// Group commit. A principal's commands commit one at a time behind its
// row lock, so a principal with many senders spends most of each command
// in the transaction's own costs: BEGIN, the lock, COMMIT and its WAL
// flush. Commands of one principal that arrive while one is running wait
// in its queue, and the next of them leads: it runs the whole queue (up
// to MaxGroup) in one transaction, each command in a savepoint of its own
// so one that fails is rolled back alone, as the SQLite writer does. One
// principal's commands still commit in the order they arrived, and
// different principals still write in parallel.
const (
	// MaxGroup bounds the commands one transaction gathers when
	// Options.MaxGroup is zero.
	MaxGroup = 64

	savepointCommand = `SAVEPOINT command`
	rollbackCommand  = `ROLLBACK TO SAVEPOINT command`
	// nextCommand ends one command's savepoint and opens the next's in one
	// round trip: a statement without arguments goes by the simple
	// protocol, which takes several.
	nextCommand = `RELEASE SAVEPOINT command; SAVEPOINT command`
)

// command is one write command waiting in its principal's queue.
type command struct {
	ctx  context.Context
	run  func(journalsql.Tx) ([]hint.Hint, error)
	done chan error
	// lead tells a waiting command to lead the next transaction.
	lead chan struct{}
}

// queue is one principal's waiting commands.
type queue struct {
	mu      sync.Mutex
	waiting []*command
	// running is set while a leader is taking commands from the queue.
	running bool
}

// queueOf returns principal's queue.
func (s *Store) queueOf(principal int64) *queue {
	q, _ := s.queues.LoadOrStore(principal, &queue{})
	return q.(*queue)
}

// group runs run as one of principal's commands, in a transaction of its
// own or gathered with others that arrived meanwhile. The wait for a
// transaction already running is not cut short by ctx: a command whose
// turn comes after its caller gave up is skipped, with ctx's error.
func (s *Store) group(ctx context.Context, principal int64, run func(journalsql.Tx) ([]hint.Hint, error)) error {
	c := &command{ctx: ctx, run: run, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	q := s.queueOf(principal)
	q.mu.Lock()
	q.waiting = append(q.waiting, c)
	lead := !q.running
	q.running = true
	q.mu.Unlock()
	for {
		if lead {
			s.leadGroup(principal, q)
			lead = false
		}
		select {
		case err := <-c.done:
			return err
		case <-c.lead:
			lead = true
		}
	}
}

// leadGroup commits the commands waiting in q, up to MaxGroup, and hands
// the lead to the first still waiting.
func (s *Store) leadGroup(principal int64, q *queue) {
	q.mu.Lock()
	n := min(len(q.waiting), s.maxGroup)
	batch := append([]*command(nil), q.waiting[:n]...)
	q.waiting = q.waiting[n:]
	q.mu.Unlock()

	s.commitGroup(principal, batch)

	q.mu.Lock()
	if len(q.waiting) == 0 {
		q.running = false
	} else {
		q.waiting[0].lead <- struct{}{}
	}
	q.mu.Unlock()
}

// commitGroup runs batch in one transaction and tells each command its
// outcome. A lone command is the transaction, as it always was. In a
// group, a command that fails is rolled back to its savepoint and fails
// alone; one PostgreSQL asks to retry, and every command of a group whose
// commit failed, runs again in a transaction of its own.
func (s *Store) commitGroup(principal int64, batch []*command) {
	if len(batch) == 1 {
		c := batch[0]
		c.done <- s.writeRetrying(c.ctx, principal, c.run)
		return
	}
	var (
		ran     []*command
		hints   []hint.Hint
		retried []*command
	)
	err := s.transaction(context.Background(), principal, func(t *Tx) error {
		// open is set while a savepoint is open for the next command.
		open := false
		for _, c := range batch {
			if err := c.ctx.Err(); err != nil {
				c.done <- err
				continue
			}
			if !open {
				if _, err := t.exec(savepointCommand); err != nil {
					return err
				}
			}
			// The group's statements run under its own context: a command's
			// caller giving up mid-statement would have pgx close the
			// connection under every command of the group.
			h, err := c.run(t)
			if err != nil {
				if _, rerr := t.exec(rollbackCommand); rerr != nil {
					return rerr
				}
				// Rolled back to it, the savepoint stays open for the next.
				open = true
				if retryable(err) {
					retried = append(retried, c)
				} else {
					c.done <- err
				}
				continue
			}
			if _, err := t.exec(nextCommand); err != nil {
				return err
			}
			open = true
			ran, hints = append(ran, c), append(hints, h...)
		}
		// COMMIT releases the savepoint left open.
		return s.notify(t, hints)
	})
	if err != nil {
		// Nothing of the group committed: each command it ran runs again
		// by itself, and so gets an outcome of its own.
		retried = append(retried, ran...)
	} else {
		s.publish(hints)
		for _, c := range ran {
			c.done <- nil
		}
	}
	for _, c := range retried {
		c.done <- s.writeRetrying(c.ctx, principal, c.run)
	}
}

// writeRetrying runs one command in a transaction of its own, again from
// the start when PostgreSQL aborted it as a deadlock victim or for a
// serialization conflict.
func (s *Store) writeRetrying(ctx context.Context, principal int64, run func(journalsql.Tx) ([]hint.Hint, error)) error {
	for attempt := 1; ; attempt++ {
		hints, err := s.writeOnce(ctx, principal, run)
		if err == nil {
			s.publish(hints)
			return nil
		}
		if attempt == maxAttempts || !retryable(err) {
			return err
		}
	}
}
