-- v5: hydration coverage.

-- A conversation (a room, or one thread of it: thread_id is its root, ''
-- for the room) whose history was fetched from the server up to its window,
-- under the membership epoch it was fetched in. A read finds a
-- conversation cold while no marker of the current epoch covers it; the
-- fence deletes a departed room's markers with everything else the ended
-- membership derived, so a rejoin hydrates again.
CREATE TABLE hydration_coverage (
    principal  INTEGER NOT NULL,
    room_id    TEXT    NOT NULL,
    thread_id  TEXT    NOT NULL,
    epoch      INTEGER NOT NULL,
    covered_ms INTEGER NOT NULL,
    PRIMARY KEY (principal, room_id, thread_id)
) WITHOUT ROWID;
