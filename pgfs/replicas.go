package pgfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Replicas: every daemon sharing the journal beats in the replicas table,
// by the database's clock, so that hosts whose clocks disagree still agree
// on who is alive; the live ones divide the principals between them. A
// replica beats on a connection of its own that holds its presence lock:
// a replica that dies loses the lock with the connection at once, and one
// that stalls loses it when the server ends the idle connection, so it
// stops counting as live long before its last beat grows old.
const (
	// dbNowMS is the database's clock in integer milliseconds.
	dbNowMS       = `(extract(epoch from clock_timestamp()) * 1000)::bigint`
	upsertReplica = `INSERT INTO replicas (id, api_url, started_ms, heartbeat_ms)
		VALUES ($1, $2, ` + dbNowMS + `, ` + dbNowMS + `)
		ON CONFLICT (id) DO UPDATE SET api_url = excluded.api_url, heartbeat_ms = excluded.heartbeat_ms`
	// deleteReplica takes a replica out as it shuts down; forgetReplicas
	// drops the long dead, so the table stays the size of the fleet.
	deleteReplica  = `DELETE FROM replicas WHERE id = $1`
	forgetReplicas = `DELETE FROM replicas WHERE heartbeat_ms < ` + dbNowMS + ` - $1`
	selectReplicas = `SELECT id, api_url, started_ms, heartbeat_ms, ` + dbNowMS + ` - heartbeat_ms FROM replicas ORDER BY id`
	selectHolders  = `SELECT id, agent, user_id, lease_holder, lease_since_ms, lease_generation
		FROM principals ORDER BY agent, user_id`
	// selectHeldLeases lists every advisory lock held in the database, as
	// the key pg_try_advisory_lock took: a principal whose key is absent
	// is free to take, whatever its row still names.
	selectHeldLeases = `SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND granted`
	// selectOwner is where the live holder of agent's lease answers.
	selectOwner = `SELECT r.id, r.api_url FROM principals p JOIN replicas r ON r.id = p.lease_holder
		WHERE p.agent = $1 AND r.heartbeat_ms > ` + dbNowMS + ` - $2`

	// terminateLeases ends a silent replica's lease sessions, whose locks
	// would otherwise outlive it until the server found them idle, and
	// waits (up to 5 s) until they are gone, their locks with them.
	terminateLeases = `SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`
	// leaseApplication and presenceApplication start the application_name
	// of a replica's lease and presence sessions; the replica's name ends
	// it.
	leaseApplication    = "mindroomd lease "
	presenceApplication = "mindroomd replica "

	// tryPresence takes the replica's presence lock, without waiting: a
	// replica of the same name already running holds it.
	tryPresence = `SELECT pg_try_advisory_lock($1)`

	// forgetAfter is how long a silent replica stays listed.
	forgetAfter = 24 * time.Hour
)

// ErrReplicaRunning refuses a replica whose name a running replica has.
var ErrReplicaRunning = errors.New("a replica of this name is already running on the journal")

// ErrNoOwner reports an agent no live replica holds: its lease is being
// taken over.
var ErrNoOwner = errors.New("no live replica holds the agent's lease")

// Replica is one daemon sharing the journal, as its heartbeats show it.
type Replica struct {
	ID string
	// APIURL is where its agent API answers.
	APIURL string
	// StartedMS and HeartbeatMS are the database's clock at its first
	// and its latest beat; Age is how long ago that beat was.
	StartedMS, HeartbeatMS int64
	Age                    time.Duration
	// Live is a beat within the takeover time from a replica still
	// holding its presence lock.
	Live bool
}

// Holder is one principal's lease as the journal records it.
type Holder struct {
	Principal     int64
	Agent, UserID string
	// Replica is the holder, "" when none; SinceMS when it took the lease,
	// Generation the lease generation it took.
	Replica    string
	SinceMS    int64
	Generation int64
}

// Beat records this replica alive, advertising apiURL, and forgets the
// replicas silent for a day. The first beat, and the first after the
// presence connection failed, takes the presence lock on a new one.
func (s *Store) Beat(ctx context.Context, apiURL string) error {
	s.presenceMu.Lock()
	defer s.presenceMu.Unlock()
	if s.presence == nil {
		conn, err := pgx.ConnectConfig(ctx, s.presenceConfig())
		if err != nil {
			return fmt.Errorf("heartbeat: %w", redact(err))
		}
		var held bool
		if err := conn.QueryRow(ctx, tryPresence, s.presenceKey(s.replica)).Scan(&held); err != nil || !held {
			_ = conn.Close(context.Background())
			if err == nil {
				err = fmt.Errorf("%w: %s", ErrReplicaRunning, s.replica)
			}
			return fmt.Errorf("heartbeat: %w", err)
		}
		s.presence = conn
	}
	_, err := s.presence.Exec(ctx, upsertReplica, s.replica, apiURL)
	if err == nil {
		_, err = s.presence.Exec(ctx, forgetReplicas, forgetAfter.Milliseconds())
	}
	if err != nil {
		// The next beat starts over on a new session.
		_ = s.presence.Close(context.Background())
		s.presence = nil
		return fmt.Errorf("heartbeat: %w", redact(err))
	}
	return nil
}

