-- reconciliation_queue (SQLite): the operations waiting for a person (marked for
-- reconciliation and not resolved yet), with why, the claims used and when they were marked;
-- their age is computed when read. Disposable: rebuilt from the ledger at will. Times are
-- microseconds since the Unix epoch (UTC).
CREATE TABLE IF NOT EXISTS "{table}" (
    stream_id     TEXT    PRIMARY KEY,
    operation_id  TEXT    NOT NULL,
    action        TEXT    NOT NULL,
    business_key  TEXT    NOT NULL,
    bot           TEXT    NOT NULL,
    chat_id       INTEGER,
    user_id       INTEGER,
    reason        TEXT    NOT NULL,
    attempts      INTEGER NOT NULL,
    marked_at     INTEGER NOT NULL,
    -- The position of the MarkedForReconciliation event.
    position      INTEGER NOT NULL
) WITHOUT ROWID;
-- What every operation's Received said (action, key, bot, chat, user), so that an operation
-- marked long after it started can be listed with them.
CREATE TABLE IF NOT EXISTS "{table}_ops" (
    stream_id     TEXT    PRIMARY KEY,
    operation_id  TEXT    NOT NULL,
    action        TEXT    NOT NULL,
    business_key  TEXT    NOT NULL,
    bot           TEXT    NOT NULL,
    chat_id       INTEGER,
    user_id       INTEGER
) WITHOUT ROWID;
-- indexes
CREATE INDEX IF NOT EXISTS "{index}_by_age" ON "{table}" (marked_at, operation_id);
