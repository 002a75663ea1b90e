-- v1: the journal, the visible-message projection, held edits, redaction
-- tombstones, room membership epochs and the quarantine of rejected events.

CREATE TABLE store_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

-- A principal is interned to a small integer so every index keyed by it
-- stays narrow.
CREATE TABLE principals (
    id         INTEGER PRIMARY KEY,
    agent      TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    sync_token TEXT NOT NULL DEFAULT '',
    UNIQUE (agent, user_id)
);

-- One row per admitted event, kept forever as the proof the event had its
-- turn. seq is the durable receipt order. payload holds the canonical event
-- only while state = 0 (pending); settlement clears it.
CREATE TABLE journal_events (
    seq         INTEGER PRIMARY KEY,
    principal   INTEGER NOT NULL REFERENCES principals (id),
    event_id    TEXT    NOT NULL,
    room_id     TEXT    NOT NULL,
    thread_id   TEXT    NOT NULL,
    target_id   TEXT    NOT NULL,
    kind        INTEGER NOT NULL,
    class       INTEGER NOT NULL,
    provenance  INTEGER NOT NULL,
    state       INTEGER NOT NULL,
    payload     TEXT    NOT NULL,
    epoch       INTEGER NOT NULL,
    received_ms INTEGER NOT NULL
);
CREATE UNIQUE INDEX journal_events_identity ON journal_events (principal, event_id);
CREATE INDEX journal_events_pending ON journal_events (principal, seq) WHERE state = 0;

-- One row per logical message, keyed by the journal seq of its original so
-- rows append in receipt order. content_json is NULL while the row owes a
-- refetch (refresh_token set): a redacted revision or a sidecar preview.
CREATE TABLE visible_messages (
    seq           INTEGER PRIMARY KEY,
    principal     INTEGER NOT NULL,
    room_id       TEXT    NOT NULL,
    thread_id     TEXT    NOT NULL,
    event_id      TEXT    NOT NULL,
    sender        TEXT    NOT NULL,
    created_ts    INTEGER NOT NULL,
    revision_id   TEXT    NOT NULL,
    revision_ts   INTEGER NOT NULL,
    content_json  TEXT,
    refresh_token INTEGER,
    epoch         INTEGER NOT NULL
);
CREATE INDEX visible_messages_page
    ON visible_messages (principal, room_id, thread_id, created_ts, event_id);

-- An edit whose target has not arrived, one latest per (target, sender) so a
-- stranger cannot evict the author's edit.
CREATE TABLE unresolved_edits (
    principal    INTEGER NOT NULL,
    room_id      TEXT    NOT NULL,
    target_id    TEXT    NOT NULL,
    sender       TEXT    NOT NULL,
    edit_id      TEXT    NOT NULL,
    edit_ts      INTEGER NOT NULL,
    content_json TEXT,
    epoch        INTEGER NOT NULL,
    PRIMARY KEY (principal, room_id, target_id, sender)
) WITHOUT ROWID;
CREATE INDEX unresolved_edits_by_edit ON unresolved_edits (principal, room_id, edit_id);

-- Written before a redaction projects anything, keyed by the room the
-- redaction arrived in, so nothing redacted can come back later.
CREATE TABLE redaction_tombstones (
    principal     INTEGER NOT NULL,
    room_id       TEXT    NOT NULL,
    event_id      TEXT    NOT NULL,
    redaction_seq INTEGER NOT NULL,
    PRIMARY KEY (principal, room_id, event_id)
) WITHOUT ROWID;

-- The membership epoch every projected and delivered row is written under.
CREATE TABLE room_memberships (
    principal INTEGER NOT NULL,
    room_id   TEXT    NOT NULL,
    epoch     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (principal, room_id)
) WITHOUT ROWID;

-- Malformed events, kept (truncated) for inspection so bad input loses
-- nothing and blocks nothing.
CREATE TABLE rejected_events (
    id          INTEGER PRIMARY KEY,
    principal   INTEGER NOT NULL,
    room_id     TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    fingerprint BLOB    NOT NULL,
    reason      TEXT    NOT NULL,
    raw         BLOB    NOT NULL,
    received_ms INTEGER NOT NULL,
    UNIQUE (principal, fingerprint)
);
