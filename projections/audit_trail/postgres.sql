-- audit_trail (PostgreSQL): one row per event of the ledger, with who or what caused it and the
-- operation, bot, user and chat it concerns. Disposable: rebuilt from the ledger at will.
CREATE TABLE IF NOT EXISTS "{table}" (
    position     bigint      NOT NULL,
    recorded_at  timestamptz NOT NULL,
    stream_id    text COLLATE "C" NOT NULL,
    version      bigint      NOT NULL,
    event_type   text        NOT NULL,
    operation_id text COLLATE "C",
    bot          text,
    user_id      bigint,
    chat_id      bigint,
    -- update, worker, operator, system, or unknown (metadata that is not opledger's).
    actor_kind   text        NOT NULL,
    -- The update id, the worker's id, the operator's name or the component's name.
    actor_id     text,
    correlation  text,
    summary      text        NOT NULL,
    CONSTRAINT "{index}_pkey" PRIMARY KEY (position)
);
-- What a stream's first event said about it (operation, bot, user, chat), for its later events
-- and for the events an update of it caused.
CREATE TABLE IF NOT EXISTS "{table}_streams" (
    stream_id    text COLLATE "C" NOT NULL,
    operation_id text COLLATE "C",
    bot          text,
    user_id      bigint,
    chat_id      bigint,
    CONSTRAINT "{index}_streams_pkey" PRIMARY KEY (stream_id)
);
-- indexes
-- The rows that name an operation outside its own stream (the updates that asked for it, their
-- repeats, its buttons). The operation's own stream, most of its rows, is found through the
-- inline operation_status and the ledger's (stream_id, version) index instead: an operation id
-- is random, so every row in this index dirties a page of its own, and leaving a worker's
-- events out keeps it to about one row per update. Forgetting a stream finds its rows by a scan
-- (targeted rebuilds are rare; every index slows the load of a rebuild).
CREATE INDEX IF NOT EXISTS "{index}_by_operation" ON "{table}" (operation_id, position)
    WHERE operation_id IS NOT NULL AND substr(stream_id, 1, 3) <> 'op-';
CREATE INDEX IF NOT EXISTS "{index}_by_user" ON "{table}" (user_id, position)
    WHERE user_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS "{index}_by_chat" ON "{table}" (chat_id, position)
    WHERE chat_id IS NOT NULL;
-- Times grow with positions, and rows are written in position order: a BRIN index (a few
-- pages, built in one pass) finds a time range as well as a B-tree would.
CREATE INDEX IF NOT EXISTS "{index}_by_time" ON "{table}" USING brin (recorded_at);
