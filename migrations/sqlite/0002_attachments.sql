-- Attachments: bytes kept beside the history, not in it. An append may write them in its own
-- transaction (so they are durable exactly when its events are) and a later append may delete
-- them; they are neither hashed nor exported. The gateway keeps the raw body of an update here
-- until the bot acknowledged it (docs/adr/0012).
CREATE TABLE attachments (
    stream_id TEXT NOT NULL,
    name      TEXT NOT NULL,
    body      BLOB NOT NULL,
    PRIMARY KEY (stream_id, name)
) WITHOUT ROWID;
