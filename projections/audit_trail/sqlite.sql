-- audit_trail (SQLite): one row per event of the ledger, with who or what caused it and the
-- operation, bot, user and chat it concerns. Disposable: rebuilt from the ledger at will. Times
-- are microseconds since the Unix epoch (UTC), like the ledger's.
CREATE TABLE IF NOT EXISTS "{table}" (
    position     INTEGER PRIMARY KEY,
    recorded_at  INTEGER NOT NULL,
    stream_id    TEXT    NOT NULL,
    version      INTEGER NOT NULL,
    event_type   TEXT    NOT NULL,
    operation_id TEXT,
    bot          TEXT,
    user_id      INTEGER,
    chat_id      INTEGER,
    -- update, worker, operator, system, or unknown (metadata that is not opledger's).
    actor_kind   TEXT    NOT NULL,
    -- The update id, the worker's id, the operator's name or the component's name.
    actor_id     TEXT,
    correlation  TEXT,
    summary      TEXT    NOT NULL
);
-- What a stream's first event said about it (operation, bot, user, chat), for its later events
-- and for the events an update of it caused.
CREATE TABLE IF NOT EXISTS "{table}_streams" (
    stream_id    TEXT PRIMARY KEY,
    operation_id TEXT,
    bot          TEXT,
    user_id      INTEGER,
    chat_id      INTEGER
) WITHOUT ROWID;
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
CREATE INDEX IF NOT EXISTS "{index}_by_time" ON "{table}" (recorded_at);
