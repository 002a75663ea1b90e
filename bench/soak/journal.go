package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	// The plain drivers: the soak reads the journal as any SQLite or
	// PostgreSQL reader would, beside none of the store's code.
	_ "github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

// The journal queries, one text for both databases where it can be: the
// tables and their columns are the same in SQLite and PostgreSQL. States
// are the journal's: an event is pending while state = 0; an outbox row is
// queued (0), attempted (1), acknowledged (2), failed (3) or retired (4); a
// turn record is delivered at state 2. An encrypted event journaled before
// its key came waits at state 2; one whose key never came is settled
// undecryptable at state 3.
const (
	// selectDuplicateEvents counts the event IDs one principal holds more
	// than one row for, and the rows beyond the first. PostgreSQL wants
	// the subquery named, and its sum of bigints is a numeric.
	selectDuplicateEvents = `SELECT count(*), CAST(coalesce(sum(n - 1), 0) AS bigint) FROM
		(SELECT count(*) AS n FROM journal_events GROUP BY principal, event_id HAVING count(*) > 1) AS duplicated`
	selectPending        = `SELECT count(*) FROM journal_events WHERE state = 0`
	selectUnacknowledged = `SELECT count(*) FROM delivery_outbox WHERE state IN (0, 1)`
	selectFailed         = `SELECT count(*) FROM delivery_outbox WHERE state = 3`
	selectOpenTurns      = `SELECT count(*) FROM turn_records WHERE state <> 2`
	selectAwaitingKeys   = `SELECT count(*) FROM journal_events WHERE state = 2`
	selectUndecryptable  = `SELECT count(*) FROM journal_events WHERE state = 3`
	// selectAgentEvents is every row of the agent's principals.
	selectAgentEvents = `SELECT j.event_id, j.class FROM journal_events j
		JOIN principals p ON p.id = j.principal WHERE p.agent = ?`
	// selectReplyDelivery is the acknowledged event of one reply's final.
	selectReplyDelivery = `SELECT o.event_id FROM delivery_outbox o
		JOIN principals p ON p.id = o.principal WHERE p.agent = ? AND o.delivery_id = ? AND o.stage = ? AND o.state = 2`
	// selectAgentEventsPG and selectReplyDeliveryPG are PostgreSQL's texts
	// of the two: its placeholders are numbered.
	selectAgentEventsPG = `SELECT j.event_id, j.class FROM journal_events j
		JOIN principals p ON p.id = j.principal WHERE p.agent = $1`
	selectReplyDeliveryPG = `SELECT o.event_id FROM delivery_outbox o
		JOIN principals p ON p.id = o.principal WHERE p.agent = $1 AND o.delivery_id = $2 AND o.stage = $3 AND o.state = 2`
	// selectHeldByPG are the agents whose principal's row names the
	// replica the lease holder, and whose lease it took since a moment
	// (PostgreSQL's journal only). A replica clears the name when it hands
	// a lease back, but one that died leaves it until another takes the
	// lease: the moment, its running process's start, leaves out the
	// leases a killed process of the same name held.
	selectHeldByPG = `SELECT DISTINCT agent FROM principals WHERE lease_holder = $1 AND lease_since_ms >= $2 ORDER BY agent`
	// selectReplicaPG counts the replica's rows among those that beat:
	// one once it has joined.
	selectReplicaPG = `SELECT count(*) FROM replicas WHERE id = $1`
)

// journalAt is where the daemon keeps its journal: the SQLite file under
// storage, or, when pgURL is set, the PostgreSQL database (and the schema
// its search_path names) pgURL names. pgURL may hold a password: it is
// never printed.
type journalAt struct {
	storage string
	pgURL   string
}

// String names the kind of journal, for the report.
func (j journalAt) String() string {
	if j.pgURL != "" {
		return "PostgreSQL"
	}
	return "SQLite"
}

// journalDB is an open journal and which dialect its database speaks.
type journalDB struct {
	*sql.DB
	postgres bool
}

