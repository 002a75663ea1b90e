package pgfs

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mindroomd/mindroomd/hint"
)

const (
	// One channel for every store; a notification names its store's
	// generation, and a listener drops another store's.
	listenHints = `LISTEN mindroomd_hints`
	notifyHint  = `SELECT pg_notify('mindroomd_hints', $1)`
	// notifyHints queues a command's, or a group's, notifications in one
	// round trip.
	notifyHints = `SELECT count(pg_notify('mindroomd_hints', n)) FROM unnest($1::text[]) AS n`
)

// notification is a hint as it travels: who, where, and how far, never
// the payload.
type notification struct {
	Generation string `json:"g"`
	// Origin names the store that committed, which wakes its own
	// subscribers at once and drops its own notification.
	Origin    string `json:"o"`
	Principal string `json:"p"`
	Room      string `json:"r,omitempty"`
	Position  int64  `json:"n,omitempty"`
}

// notify queues the hints in the transaction: PostgreSQL delivers them if,
// and only when, it commits.
func (s *Store) notify(t *Tx, hints []hint.Hint) error {
	if len(hints) == 0 {
		return nil
	}
	payloads := make([]string, len(hints))
	for i, h := range hints {
		payload, err := json.Marshal(notification{Generation: s.generation, Origin: s.origin, Principal: h.Principal, Room: h.Room, Position: h.Position})
		if err != nil {
			return err
		}
		payloads[i] = string(payload)
	}
	if _, err := t.exec(notifyHints, payloads); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	return nil
}

// publish wakes this process's subscribers at once after a commit; other
// processes learn of it through the notification.
func (s *Store) publish(hints []hint.Hint) {
	if len(hints) > 0 {
		s.hints.Publish(hints)
	}
}

// listenConn opens the listener's own connection, outside the pool, and
// listens on it.
func listenConn(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, redact(err)
	}
	if _, err := conn.Exec(ctx, listenHints); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// Reconnect delays of the listener.
const (
	minListenBackoff = 100 * time.Millisecond
	maxListenBackoff = 5 * time.Second
)

// Bounds of the listener's waits on a connection that may have gone
// half-open, where a read or a write can block for ever.
const (
	// maxPingTimeout bounds the wait for a heartbeat's ping.
	maxPingTimeout = 5 * time.Second
	// listenConnectTimeout bounds one reconnection: connecting and
	// listening.
	listenConnectTimeout = 30 * time.Second
	// closeTimeout bounds saying goodbye to a lost connection.
	closeTimeout = time.Second
)

// listen relays notifications to the bus until ctx ends, reconnecting
// after a lost connection. A notification sent while no connection
// listened is gone, so every reconnection wakes every subscriber, and each
// re-reads from its own cursor. (Open listened before it returned: nothing
// was missed then.)
func (s *Store) listen(ctx context.Context, cfg *pgx.ConnConfig, conn *pgx.Conn) {
	backoff := minListenBackoff
	for {
		if conn != nil {
			err := s.relay(ctx, conn)
			closeConn(conn)
			if ctx.Err() != nil {
				return
			}
			s.log.Warn().Err(err).Msg("Hint listener lost its connection; reconnecting")
			backoff = minListenBackoff
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		var err error
		cctx, cancel := context.WithTimeout(ctx, listenConnectTimeout)
		conn, err = listenConn(cctx, cfg)
		cancel()
		if err != nil {
			s.log.Warn().Err(err).Dur("retry_in", backoff).Msg("Hint listener cannot connect")
			backoff = min(2*backoff, maxListenBackoff)
			continue
		}
		s.hints.WakeAll()
	}
}

// closeConn closes a connection that may be half-open, where the
// goodbye could block.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}

// relay hands each notification of this store to the bus. A connection
// gone half-open delivers nothing and reports no error, and TCP
// keepalives are answered by any proxy on the way, so after a heartbeat
// without a notification relay pings the server, and returns the error of
// a ping that fails or goes unanswered, as of a lost connection.
func (s *Store) relay(ctx context.Context, conn *pgx.Conn) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, s.heartbeat)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil && pgconn.Timeout(err) && ctx.Err() == nil {
			pctx, cancel := context.WithTimeout(ctx, min(s.heartbeat, maxPingTimeout))
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("ping: %w", err)
			}
			continue
		}
		if err != nil {
			return err
		}
		var note notification
		if json.Unmarshal([]byte(n.Payload), &note) != nil || note.Generation != s.generation || note.Origin == s.origin {
			continue
		}
		s.hints.Publish([]hint.Hint{{Principal: note.Principal, Room: note.Room, Position: note.Position}})
	}
}
