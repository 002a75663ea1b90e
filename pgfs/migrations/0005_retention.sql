-- v5: retention, as in the SQLite journal's v9.

-- pruned_before is the origin time of the newest message retention
-- removed from the room's conversation (0: none), so a page that reaches
-- the oldest message kept says what is missing before it.
ALTER TABLE rooms ADD COLUMN pruned_before bigint NOT NULL DEFAULT 0;

-- What retention pruned for each principal so far, and the newest cutoff
-- identities were pruned at: an event received before it may have been
-- journaled and forgotten, so a gap fill stops there.
CREATE TABLE retention_totals (
    principal            bigint PRIMARY KEY,
    passes               bigint NOT NULL DEFAULT 0,
    last_pass_ms         bigint NOT NULL DEFAULT 0,
    bodies               bigint NOT NULL DEFAULT 0,
    edits                bigint NOT NULL DEFAULT 0,
    payloads             bigint NOT NULL DEFAULT 0,
    turns                bigint NOT NULL DEFAULT 0,
    rejected             bigint NOT NULL DEFAULT 0,
    identities           bigint NOT NULL DEFAULT 0,
    deliveries           bigint NOT NULL DEFAULT 0,
    approvals            bigint NOT NULL DEFAULT 0,
    bytes                bigint NOT NULL DEFAULT 0,
    identities_before_ms bigint NOT NULL DEFAULT 0
);
