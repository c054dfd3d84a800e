-- projection_checkpoints (PostgreSQL): the projection registry. One row per version of each read
-- model: the active one (its tables carry the projection's name), at most one being built (its
-- tables are `name@vN`), and retired ones (their tables are gone), kept as history.
--
-- `position` is the last ledger position applied to that version's tables, advanced by a
-- compare-and-set in the same transaction as the page it applies; for an inline projection the
-- store keeps the active version at the head, and the row keeps the position it was registered
-- or flipped at. `runner` names the process that last advanced it.
CREATE TABLE IF NOT EXISTS projection_checkpoints (
    name            text COLLATE "C" NOT NULL,
    version         integer     NOT NULL CHECK (version >= 1),
    state           text        NOT NULL CHECK (state IN ('building', 'active', 'retired')),
    inline          boolean     NOT NULL,
    definition_hash text        NOT NULL,
    position        bigint      NOT NULL CHECK (position >= 0),
    runner          text,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    PRIMARY KEY (name, version)
);
-- One live version, and one rebuild at a time, per projection.
CREATE UNIQUE INDEX IF NOT EXISTS projection_checkpoints_one_active
    ON projection_checkpoints (name) WHERE state = 'active';
CREATE UNIQUE INDEX IF NOT EXISTS projection_checkpoints_one_building
    ON projection_checkpoints (name) WHERE state = 'building';
