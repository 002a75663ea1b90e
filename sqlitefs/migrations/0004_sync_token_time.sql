-- v4: when each principal's sync token was stored.
--
-- Every completed sync stores its next_batch token, so the time it was
-- stored is the time of the principal's last completed sync: mindroomd
-- status shows its age, which tells a stalled sync loop (a homeserver
-- unreachable, a token refused) from an idle room. Written from the
-- transaction's clock in integer milliseconds; 0 means not known: no token
-- yet, or a token stored before this version, whose time was never kept.
ALTER TABLE principals ADD COLUMN sync_token_ms INTEGER NOT NULL DEFAULT 0;
