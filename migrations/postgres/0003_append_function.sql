-- One append in one statement (docs/adr/0015). The writer decides and seals a batch in memory
-- on the state it assumes (what its own last commit left: the head, and the versions of the
-- streams it wrote), then calls this function, which takes the same locks as every append
-- (the touched streams that exist, in sorted order, then the head), checks the assumption, and
-- only then writes. If the assumption is stale (another instance appended, a stream the writer
-- did not know exists, the time would go back), it writes nothing and returns what it found, and
-- the writer decides again on that. The rules of an append stay in one place, the writer's pure
-- code shared with SQLite; this function only checks and stores.
--
-- Called alone (no read model or attachment in the same transaction), the call is its own
-- transaction: one round trip, commit included.
CREATE FUNCTION opledger_append(
    -- Every stream the batch's calls name, sorted, and the version assumed for each (0: absent).
    touched text[],
    assumed bigint[],
    -- The head the batch was sealed after, and the time its events record.
    head_position bigint,
    head_hash bytea,
    at timestamptz,
    -- The sealed events, one array per column.
    e_position bigint[],
    e_stream_id text[],
    e_version bigint[],
    e_event_id uuid[],
    e_event_type text[],
    e_schema_version int4[],
    e_payload bytea[],
    e_metadata bytea[],
    e_prev_hash bytea[],
    e_hash bytea[],
    -- Streams the batch creates, and existing streams with their new versions.
    created_id text[],
    created_type text[],
    created_version bigint[],
    moved_id text[],
    moved_version bigint[],
    -- The head after the batch.
    new_position bigint,
    new_hash bytea
)
RETURNS TABLE (
    written boolean,
    -- When not written: what the writer should have assumed.
    found_versions bigint[],
    found_position bigint,
    found_hash bytea,
    found_at timestamptz,
    -- The database clock when the call ended, so the writer's next batch records the
    -- database's time.
    clock timestamptz
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    head ledger_head%ROWTYPE;
    actual bigint[];
BEGIN
    PERFORM 1 FROM streams WHERE stream_id = ANY (touched) ORDER BY stream_id FOR UPDATE;
    SELECT * INTO head FROM ledger_head WHERE ledger_id = 1 FOR UPDATE;
    -- Every writer creates or moves streams only while it holds the head, so what this reads
    -- now stays true until this transaction ends.
    SELECT coalesce(array_agg(coalesce(s.version, 0) ORDER BY t.n), '{}') INTO actual
    FROM unnest(touched) WITH ORDINALITY AS t(stream_id, n)
    LEFT JOIN streams AS s ON s.stream_id = t.stream_id;
    IF actual IS DISTINCT FROM assumed
       OR head.last_position <> head_position
       OR head.last_hash <> head_hash
       OR at < head.updated_at THEN
        RETURN QUERY SELECT false, actual, head.last_position, head.last_hash, head.updated_at,
                            clock_timestamp();
        RETURN;
    END IF;
    INSERT INTO streams (stream_id, stream_type, version, created_at)
    SELECT c.stream_id, c.stream_type, c.version, at
    FROM unnest(created_id, created_type, created_version) AS c(stream_id, stream_type, version);
    UPDATE streams SET version = m.version
    FROM unnest(moved_id, moved_version) AS m(stream_id, version)
    WHERE streams.stream_id = m.stream_id;
    INSERT INTO events (position, stream_id, version, event_id, event_type, schema_version,
                        payload, metadata, recorded_at, prev_hash, hash)
    SELECT e.position, e.stream_id, e.version, e.event_id, e.event_type, e.schema_version,
           e.payload, e.metadata, at, e.prev_hash, e.hash
    FROM unnest(e_position, e_stream_id, e_version, e_event_id, e_event_type, e_schema_version,
                e_payload, e_metadata, e_prev_hash, e_hash)
         AS e(position, stream_id, version, event_id, event_type, schema_version, payload,
              metadata, prev_hash, hash);
    UPDATE ledger_head SET last_position = new_position, last_hash = new_hash, updated_at = at
    WHERE ledger_id = 1;
    PERFORM pg_notify('opledger_events', new_position::text);
    RETURN QUERY SELECT true, NULL::bigint[], new_position, new_hash, at, clock_timestamp();
END
$$;
