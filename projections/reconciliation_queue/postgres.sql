-- reconciliation_queue (PostgreSQL): the operations waiting for a person (marked for
-- reconciliation and not resolved yet), with why, the claims used and when they were marked;
-- their age is computed when read. Disposable: rebuilt from the ledger at will.
CREATE TABLE IF NOT EXISTS "{table}" (
    stream_id     text COLLATE "C" NOT NULL,
    operation_id  text COLLATE "C" NOT NULL,
    action        text        NOT NULL,
    business_key  text        NOT NULL,
    bot           text        NOT NULL,
    chat_id       bigint,
    user_id       bigint,
    reason        text        NOT NULL,
    attempts      integer     NOT NULL,
    marked_at     timestamptz NOT NULL,
    -- The position of the MarkedForReconciliation event.
    position      bigint      NOT NULL,
    CONSTRAINT "{index}_pkey" PRIMARY KEY (stream_id)
);
-- What every operation's Received said (action, key, bot, chat, user), so that an operation
-- marked long after it started can be listed with them.
CREATE TABLE IF NOT EXISTS "{table}_ops" (
    stream_id     text COLLATE "C" NOT NULL,
    operation_id  text COLLATE "C" NOT NULL,
    action        text        NOT NULL,
    business_key  text        NOT NULL,
    bot           text        NOT NULL,
    chat_id       bigint,
    user_id       bigint,
    CONSTRAINT "{index}_ops_pkey" PRIMARY KEY (stream_id)
);
-- indexes
CREATE INDEX IF NOT EXISTS "{index}_by_age" ON "{table}" (marked_at, operation_id);