// presenceConfig is how the presence connection is opened: beaten on
// every Takeover/5, so the server ends it once it has been idle for half
// the takeover time, and a stalled replica stops counting as live.
func (s *Store) presenceConfig() *pgx.ConnConfig {
	c := s.leaseConfig.Copy()
	c.RuntimeParams["application_name"] = presenceApplication + s.replica
	c.RuntimeParams["idle_session_timeout"] = strconv.FormatInt((s.takeover / 2).Milliseconds(), 10)
	return c
}

// TerminateLeases ends the lease sessions of the replica named id, which
// is no longer live, so that its leases can be taken at once; it returns
// how many it ended. The session's role must be allowed to signal the
// replica's (the same role, or pg_signal_backend).
func (s *Store) TerminateLeases(ctx context.Context, id string) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, terminateLeases, leaseApplication+id).Scan(&n); err != nil {
		return 0, fmt.Errorf("end a silent replica's leases: %w", redact(err))
	}
	return n, nil
}

// presenceKey is the advisory lock of the replica named id's presence.
func (s *Store) presenceKey(id string) int64 {
	h := fnv.New64a()
	_, _ = fmt.Fprintf(h, "mindroomd replica %s %s", s.generation, id)
	return int64(h.Sum64())
}

// Leave takes this replica out of the live ones, as it shuts down: the
// others' fair share grows at once.
func (s *Store) Leave(ctx context.Context) error {
	s.presenceMu.Lock()
	defer s.presenceMu.Unlock()
	_, err := s.pool.Exec(ctx, deleteReplica, s.replica)
	if s.presence != nil {
		_ = s.presence.Close(context.Background())
		s.presence = nil
	}
	if err != nil {
		return fmt.Errorf("leave the replicas: %w", redact(err))
	}
	return nil
}

// heldLocks is the set of advisory locks held in the database now.
func (s *Store) heldLocks(ctx context.Context) (map[int64]bool, error) {
	rows, err := s.pool.Query(ctx, selectHeldLeases)
	if err != nil {
		return nil, fmt.Errorf("read held leases: %w", redact(err))
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read held leases: %w", redact(err))
	}
	held := make(map[int64]bool, len(keys))
	for _, k := range keys {
		held[k] = true
	}
	return held, nil
}

// Replicas lists the replicas that beat, live or not.
func (s *Store) Replicas(ctx context.Context) ([]Replica, error) {
	rows, err := s.pool.Query(ctx, selectReplicas)
	if err != nil {
		return nil, fmt.Errorf("read replicas: %w", redact(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Replica, error) {
		var r Replica
		var age int64
		err := row.Scan(&r.ID, &r.APIURL, &r.StartedMS, &r.HeartbeatMS, &age)
		r.Age = time.Duration(age) * time.Millisecond
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("read replicas: %w", redact(err))
	}
	held, err := s.heldLocks(ctx)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Live = out[i].Age < s.takeover && held[s.presenceKey(out[i].ID)]
	}
	return out, nil
}

// Holders lists every principal with the lease holder its row names.
func (s *Store) Holders(ctx context.Context) ([]Holder, error) {
	rows, err := s.pool.Query(ctx, selectHolders)
	if err != nil {
		return nil, fmt.Errorf("read lease holders: %w", redact(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Holder, error) {
		var h Holder
		err := row.Scan(&h.Principal, &h.Agent, &h.UserID, &h.Replica, &h.SinceMS, &h.Generation)
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("read lease holders: %w", redact(err))
	}
	return out, nil
}

// Free reports which of principals no replica holds the lease of now.
func (s *Store) Free(ctx context.Context, principals []int64) (map[int64]bool, error) {
	held, err := s.heldLocks(ctx)
	if err != nil {
		return nil, err
	}
	free := make(map[int64]bool, len(principals))
	for _, p := range principals {
		free[p] = !held[s.leaseKey(p)]
	}
	return free, nil
}

// Owner is the live replica holding agent's lease, and where its API
// answers; ErrNoOwner when none does.
func (s *Store) Owner(ctx context.Context, agent string) (replica, apiURL string, err error) {
	err = s.pool.QueryRow(ctx, selectOwner, agent, s.takeover.Milliseconds()).Scan(&replica, &apiURL)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", "", ErrNoOwner
	case err != nil:
		return "", "", fmt.Errorf("read the agent's owner: %w", redact(err))
	}
	return replica, apiURL, nil
}

// Takeover is how long a stalled replica keeps its leases.
func (s *Store) Takeover() time.Duration { return s.takeover }

// ReplicaID is the name this replica beats and holds leases under.
func (s *Store) ReplicaID() string { return s.replica }

// notifyLeases tells every replica a lease was handed back.
func (s *Store) notifyLeases(ctx context.Context, conn *pgx.Conn) error {
	payload, err := json.Marshal(notification{Generation: s.generation, Origin: s.origin, Principal: LeaseTopic})
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, notifyHint, string(payload)); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	return nil
}
