-- v6: encrypted events awaiting their keys.

-- journal_events.state gains two values: 2, an encrypted event journaled
-- before its megolm key came (never work while it waits), and 3, one whose
-- key never came in time, settled as undecryptable.

-- The ciphertext of an event awaiting its key, kept until the key comes,
-- a fence voids it or it is settled as undecryptable. seq is its journal
-- row; session_id is the megolm session it waits on.
CREATE TABLE awaiting_keys (
    seq         INTEGER PRIMARY KEY,
    principal   INTEGER NOT NULL,
    room_id     TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    event       TEXT    NOT NULL,
    received_ms INTEGER NOT NULL
);
CREATE INDEX awaiting_keys_session ON awaiting_keys (principal, room_id, session_id);
CREATE INDEX awaiting_keys_age ON awaiting_keys (principal, received_ms);

-- Undecryptable events are counted for status without a scan.
CREATE INDEX journal_events_undecryptable ON journal_events (principal) WHERE state = 3;
