-- operation_status (PostgreSQL): one row per operation, updated inline with every append to its
-- stream. Disposable: it can be dropped and rebuilt from the ledger (`opledger projections
-- rebuild operation_status`). `{table}` and `{index}` are filled in per version (see
-- crates/opledger-projections/src/projection.rs).
CREATE TABLE "{table}" (
    operation_id  text COLLATE "C" PRIMARY KEY,
    stream_id     text COLLATE "C" NOT NULL UNIQUE,
    action        text        NOT NULL,
    business_key  text        NOT NULL,
    bot           text        NOT NULL,
    chat_id       bigint,
    user_id       bigint,
    status        text        NOT NULL,
    attempts      integer     NOT NULL,
    worker        text,
    lease_until   timestamptz,
    -- When a worker should look at the operation next; NULL once nothing is left to do.
    due_at        timestamptz,
    external_id   text,
    last_error    text,
    reply         text        NOT NULL,
    key_conflicts integer     NOT NULL,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    version       bigint      NOT NULL,
    last_position bigint      NOT NULL
);

-- indexes
CREATE INDEX "{index}_due" ON "{table}" (due_at)
    WHERE due_at IS NOT NULL;
-- The same queue without the terminal operations waiting only for their reply, for workers that
-- send no replies (its predicate is repeated verbatim in the worker's query).
CREATE INDEX "{index}_work_due" ON "{table}" (due_at)
    WHERE due_at IS NOT NULL AND status NOT IN ('confirmed', 'failed', 'reconciled');
CREATE INDEX "{index}_by_user" ON "{table}" (bot, user_id, updated_at);
