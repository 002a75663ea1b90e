-- v2: encrypted events awaiting their keys, as in the SQLite journal's v6.

-- journal_events.state gains two values: 2, an encrypted event journaled
-- before its megolm key came (never work while it waits), and 3, one whose
-- key never came in time, settled as undecryptable.

-- The ciphertext of an event awaiting its key, kept until the key comes,
-- a fence voids it or it is settled as undecryptable.
CREATE TABLE awaiting_keys (
    seq         bigint PRIMARY KEY,
    principal   bigint NOT NULL,
    room_id     text COLLATE "C" NOT NULL,
    session_id  text COLLATE "C" NOT NULL,
    event       text   NOT NULL,
    received_ms bigint NOT NULL
);
CREATE INDEX awaiting_keys_session ON awaiting_keys (principal, room_id, session_id, seq);
CREATE INDEX awaiting_keys_age ON awaiting_keys (principal, received_ms);

CREATE INDEX journal_events_undecryptable ON journal_events (principal) WHERE state = 3;
