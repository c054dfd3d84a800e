-- user_operations (PostgreSQL): one row per operation with what `/status` shows its user (state,
-- external id, last error), read per (bot, user) and per (bot, chat), most recent first.
-- Disposable: rebuilt from the ledger at will.
CREATE TABLE IF NOT EXISTS "{table}" (
    stream_id     text COLLATE "C" NOT NULL,
    operation_id  text COLLATE "C" NOT NULL,
    bot           text        NOT NULL,
    user_id       bigint,
    chat_id       bigint,
    action        text        NOT NULL,
    business_key  text        NOT NULL,
    -- The domain's status name (received, claimed, call_sent, retry_scheduled,
    -- needs_reconciliation, confirmed, failed, reconciled).
    status        text        NOT NULL,
    -- For reconciled operations: what the person decided (succeeded or failed).
    resolution    text,
    attempts      integer     NOT NULL,
    external_id   text,
    last_error    text,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    last_position bigint      NOT NULL,
    CONSTRAINT "{index}_pkey" PRIMARY KEY (stream_id)
);
-- indexes
-- No index by operation id: one operation is found through the inline operation_status (its
-- stream id), since an operation id is random and an index of it would dirty a page of its
-- own for every operation.
CREATE INDEX IF NOT EXISTS "{index}_by_user" ON "{table}" (bot, user_id, updated_at);
CREATE INDEX IF NOT EXISTS "{index}_by_chat" ON "{table}" (bot, chat_id, updated_at);
