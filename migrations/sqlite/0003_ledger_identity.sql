-- The ledger's identity: a random id drawn once, when this migration runs. The read models' own
-- file beside a SQLite ledger (ADR 0014) records it, so that a file of another ledger is never
-- served as this one's. It never changes.
CREATE TABLE ledger_identity (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    ledger_id BLOB    NOT NULL CHECK (length(ledger_id) = 16)
);
INSERT INTO ledger_identity (id, ledger_id) VALUES (1, randomblob(16));
CREATE TRIGGER ledger_identity_refuse_update BEFORE UPDATE ON ledger_identity
BEGIN
    SELECT RAISE(ABORT, 'opledger ledger identity never changes');
END;
CREATE TRIGGER ledger_identity_refuse_delete BEFORE DELETE ON ledger_identity
BEGIN
    SELECT RAISE(ABORT, 'opledger ledger identity never changes');
END;
