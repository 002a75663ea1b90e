-- v7: tool approvals.

-- One exact call an agent asked a person to decide, keyed by the agent's
-- call ID. The decision (state 1 approved, 2 denied, 3 expired, 4
-- withdrawn) is written once over state 0 and never changes; the row
-- stays, so a late vote on its card is still recognised as consumed.
-- card_delivery_id names the card's outbox delivery (its initial stage
-- the card, its final stage the card's one edit).
CREATE TABLE approvals (
    principal         INTEGER NOT NULL,
    call_id           TEXT    NOT NULL,
    event_id          TEXT    NOT NULL,
    room_id           TEXT    NOT NULL,
    thread_id         TEXT    NOT NULL,
    tool              TEXT    NOT NULL,
    arguments         TEXT    NOT NULL,
    secret            TEXT    NOT NULL,
    approvers         TEXT    NOT NULL,
    rendering         TEXT    NOT NULL,
    call_hash         TEXT    NOT NULL,
    card_delivery_id  TEXT    NOT NULL,
    expires_ms        INTEGER NOT NULL,
    epoch             INTEGER NOT NULL,
    created_ms        INTEGER NOT NULL,
    state             INTEGER NOT NULL DEFAULT 0,
    decided_by        TEXT    NOT NULL DEFAULT '',
    decision_event_id TEXT    NOT NULL DEFAULT '',
    decided_ms        INTEGER NOT NULL DEFAULT 0,
    reason            TEXT    NOT NULL DEFAULT '',
    -- decided_seq numbers the principal's decisions in the order they were
    -- written (0 while open): a reader's cursor over decisions.
    decided_seq       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (principal, call_id)
) WITHOUT ROWID;
CREATE INDEX approvals_due ON approvals (principal, expires_ms) WHERE state = 0;
CREATE INDEX approvals_event ON approvals (principal, event_id);
CREATE INDEX approvals_open_room ON approvals (principal, room_id) WHERE state = 0;
CREATE INDEX approvals_card ON approvals (principal, card_delivery_id);
CREATE INDEX approvals_decided ON approvals (principal, decided_seq) WHERE decided_seq > 0;

-- A vote names the card's event: the card's delivery is found by the
-- event the homeserver acknowledged it as.
CREATE INDEX delivery_outbox_cards ON delivery_outbox (principal, event_id) WHERE delivery_id LIKE 'approval:%';
