-- metrics (PostgreSQL): counters of what the ledger noted (duplicates, update id collisions, key
-- conflicts, quarantined bodies, refused transitions), and every operation's current state and
-- since when, aggregated when read (counts by state, age of the oldest waiting and claimed
-- operation). Disposable: rebuilt from the ledger at will.
CREATE TABLE IF NOT EXISTS "{table}" (
    name  text   NOT NULL,
    value bigint NOT NULL,
    CONSTRAINT "{index}_pkey" PRIMARY KEY (name)
);
CREATE TABLE IF NOT EXISTS "{table}_ops" (
    stream_id text COLLATE "C" NOT NULL,
    -- The domain's status name.
    status    text        NOT NULL,
    -- When the operation entered that status.
    since     timestamptz NOT NULL,
    CONSTRAINT "{index}_ops_pkey" PRIMARY KEY (stream_id)
);
-- indexes
CREATE INDEX IF NOT EXISTS "{index}_ops_by_status" ON "{table}_ops" (status, since);
