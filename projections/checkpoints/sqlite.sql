-- projection_checkpoints (SQLite): the projection registry. One row per version of each read
-- model: the active one (its tables carry the projection's name), at most one being built (its
-- tables are `name@vN`), and retired ones (their tables are gone), kept as history.
--
-- `position` is the last ledger position applied to that version's tables, advanced by a
-- compare-and-set in the same transaction as the page it applies; for an inline projection the
-- store keeps the active version at the head, and the row keeps the position it was registered
-- or flipped at. `runner` names the process that last advanced it. Times are microseconds since
-- the Unix epoch (UTC), like the ledger's.
CREATE TABLE IF NOT EXISTS projection_checkpoints (
    name            TEXT    NOT NULL,
    version         INTEGER NOT NULL CHECK (version >= 1),
    state           TEXT    NOT NULL CHECK (state IN ('building', 'active', 'retired')),
    inline          INTEGER NOT NULL CHECK (inline IN (0, 1)),
    definition_hash TEXT    NOT NULL,
    position        INTEGER NOT NULL CHECK (position >= 0),
    runner          TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (name, version)
);
-- One live version, and one rebuild at a time, per projection.
CREATE UNIQUE INDEX IF NOT EXISTS projection_checkpoints_one_active
    ON projection_checkpoints (name) WHERE state = 'active';
CREATE UNIQUE INDEX IF NOT EXISTS projection_checkpoints_one_building
    ON projection_checkpoints (name) WHERE state = 'building';
