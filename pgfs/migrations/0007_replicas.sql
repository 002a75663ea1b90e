-- v7: replicas. Each daemon sharing the journal beats in replicas (by the
-- database's clock, so hosts whose clocks differ still agree on who is
-- alive) and advertises where its agent API answers; each principal names
-- the replica holding its lease, and since when, for status and for
-- forwarding an agent's API requests to its owner.
CREATE TABLE replicas (
    id           text COLLATE "C" PRIMARY KEY,
    api_url      text   NOT NULL,
    started_ms   bigint NOT NULL,
    heartbeat_ms bigint NOT NULL
);

ALTER TABLE principals
    ADD COLUMN lease_holder   text COLLATE "C" NOT NULL DEFAULT '',
    ADD COLUMN lease_since_ms bigint NOT NULL DEFAULT 0;
