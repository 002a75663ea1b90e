-- v9: retention.

-- pruned_before is the origin time of the newest message retention
-- removed from the room's conversation (0: none), so a page that reaches
-- the oldest message kept says what is missing before it.
ALTER TABLE rooms ADD COLUMN pruned_before INTEGER NOT NULL DEFAULT 0;

-- What retention pruned for each principal so far, and the newest cutoff
-- identities were pruned at: an event received before it may have been
-- journaled and forgotten, so a gap fill stops there.
CREATE TABLE retention_totals (
    principal            INTEGER PRIMARY KEY,
    passes               INTEGER NOT NULL DEFAULT 0,
    last_pass_ms         INTEGER NOT NULL DEFAULT 0,
    bodies               INTEGER NOT NULL DEFAULT 0,
    edits                INTEGER NOT NULL DEFAULT 0,
    payloads             INTEGER NOT NULL DEFAULT 0,
    turns                INTEGER NOT NULL DEFAULT 0,
    rejected             INTEGER NOT NULL DEFAULT 0,
    identities           INTEGER NOT NULL DEFAULT 0,
    deliveries           INTEGER NOT NULL DEFAULT 0,
    approvals            INTEGER NOT NULL DEFAULT 0,
    bytes                INTEGER NOT NULL DEFAULT 0,
    identities_before_ms INTEGER NOT NULL DEFAULT 0
);