// open opens the journal for reading only: nothing this process does can
// change it.
func (j journalAt) open() (*journalDB, error) {
	if j.pgURL == "" {
		db, err := openSQLite(j.storage)
		if err != nil {
			return nil, err
		}
		return &journalDB{DB: db}, nil
	}
	cfg, err := pgx.ParseConfig(j.pgURL)
	if err != nil {
		// pgx's error would quote the URL.
		return nil, errors.New("open journal: the database URL does not parse")
	}
	// PostgreSQL itself refuses every write of such a session.
	cfg.RuntimeParams["default_transaction_read_only"] = "on"
	return &journalDB{DB: stdlib.OpenDB(*cfg), postgres: true}, nil
}

// journalTally is what the journal holds after the daemon stopped.
type journalTally struct {
	// DuplicateIDs counts event IDs with more than one row;
	// DuplicateRows the rows beyond the first.
	DuplicateIDs, DuplicateRows int64
	// Pending counts actionable events never settled.
	Pending int64
	// Unacknowledged counts replies queued or attempted, never
	// acknowledged; Failed those given up on.
	Unacknowledged, Failed int64
	// OpenTurns counts turn records not delivered.
	OpenTurns int64
	// AwaitingKeys counts encrypted events still waiting for their keys;
	// Undecryptable those settled because their keys never came.
	AwaitingKeys, Undecryptable int64
	// NotJournaled are room events the journal has no row of.
	NotJournaled []string
	// NotWork are the person's messages admitted as context only, so never
	// offered to the agent.
	NotWork []string
	// OutboxMismatch are answers the outbox does not record as the
	// acknowledged final of their source's reply.
	OutboxMismatch []string
}

// agentShare is one agent's part of the soak, for the journal's checks:
// the person's messages in its room, the room's other message events it
// should hold, and its answers.
type agentShare struct {
	agent   string
	msgs    []sent
	others  []string
	answers []answer
}

// readJournal opens the journal at read-only (no lock, no migration) and
// tallies it: the whole database for duplicates and what is still owed;
// each agent's principal for each of the person's messages in its room,
// the other room events it should hold and its answers.
func readJournal(ctx context.Context, at journalAt, shares []agentShare) (journalTally, error) {
	var t journalTally
	db, err := at.open()
	if err != nil {
		return t, err
	}
	defer db.Close()
	if err := db.QueryRowContext(ctx, selectDuplicateEvents).Scan(&t.DuplicateIDs, &t.DuplicateRows); err != nil {
		return t, fmt.Errorf("count duplicate events: %w", err)
	}
	for _, err := range []error{
		db.QueryRowContext(ctx, selectPending).Scan(&t.Pending),
		db.QueryRowContext(ctx, selectUnacknowledged).Scan(&t.Unacknowledged),
		db.QueryRowContext(ctx, selectFailed).Scan(&t.Failed),
		db.QueryRowContext(ctx, selectOpenTurns).Scan(&t.OpenTurns),
		db.QueryRowContext(ctx, selectAwaitingKeys).Scan(&t.AwaitingKeys),
		db.QueryRowContext(ctx, selectUndecryptable).Scan(&t.Undecryptable),
	} {
		if err != nil {
			return t, fmt.Errorf("count what is owed: %w", err)
		}
	}
	for _, sh := range shares {
		if err := tallyAgent(ctx, db, sh, &t); err != nil {
			return t, err
		}
	}
	return t, nil
}

