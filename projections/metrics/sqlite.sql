-- metrics (SQLite): counters of what the ledger noted (duplicates, update id collisions, key
-- conflicts, quarantined bodies, refused transitions), and every operation's current state and
-- since when, aggregated when read (counts by state, age of the oldest waiting and claimed
-- operation). Disposable: rebuilt from the ledger at will. Times are microseconds since the
-- Unix epoch (UTC).
CREATE TABLE IF NOT EXISTS "{table}" (
    name  TEXT    PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS "{table}_ops" (
    stream_id TEXT    PRIMARY KEY,
    -- The domain's status name.
    status    TEXT    NOT NULL,
    -- When the operation entered that status.
    since     INTEGER NOT NULL
) WITHOUT ROWID;
-- indexes
CREATE INDEX IF NOT EXISTS "{index}_ops_by_status" ON "{table}_ops" (status, since);
