-- opledger event store, PostgreSQL. Append-only history: this file is never edited once
-- released; changes come as new migrations. Same tables and meaning as migrations/sqlite.
-- Text keys use the "C" collation, so their order is byte order on both backends (and in Rust,
-- which sorts streams before locking them).

-- One row: the end of the global order and of the hash chain. Every append locks it (after the
-- existing streams it touches, in sorted order) by advancing it, so positions are gapless and in
-- commit order: a transaction that commits late cannot publish a lower position than one
-- already seen.
CREATE TABLE ledger_head (
    ledger_id     smallint    PRIMARY KEY CHECK (ledger_id = 1),
    last_position bigint      NOT NULL CHECK (last_position >= 0),
    last_hash     bytea       NOT NULL CHECK (length(last_hash) = 32),
    -- recorded_at of the last append; later appends never record an earlier time.
    updated_at    timestamptz NOT NULL
);
INSERT INTO ledger_head (ledger_id, last_position, last_hash, updated_at)
VALUES (1, 0, '\x0000000000000000000000000000000000000000000000000000000000000000', 'epoch');

-- One row per stream: its version is the optimistic-concurrency check. A stream's category is
-- the prefix of its id, so the primary key also serves listings by category.
CREATE TABLE streams (
    stream_id   text COLLATE "C" PRIMARY KEY,
    stream_type text        NOT NULL,
    version     bigint      NOT NULL CHECK (version >= 1),
    created_at  timestamptz NOT NULL
);

CREATE TABLE events (
    position       bigint      PRIMARY KEY CHECK (position >= 1),
    -- Always a row of `streams` (written in the same transaction); no foreign key, because
    -- streams rows can never be deleted or renamed (triggers below) and a key check per event
    -- costs a quarter of an append (see docs/adr/0004).
    stream_id      text COLLATE "C" NOT NULL,
    version        bigint      NOT NULL CHECK (version >= 1),
    -- UUIDv5 of (stream_id, version): unique because (stream_id, version) is, so it needs no
    -- index of its own (see docs/adr/0004); the verifier recomputes it.
    event_id       uuid        NOT NULL,
    event_type     text        NOT NULL,
    schema_version integer     NOT NULL,
    -- The exact JSON bytes that were appended and hashed (bytea, not jsonb, which re-orders keys).
    payload        bytea       NOT NULL,
    metadata       bytea       NOT NULL,
    -- From the database clock (microsecond resolution).
    recorded_at    timestamptz NOT NULL,
    prev_hash      bytea       NOT NULL CHECK (length(prev_hash) = 32),
    hash           bytea       NOT NULL CHECK (length(hash) = 32),
    UNIQUE (stream_id, version)
);

-- History is append-only, enforced by the database itself.
CREATE FUNCTION opledger_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'opledger % rows are append-only: % is refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END
$$;
CREATE TRIGGER events_refuse_update_delete BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION opledger_refuse_change();
CREATE TRIGGER events_refuse_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION opledger_refuse_change();
CREATE TRIGGER ledger_head_refuse_delete BEFORE DELETE ON ledger_head
    FOR EACH ROW EXECUTE FUNCTION opledger_refuse_change();
CREATE TRIGGER ledger_head_refuse_truncate BEFORE TRUNCATE ON ledger_head
    FOR EACH STATEMENT EXECUTE FUNCTION opledger_refuse_change();

-- A stream row is never deleted or renamed, and its version only grows, so every event keeps
-- its stream.
CREATE TRIGGER streams_refuse_delete BEFORE DELETE ON streams
    FOR EACH ROW EXECUTE FUNCTION opledger_refuse_change();
CREATE TRIGGER streams_refuse_truncate BEFORE TRUNCATE ON streams
    FOR EACH STATEMENT EXECUTE FUNCTION opledger_refuse_change();
CREATE FUNCTION opledger_stream_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'opledger streams keep their id and their version only grows'
        USING ERRCODE = 'integrity_constraint_violation';
END
$$;
CREATE TRIGGER streams_forward_only BEFORE UPDATE ON streams
    FOR EACH ROW
    WHEN (NEW.stream_id IS DISTINCT FROM OLD.stream_id OR NEW.version < OLD.version)
    EXECUTE FUNCTION opledger_stream_forward_only();

-- The head only moves forward, and at commit it names the last event and its hash: an append
-- that would leave it anywhere else fails as a whole.
CREATE FUNCTION opledger_head_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.last_position < OLD.last_position THEN
        RAISE EXCEPTION 'opledger ledger head may only move forward'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER ledger_head_forward_only BEFORE UPDATE ON ledger_head
    FOR EACH ROW EXECUTE FUNCTION opledger_head_forward_only();

CREATE FUNCTION opledger_head_matches_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    head ledger_head%ROWTYPE;
BEGIN
    SELECT * INTO head FROM ledger_head WHERE ledger_id = 1;
    IF head.last_position <> COALESCE((SELECT max(position) FROM events), 0)
       OR (head.last_position > 0 AND head.last_hash IS DISTINCT FROM
           (SELECT hash FROM events WHERE position = head.last_position)) THEN
        RAISE EXCEPTION 'opledger ledger head must name the last event and its hash'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER ledger_head_matches_events AFTER UPDATE ON ledger_head
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION opledger_head_matches_events();
