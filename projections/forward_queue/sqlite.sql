-- forward_queue (SQLite): the updates a gateway still owes a bot's webhook, one row per update,
-- updated inline with every append to its delivery stream; a row leaves when the bot
-- acknowledged the update or it was given up (and its answer's call, if any, finished).
-- Disposable: it can be dropped and rebuilt from the ledger. `{table}` and `{index}` are filled
-- in per version. Times are microseconds since the Unix epoch (UTC).
CREATE TABLE "{table}" (
    stream_id   TEXT    PRIMARY KEY,
    bot         TEXT    NOT NULL,
    update_id   INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,
    -- Updates of one lane (a chat, else a user, else the update alone) go one at a time, in
    -- position order.
    lane        TEXT    NOT NULL,
    position    INTEGER NOT NULL,
    received_at INTEGER NOT NULL,
    -- waiting | in_flight | failed | answering (acknowledged; the answer's call is under way)
    state       TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    lease_until INTEGER,
    retry_at    INTEGER,
    last_error  TEXT,
    failures    INTEGER NOT NULL
) WITHOUT ROWID;

-- indexes
CREATE INDEX "{index}_lane" ON "{table}" (bot, lane, position) WHERE state <> 'answering';
-- The forwarder reads lane heads oldest first and stops at its page: an ordered walk.
CREATE INDEX "{index}_order" ON "{table}" (position) WHERE state <> 'answering';
