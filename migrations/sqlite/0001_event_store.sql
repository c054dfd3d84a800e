-- opledger event store, SQLite. Append-only history: this file is never edited once released;
-- changes come as new migrations.

-- One row: the end of the global order and of the hash chain. Every append updates it inside its
-- BEGIN IMMEDIATE transaction, so positions are gapless and in commit order.
CREATE TABLE ledger_head (
    ledger_id     INTEGER PRIMARY KEY CHECK (ledger_id = 1),
    last_position INTEGER NOT NULL CHECK (last_position >= 0),
    last_hash     BLOB    NOT NULL CHECK (length(last_hash) = 32),
    -- recorded_at of the last append, microseconds since the Unix epoch (UTC); later appends
    -- never record an earlier time.
    updated_at    INTEGER NOT NULL
);
INSERT INTO ledger_head (ledger_id, last_position, last_hash, updated_at)
VALUES (1, 0, zeroblob(32), 0);

-- One row per stream: its version is the optimistic-concurrency check.
CREATE TABLE streams (
    stream_id   TEXT    PRIMARY KEY,
    stream_type TEXT    NOT NULL,
    version     INTEGER NOT NULL CHECK (version >= 1),
    created_at  INTEGER NOT NULL
) WITHOUT ROWID;
-- A stream's category (`op`, `update`, `cb`, ...) is the prefix of its id, so the primary key
-- also serves listings by category; no second index.

CREATE TABLE events (
    position       INTEGER PRIMARY KEY CHECK (position >= 1),
    -- Always a row of `streams` (written in the same transaction); no foreign key, because
    -- streams rows can never be deleted or renamed (triggers below) and a key check per event
    -- costs about a tenth of an append (see docs/adr/0004).
    stream_id      TEXT    NOT NULL,
    version        INTEGER NOT NULL CHECK (version >= 1),
    -- UUIDv5 of (stream_id, version): unique because (stream_id, version) is, so it needs no
    -- index of its own (see docs/adr/0004); the verifier recomputes it.
    event_id       BLOB    NOT NULL CHECK (length(event_id) = 16),
    event_type     TEXT    NOT NULL,
    schema_version INTEGER NOT NULL,
    -- The exact JSON bytes that were appended and hashed.
    payload        BLOB    NOT NULL,
    metadata       BLOB    NOT NULL,
    -- Microseconds since the Unix epoch (UTC), from the database clock.
    recorded_at    INTEGER NOT NULL,
    prev_hash      BLOB    NOT NULL CHECK (length(prev_hash) = 32),
    hash           BLOB    NOT NULL CHECK (length(hash) = 32),
    UNIQUE (stream_id, version)
);

-- History is append-only, enforced by the database itself.
CREATE TRIGGER events_refuse_update BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'opledger events are append-only: UPDATE is refused');
END;
CREATE TRIGGER events_refuse_delete BEFORE DELETE ON events
BEGIN
    SELECT RAISE(ABORT, 'opledger events are append-only: DELETE is refused');
END;
-- A stream row is never deleted or renamed, and its version only grows, so every event keeps
-- its stream.
CREATE TRIGGER streams_refuse_delete BEFORE DELETE ON streams
BEGIN
    SELECT RAISE(ABORT, 'opledger streams rows are append-only: DELETE is refused');
END;
CREATE TRIGGER streams_forward_only BEFORE UPDATE ON streams
WHEN NEW.stream_id IS NOT OLD.stream_id OR NEW.version < OLD.version
BEGIN
    SELECT RAISE(ABORT, 'opledger streams keep their id and their version only grows');
END;
-- The head may only move forward.
CREATE TRIGGER ledger_head_forward_only BEFORE UPDATE ON ledger_head
WHEN NEW.last_position < OLD.last_position
BEGIN
    SELECT RAISE(ABORT, 'opledger ledger head may only move forward');
END;
CREATE TRIGGER ledger_head_refuse_delete BEFORE DELETE ON ledger_head
BEGIN
    SELECT RAISE(ABORT, 'opledger ledger head cannot be deleted');
END;
-- The head always names the last event and its hash: an append that would move it anywhere else
-- fails as a whole.
CREATE TRIGGER ledger_head_matches_events BEFORE UPDATE ON ledger_head
WHEN NEW.last_position != (SELECT max(position) FROM events)
  OR NEW.last_hash IS NOT (SELECT hash FROM events WHERE position = NEW.last_position)
BEGIN
    SELECT RAISE(ABORT, 'opledger ledger head must name the last event and its hash');
END;
