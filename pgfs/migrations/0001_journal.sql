-- The journal's schema on PostgreSQL, in one step: the same tables and
-- meanings as the SQLite journal at its current version. Text that orders
-- a cursor or is compared in byte order is COLLATE "C", as SQLite compares
-- bytes. A principal's rows are written under a lock on its principals
-- row, so a principal's positions commit in the order they were taken.

CREATE TABLE store_meta (
    key   text COLLATE "C" PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE principals (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent         text COLLATE "C" NOT NULL,
    user_id       text COLLATE "C" NOT NULL,
    sync_token    text   NOT NULL DEFAULT '',
    sync_token_ms bigint NOT NULL DEFAULT 0,
    -- Bumped by whichever replica takes the principal over; every write
    -- transaction reads it under the row lock.
    lease_generation bigint NOT NULL DEFAULT 0,
    UNIQUE (agent, user_id)
);

CREATE TABLE rooms (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    principal bigint  NOT NULL REFERENCES principals (id),
    room_id   text COLLATE "C" NOT NULL,
    epoch     bigint  NOT NULL DEFAULT 0,
    departed  boolean NOT NULL DEFAULT false,
    UNIQUE (principal, room_id)
);

CREATE TABLE journal_events (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    principal   bigint   NOT NULL REFERENCES principals (id),
    event_id    text COLLATE "C" NOT NULL,
    room_id     text COLLATE "C" NOT NULL,
    thread_id   text COLLATE "C" NOT NULL,
    target_id   text COLLATE "C" NOT NULL,
    kind        smallint NOT NULL,
    class       smallint NOT NULL,
    provenance  smallint NOT NULL,
    state       smallint NOT NULL,
    epoch       bigint   NOT NULL,
    received_ms bigint   NOT NULL,
    UNIQUE (principal, event_id)
);
CREATE INDEX journal_events_pending ON journal_events (principal, seq) WHERE state = 0;

-- Only pending rows keep their payload; settling deletes it in the same
-- statement, through the trigger below.
CREATE TABLE journal_payloads (
    seq     bigint PRIMARY KEY,
    payload text   NOT NULL
);

CREATE FUNCTION journal_events_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM journal_payloads WHERE seq = NEW.seq;
    RETURN NULL;
END
$$;
CREATE TRIGGER journal_events_settled AFTER UPDATE OF state ON journal_events
    FOR EACH ROW WHEN (NEW.state <> 0) EXECUTE FUNCTION journal_events_settled();

CREATE TABLE visible_messages (
    seq           bigint PRIMARY KEY,
    room          bigint NOT NULL REFERENCES rooms (id),
    thread_id     text COLLATE "C" NOT NULL,
    event_id      text COLLATE "C" NOT NULL,
    sender        text COLLATE "C" NOT NULL,
    created_ts    bigint NOT NULL,
    -- '' when the original itself is on screen.
    revision_id   text COLLATE "C" NOT NULL,
    revision_ts   bigint NOT NULL,
    content_json  text,
    refresh_token bigint,
    epoch         bigint NOT NULL
);
CREATE INDEX visible_messages_page ON visible_messages (room, thread_id, created_ts, event_id);

CREATE TABLE unresolved_edits (
    principal    bigint NOT NULL,
    room_id      text COLLATE "C" NOT NULL,
    target_id    text COLLATE "C" NOT NULL,
    sender       text COLLATE "C" NOT NULL,
    edit_id      text COLLATE "C" NOT NULL,
    edit_ts      bigint NOT NULL,
    content_json text,
    epoch        bigint NOT NULL,
    PRIMARY KEY (principal, room_id, target_id, sender)
);
CREATE INDEX unresolved_edits_by_edit ON unresolved_edits (principal, room_id, edit_id);

CREATE TABLE redaction_tombstones (
    principal     bigint NOT NULL,
    room_id       text COLLATE "C" NOT NULL,
    event_id      text COLLATE "C" NOT NULL,
    redaction_seq bigint NOT NULL,
    PRIMARY KEY (principal, room_id, event_id)
);

CREATE TABLE rejected_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    principal   bigint NOT NULL,
    room_id     text   NOT NULL,
    event_id    text   NOT NULL,
    fingerprint bytea  NOT NULL,
    reason      text   NOT NULL,
    raw         bytea  NOT NULL,
    received_ms bigint NOT NULL,
    UNIQUE (principal, fingerprint)
);

CREATE TABLE owed_departure_reports (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    principal bigint NOT NULL,
    room_id   text COLLATE "C" NOT NULL,
    owed_ms   bigint NOT NULL
);
CREATE INDEX owed_departure_reports_room ON owed_departure_reports (principal, room_id, id);

CREATE TABLE membership_observations (
    principal      bigint NOT NULL,
    observation_id text COLLATE "C" NOT NULL,
    room_id        text COLLATE "C" NOT NULL,
    PRIMARY KEY (principal, observation_id)
);

CREATE TABLE turn_records (
    agent       text COLLATE "C" NOT NULL,
    turn_id     text COLLATE "C" NOT NULL,
    room_id     text     NOT NULL,
    state       smallint NOT NULL,
    record_json text     NOT NULL,
    event_id    text     NOT NULL DEFAULT '',
    updated_ms  bigint   NOT NULL,
    PRIMARY KEY (agent, turn_id)
);

CREATE TABLE turn_sources (
    agent    text COLLATE "C" NOT NULL,
    event_id text COLLATE "C" NOT NULL,
    turn_id  text COLLATE "C" NOT NULL,
    PRIMARY KEY (agent, event_id)
);
CREATE INDEX turn_sources_by_turn ON turn_sources (agent, turn_id);

CREATE TABLE delivery_outbox (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    principal         bigint   NOT NULL,
    delivery_id       text COLLATE "C" NOT NULL,
    stage             smallint NOT NULL,
    room_id           text COLLATE "C" NOT NULL,
    thread_id         text COLLATE "C" NOT NULL,
    txn_id            text     NOT NULL,
    turn_id           text     NOT NULL,
    event_type        text     NOT NULL,
    payload_json      text     NOT NULL,
    replaces_event_id text     NOT NULL DEFAULT '',
    epoch             bigint   NOT NULL,
    state             smallint NOT NULL,
    attempted         boolean  NOT NULL DEFAULT false,
    device_id         text     NOT NULL DEFAULT '',
    attempts          integer  NOT NULL DEFAULT 0,
    event_id          text     NOT NULL DEFAULT '',
    last_error        text     NOT NULL DEFAULT '',
    created_ms        bigint   NOT NULL,
    updated_ms        bigint   NOT NULL,
    UNIQUE (principal, delivery_id, stage)
);
CREATE INDEX delivery_outbox_unacknowledged
    ON delivery_outbox (principal, created_ms, id) WHERE state IN (0, 1);
CREATE INDEX delivery_outbox_room ON delivery_outbox (principal, room_id, state);

CREATE TABLE hydration_coverage (
    principal  bigint NOT NULL,
    room_id    text COLLATE "C" NOT NULL,
    thread_id  text COLLATE "C" NOT NULL,
    epoch      bigint NOT NULL,
    covered_ms bigint NOT NULL,
    PRIMARY KEY (principal, room_id, thread_id)
);