// tallyAgent adds to t what the agent's principal lacks of sh.
func tallyAgent(ctx context.Context, db *journalDB, sh agentShare, t *journalTally) error {
	class, err := agentEvents(ctx, db, sh.agent)
	if err != nil {
		return err
	}
	isMsg := map[string]bool{}
	for _, m := range sh.msgs {
		isMsg[m.ID] = true
		switch c, ok := class[m.ID]; {
		case !ok:
			t.NotJournaled = append(t.NotJournaled, m.ID)
		case c != int64(journal.Actionable):
			t.NotWork = append(t.NotWork, m.ID)
		}
	}
	for _, id := range sh.others {
		if _, ok := class[id]; !ok && !isMsg[id] {
			t.NotJournaled = append(t.NotJournaled, id)
		}
	}
	for _, a := range sh.answers {
		var acked string
		query := selectReplyDelivery
		if db.postgres {
			query = selectReplyDeliveryPG
		}
		err := db.QueryRowContext(ctx, query, sh.agent, journal.ReplyDeliveryID(a.Source), int64(journal.StageFinal)).Scan(&acked)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("read the delivery of %s: %w", a.ID, err)
		}
		if acked != a.ID {
			t.OutboxMismatch = append(t.OutboxMismatch, a.ID)
		}
	}
	return nil
}

// openSQLite opens the SQLite journal under storage for reading only:
// mode=ro and query_only, so nothing this process does can change the
// file, and a wait of up to 5 s for a writer's lock.
func openSQLite(storage string) (*sql.DB, error) {
	path, err := filepath.Abs(sqlitefs.Path(storage))
	if err != nil {
		return nil, err
	}
	q := url.Values{"mode": {"ro"}, "_query_only": {"true"}, "_busy_timeout": {"5000"}}
	db, err := sql.Open("sqlite3", (&url.URL{Scheme: "file", Path: path, RawQuery: q.Encode()}).String())
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	return db, nil
}

// readAgentEvents is agentEvents of each of the agents, together, in the
// journal at, read beside the running daemons.
func readAgentEvents(ctx context.Context, at journalAt, agents []string) (map[string]int64, error) {
	db, err := at.open()
	if err != nil {
		return nil, err
	}
	defer db.Close()
	all := map[string]int64{}
	for _, agent := range agents {
		class, err := agentEvents(ctx, db, agent)
		if err != nil {
			return nil, err
		}
		maps.Copy(all, class)
	}
	return all, nil
}

// heldBy are the agents whose leases the replica named replica has taken
// since since, its running process's start, and holds, as the PostgreSQL
// journal at records them, read beside the running replicas.
func heldBy(ctx context.Context, at journalAt, replica string, since time.Time) ([]string, error) {
	db, err := at.open()
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, selectHeldByPG, replica, since.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("read the leases of replica %s: %w", replica, err)
	}
	defer rows.Close()
	var agents []string
	for rows.Next() {
		var agent string
		if err := rows.Scan(&agent); err != nil {
			return nil, fmt.Errorf("read the leases of replica %s: %w", replica, err)
		}
		agents = append(agents, agent)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the leases of replica %s: %w", replica, err)
	}
	return agents, nil
}

// agentEvents is the class of each event the agent's principals hold.
func agentEvents(ctx context.Context, db *journalDB, agent string) (map[string]int64, error) {
	query := selectAgentEvents
	if db.postgres {
		query = selectAgentEventsPG
	}
	rows, err := db.QueryContext(ctx, query, agent)
	if err != nil {
		return nil, fmt.Errorf("read the agent's events: %w", err)
	}
	defer rows.Close()
	class := map[string]int64{}
	for rows.Next() {
		var id string
		var c int64
		if err := rows.Scan(&id, &c); err != nil {
			return nil, fmt.Errorf("read the agent's events: %w", err)
		}
		class[id] = c
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the agent's events: %w", err)
	}
	return class, nil
}

// beats reports whether the replica named replica has beaten in the
// PostgreSQL journal at: it has opened the journal, migrated it to its
// schema, and joined the replicas. A journal not migrated yet has no
// replicas table, and that is an error.
func beats(ctx context.Context, at journalAt, replica string) (bool, error) {
	db, err := at.open()
	if err != nil {
		return false, err
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(ctx, selectReplicaPG, replica).Scan(&n); err != nil {
		return false, fmt.Errorf("read the replicas: %w", err)
	}
	return n > 0, nil
}
