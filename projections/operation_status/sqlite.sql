-- operation_status (SQLite): one row per operation, updated inline with every append to its
-- stream. Disposable: it can be dropped and rebuilt from the ledger (`opledger projections
-- rebuild operation_status`). `{table}` and `{index}` are filled in per version (see
-- crates/opledger-projections/src/projection.rs). Times are microseconds since
-- the Unix epoch (UTC), like the ledger's.
CREATE TABLE "{table}" (
    operation_id  TEXT    NOT NULL UNIQUE,
    stream_id     TEXT    NOT NULL UNIQUE,
    action        TEXT    NOT NULL,
    business_key  TEXT    NOT NULL,
    bot           TEXT    NOT NULL,
    chat_id       INTEGER,
    user_id       INTEGER,
    status        TEXT    NOT NULL,
    attempts      INTEGER NOT NULL,
    worker        TEXT,
    lease_until   INTEGER,
    -- When a worker should look at the operation next; NULL once nothing is left to do.
    due_at        INTEGER,
    external_id   TEXT,
    last_error    TEXT,
    reply         TEXT    NOT NULL,
    key_conflicts INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    version       INTEGER NOT NULL,
    last_position INTEGER NOT NULL
);

-- indexes
CREATE INDEX "{index}_due" ON "{table}" (due_at)
    WHERE due_at IS NOT NULL;
-- The same queue without the terminal operations waiting only for their reply, for workers that
-- send no replies (its predicate is repeated verbatim in the worker's query).
CREATE INDEX "{index}_work_due" ON "{table}" (due_at)
    WHERE due_at IS NOT NULL AND status NOT IN ('confirmed', 'failed', 'reconciled');
CREATE INDEX "{index}_by_user" ON "{table}" (bot, user_id, updated_at);
