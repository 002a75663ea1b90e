-- v2: turn records, the delivery outbox, and durable departure bookkeeping.

-- Whether the principal is currently out of the room after a departure. The
-- epoch only ever grows: a rejoin keeps the advanced epoch so nothing
-- authorized by the ended membership can act in the new one.
ALTER TABLE room_memberships ADD COLUMN departed INTEGER NOT NULL DEFAULT 0;

-- A local leave owes one sync-reported echo. One row per owed echo, so two
-- leaves before one echo owe two, and a restart forgets nothing.
CREATE TABLE owed_departure_reports (
    id        INTEGER PRIMARY KEY,
    principal INTEGER NOT NULL,
    room_id   TEXT    NOT NULL,
    owed_ms   INTEGER NOT NULL
);
CREATE INDEX owed_departure_reports_room ON owed_departure_reports (principal, room_id, id);

-- Membership observations already applied, so a replayed report is a no-op.
CREATE TABLE membership_observations (
    principal      INTEGER NOT NULL,
    observation_id TEXT    NOT NULL,
    room_id        TEXT    NOT NULL,
    PRIMARY KEY (principal, observation_id)
) WITHOUT ROWID;

-- Proof that events were answered, scoped to the agent name alone so a
-- re-login under a new Matrix ID does not answer them again.
CREATE TABLE turn_records (
    agent       TEXT    NOT NULL,
    turn_id     TEXT    NOT NULL,
    room_id     TEXT    NOT NULL,
    state       INTEGER NOT NULL,
    record_json TEXT    NOT NULL,
    event_id    TEXT    NOT NULL DEFAULT '',
    updated_ms  INTEGER NOT NULL,
    PRIMARY KEY (agent, turn_id)
) WITHOUT ROWID;

-- Every source event a turn answers points at its record.
CREATE TABLE turn_sources (
    agent    TEXT NOT NULL,
    event_id TEXT NOT NULL,
    turn_id  TEXT NOT NULL,
    PRIMARY KEY (agent, event_id)
) WITHOUT ROWID;
CREATE INDEX turn_sources_by_turn ON turn_sources (agent, turn_id);

-- One row per delivery stage. Once attempted = 1 the payload, target and
-- transaction ID are frozen, so a retry after a crash is the identical send
-- and the homeserver deduplicates it.
CREATE TABLE delivery_outbox (
    id                INTEGER PRIMARY KEY,
    principal         INTEGER NOT NULL,
    delivery_id       TEXT    NOT NULL,
    stage             INTEGER NOT NULL,
    room_id           TEXT    NOT NULL,
    thread_id         TEXT    NOT NULL,
    txn_id            TEXT    NOT NULL,
    turn_id           TEXT    NOT NULL,
    event_type        TEXT    NOT NULL,
    payload_json      TEXT    NOT NULL,
    replaces_event_id TEXT    NOT NULL DEFAULT '',
    epoch             INTEGER NOT NULL,
    state             INTEGER NOT NULL,
    attempted         INTEGER NOT NULL DEFAULT 0,
    device_id         TEXT    NOT NULL DEFAULT '',
    attempts          INTEGER NOT NULL DEFAULT 0,
    event_id          TEXT    NOT NULL DEFAULT '',
    last_error        TEXT    NOT NULL DEFAULT '',
    created_ms        INTEGER NOT NULL,
    updated_ms        INTEGER NOT NULL,
    UNIQUE (principal, delivery_id, stage)
);
-- The recovery scan: unacknowledged rows, oldest first.
CREATE INDEX delivery_outbox_unacknowledged
    ON delivery_outbox (principal, created_ms, id) WHERE state IN (0, 1);
CREATE INDEX delivery_outbox_room ON delivery_outbox (principal, room_id, state);
