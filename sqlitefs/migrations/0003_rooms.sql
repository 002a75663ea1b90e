-- v3: a narrower hot path. Every admitted message used to store its room ID
-- three times and its event ID five; each copy is bytes on disk and bytes in
-- the WAL of every commit.

-- A room as one principal sees it, interned to a small integer that also
-- carries the membership epoch (formerly room_memberships). Visible rows and
-- their page index are keyed by it, so the principal and the room ID are no
-- longer repeated in every row and every index entry.
CREATE TABLE rooms (
    id        INTEGER PRIMARY KEY,
    principal INTEGER NOT NULL REFERENCES principals (id),
    room_id   TEXT    NOT NULL,
    epoch     INTEGER NOT NULL DEFAULT 0,
    departed  INTEGER NOT NULL DEFAULT 0,
    UNIQUE (principal, room_id)
);
INSERT INTO rooms (principal, room_id, epoch, departed)
    SELECT principal, room_id, epoch, departed FROM room_memberships;
INSERT INTO rooms (principal, room_id)
    SELECT DISTINCT principal, room_id FROM visible_messages WHERE true
    ON CONFLICT (principal, room_id) DO NOTHING;
DROP TABLE room_memberships;

-- The canonical payload of a pending event, in its own table: settling
-- deletes the row and frees its page for reuse. Shrinking the payload in
-- place left every journal page mostly empty for good (SQLite rebalances a
-- page after a delete, never after an update that shrinks a row).
CREATE TABLE journal_payloads (
    seq     INTEGER PRIMARY KEY,
    payload TEXT    NOT NULL
);
INSERT INTO journal_payloads (seq, payload)
    SELECT seq, payload FROM journal_events WHERE state = 0;
-- Rebuilt rather than altered: dropping the column in place would keep the
-- pages that settled payloads had already emptied.
CREATE TABLE journal_events_v3 (
    seq         INTEGER PRIMARY KEY,
    principal   INTEGER NOT NULL REFERENCES principals (id),
    id_hash     INTEGER NOT NULL,
    event_id    TEXT    NOT NULL,
    room_id     TEXT    NOT NULL,
    thread_id   TEXT    NOT NULL,
    target_id   TEXT    NOT NULL,
    kind        INTEGER NOT NULL,
    class       INTEGER NOT NULL,
    provenance  INTEGER NOT NULL,
    state       INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,
    received_ms INTEGER NOT NULL
);
INSERT INTO journal_events_v3
    (seq, principal, id_hash, event_id, room_id, thread_id, target_id, kind, class, provenance, state, epoch, received_ms)
    SELECT seq, principal, mindroomd_id_hash(event_id), event_id, room_id, thread_id, target_id, kind, class,
           provenance, state, epoch, received_ms
    FROM journal_events ORDER BY seq;
DROP TABLE journal_events;
ALTER TABLE journal_events_v3 RENAME TO journal_events;
-- The identity index keys a 64-bit hash of the event ID (IDHash): a third
-- of the bytes per entry, so a third of the page splits on random inserts.
-- Admission keeps an event unique per principal by comparing the ID itself.
CREATE INDEX journal_events_identity ON journal_events (principal, id_hash);
CREATE INDEX journal_events_pending ON journal_events (principal, seq) WHERE state = 0;

-- Whatever settles an event (an answer, a redaction, a fence) drops its
-- payload in the same statement.
CREATE TRIGGER journal_events_settled AFTER UPDATE OF state ON journal_events
    WHEN new.state <> 0
BEGIN
    DELETE FROM journal_payloads WHERE seq = new.seq;
END;

-- revision_id is '' while the original itself is the revision on screen,
-- which is most messages: the event ID is not stored a second time. Rows
-- append in journal order and carry no index of their own.
CREATE TABLE visible_messages_v3 (
    seq           INTEGER PRIMARY KEY,
    room          INTEGER NOT NULL,
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
INSERT INTO visible_messages_v3
    (seq, room, thread_id, event_id, sender, created_ts, revision_id, revision_ts, content_json, refresh_token, epoch)
    SELECT v.seq, r.id, v.thread_id, v.event_id, v.sender, v.created_ts,
           CASE WHEN v.revision_id = v.event_id THEN '' ELSE v.revision_id END,
           v.revision_ts, v.content_json, v.refresh_token, v.epoch
    FROM visible_messages v JOIN rooms r ON r.principal = v.principal AND r.room_id = v.room_id
    ORDER BY v.seq;
DROP TABLE visible_messages;
ALTER TABLE visible_messages_v3 RENAME TO visible_messages;

-- The page index, in conversation order. Admission does not write it row by
-- row: every conversation's newest leaf would be rewritten by almost every
-- commit. Visible rows newer than visible_page_merged.upto are the unmerged
-- tail; a merge moves them into the index in key order, many entries per
-- leaf, and readers read the index and the (bounded) tail together.
CREATE TABLE visible_page (
    room       INTEGER NOT NULL,
    thread_id  TEXT    NOT NULL,
    created_ts INTEGER NOT NULL,
    event_id   TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    PRIMARY KEY (room, thread_id, created_ts, event_id)
) WITHOUT ROWID;
CREATE TABLE visible_page_merged (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    upto INTEGER NOT NULL
);
INSERT INTO visible_page (room, thread_id, created_ts, event_id, seq)
    SELECT room, thread_id, created_ts, event_id, seq FROM visible_messages
    ORDER BY room, thread_id, created_ts, event_id;
INSERT INTO visible_page_merged (id, upto) SELECT 1, coalesce(max(seq), 0) FROM visible_messages;

-- A visible row that goes (a redaction, a fence) takes its index entry
-- with it, whether or not it was merged yet.
CREATE TRIGGER visible_messages_deleted AFTER DELETE ON visible_messages
BEGIN
    DELETE FROM visible_page
    WHERE room = old.room AND thread_id = old.thread_id
      AND created_ts = old.created_ts AND event_id = old.event_id;
END;
