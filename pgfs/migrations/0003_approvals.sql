-- v3: tool approvals, as in the SQLite journal's v7.

-- One exact call an agent asked a person to decide, keyed by the agent's
-- call ID. The decision (state 1 approved, 2 denied, 3 expired, 4
-- withdrawn) is written once over state 0 and never changes; the row
-- stays, so a late vote on its card is still recognised as consumed.
CREATE TABLE approvals (
    principal         bigint   NOT NULL,
    call_id           text COLLATE "C" NOT NULL,
    event_id          text COLLATE "C" NOT NULL,
    room_id           text COLLATE "C" NOT NULL,
    thread_id         text COLLATE "C" NOT NULL,
    tool              text     NOT NULL,
    arguments         text     NOT NULL,
    secret            text     NOT NULL,
    approvers         text     NOT NULL,
    rendering         text     NOT NULL,
    call_hash         text     NOT NULL,
    card_delivery_id  text COLLATE "C" NOT NULL,
    expires_ms        bigint   NOT NULL,
    epoch             bigint   NOT NULL,
    created_ms        bigint   NOT NULL,
    state             smallint NOT NULL DEFAULT 0,
    decided_by        text     NOT NULL DEFAULT '',
    decision_event_id text     NOT NULL DEFAULT '',
    decided_ms        bigint   NOT NULL DEFAULT 0,
    reason            text     NOT NULL DEFAULT '',
    -- decided_seq numbers the principal's decisions in the order they were
    -- written (0 while open): a reader's cursor over decisions. The
    -- principal's row lock serializes its writes, so max + 1 is unique.
    decided_seq       bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (principal, call_id)
);
CREATE INDEX approvals_due ON approvals (principal, expires_ms) WHERE state = 0;
CREATE INDEX approvals_event ON approvals (principal, event_id);
CREATE INDEX approvals_open_room ON approvals (principal, room_id) WHERE state = 0;
CREATE INDEX approvals_card ON approvals (principal, card_delivery_id);
CREATE INDEX approvals_decided ON approvals (principal, decided_seq) WHERE decided_seq > 0;

CREATE INDEX delivery_outbox_cards ON delivery_outbox (principal, event_id) WHERE delivery_id LIKE 'approval:%';
