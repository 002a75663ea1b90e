-- v6: each agent's Matrix session in the database, so every replica
-- sharing the journal signs the agent in on the same device (whose olm
-- account is already here), whatever host it runs on.
CREATE TABLE matrix_sessions (
    agent        text COLLATE "C" PRIMARY KEY,
    user_id      text   NOT NULL,
    device_id    text   NOT NULL,
    access_token text   NOT NULL,
    updated_ms   bigint NOT NULL
);
