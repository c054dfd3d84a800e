-- user_operations (SQLite): one row per operation with what `/status` shows its user (state,
-- external id, last error), read per (bot, user) and per (bot, chat), most recent first.
-- Disposable: rebuilt from the ledger at will. Times are microseconds since the Unix epoch (UTC).
CREATE TABLE IF NOT EXISTS "{table}" (
    stream_id     TEXT    PRIMARY KEY,
    operation_id  TEXT    NOT NULL,
    bot           TEXT    NOT NULL,
    user_id       INTEGER,
    chat_id       INTEGER,
    action        TEXT    NOT NULL,
    business_key  TEXT    NOT NULL,
    -- The domain's status name (received, claimed, call_sent, retry_scheduled,
    -- needs_reconciliation, confirmed, failed, reconciled).
    status        TEXT    NOT NULL,
    -- For reconciled operations: what the person decided (succeeded or failed).
    resolution    TEXT,
    attempts      INTEGER NOT NULL,
    external_id   TEXT,
    last_error    TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    last_position INTEGER NOT NULL
) WITHOUT ROWID;
-- indexes
-- No index by operation id: one operation is found through the inline operation_status (its
-- stream id), since an operation id is random and an index of it would dirty a page of its
-- own for every operation.
CREATE INDEX IF NOT EXISTS "{index}_by_user" ON "{table}" (bot, user_id, updated_at);
CREATE INDEX IF NOT EXISTS "{index}_by_chat" ON "{table}" (bot, chat_id, updated_at);
