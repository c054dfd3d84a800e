//! The one-round-trip append (ADR 0015): the writer decides and seals a batch on what its own
//! commits told it (the head, the time it recorded, the versions of the streams it wrote), and
//! `opledger_append` (migrations 3 and 4) checks that under the locks every append takes before it
//! writes. If the writer's knowledge is stale, nothing is written, the function says what it
//! found, and the batch is decided again on that.
//!
//! The decision stays the writer's pure [`Plan`], shared with SQLite; the server only checks and
//! stores. A batch without attachments whose inline read models can plan their writes
//! ([`Planners`], ADR 0016), or that has none, is one statement: its own transaction, commit
//! included, in one round trip. Otherwise the call opens the transaction the read models then
//! write in, and after a stale answer it holds the locks, so the second decision is on exact
//! versions.

use std::collections::HashMap;
use std::time::Instant;

use chrono::{DateTime, TimeDelta, Utc};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, Row};

use super::{BatchError, Columns, classify, retryable, rollback};
use crate::backend::Either;
use crate::batch::{Plan, streams_of};
use crate::chain::Link;
use crate::columns::{to_hash, to_i64, to_u64};
use crate::error::StoreError;
use crate::group_commit::BatchOutcome;
use crate::inline::{InlineProjections, InlineWriter, PgWrite, Planned};
use crate::model::{AppendRequest, Head, StreamId, StreamVersion, micros_to_datetime};

/// The stream versions a writer remembers; past this many it forgets them all (the next
/// batches learn the versions they need from stale answers).
const REMEMBERED_STREAMS: usize = 100_000;

/// How many times a batch is decided again on stale knowledge before it takes the locking path.
const ATTEMPTS: usize = 2;

/// How many parameters [`APPEND`] has.
const APPEND_PARAMETERS: usize = 22;

const APPEND: &str = "\
    SELECT written, found_versions, found_position, found_hash, found_at, clock \
    FROM opledger_append($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
                         $16, $17, $18, $19, $20, $21, $22)";

/// What the writer's last answers from the server told it.
#[derive(Debug, Default)]
pub(super) struct Known {
    /// The head after the last batch this writer saw committed, and the time it recorded.
    head: Option<(Head, DateTime<Utc>)>,
    /// The database clock as of the last answer, and when that answer arrived.
    clock: Option<(DateTime<Utc>, Instant)>,
    /// Versions of streams, as of the head (absent: assumed not to exist).
    versions: HashMap<StreamId, StreamVersion>,
}

impl Known {
    /// Forgets the head (after an error: the next batch locks and reads it again). The stream
    /// versions are kept, since the server checks every one of them anyway.
    pub(super) fn forget_head(&mut self) {
        self.head = None;
    }

    /// Learns what a batch that held the locks found, or committed.
    pub(super) fn learn(
        &mut self,
        head: Head,
        at: DateTime<Utc>,
        clock: DateTime<Utc>,
        versions: impl IntoIterator<Item = (StreamId, StreamVersion)>,
    ) {
        if self.versions.len() > REMEMBERED_STREAMS {
            self.versions.clear();
        }
        for (stream, version) in versions {
            if version == 0 {
                self.versions.remove(&stream);
            } else {
                self.versions.insert(stream, version);
            }
        }
        self.head = Some((head, at));
        self.clock = Some((clock, Instant::now()));
    }

    /// The time the next batch records: the database clock as last read plus the time since,
    /// never earlier than the head's.
    fn next_at(&self, head_at: DateTime<Utc>) -> DateTime<Utc> {
        let estimate = self.clock.map(|(clock, read)| {
            clock + TimeDelta::from_std(read.elapsed()).unwrap_or(TimeDelta::zero())
        });
        estimate.map_or(head_at, |estimate| estimate.max(head_at))
    }
}

/// Appends `calls` on what `known` says; `Ok(None)` when the locking path must do it: the head
/// is unknown, the knowledge stayed stale, or the batch would only be rejected (a conflict is
/// answered only from versions read under the locks).
pub(super) async fn write(
    connection: &mut PgConnection,
    known: &mut Known,
    inline: &InlineProjections,
    planners: &mut Planners,
    calls: &[Vec<AppendRequest>],
) -> Result<Option<BatchOutcome>, BatchError> {
    let touched = streams_of(calls);
    let ids: Vec<&str> = touched.iter().map(|s| s.as_str()).collect();
    let mut in_transaction = false;
    for _ in 0..ATTEMPTS {
        let Some((head, head_at)) = known.head else {
            break;
        };
        let assumed: HashMap<StreamId, StreamVersion> = touched
            .iter()
            .filter_map(|&s| known.versions.get(s).map(|&v| (s.clone(), v)))
            .collect();
        let plan = Plan::decide(calls, &assumed);
        if plan.event_count() == 0 {
            if in_transaction {
                // Decided on what this transaction read under its locks: exact.
                rollback(connection).await?;
                return Ok(Some(BatchOutcome {
                    results: plan.into_rejections(),
                    head: None,
                }));
            }
            break;
        }
        // Stored with microseconds, as it is hashed.
        let at = micros_to_datetime(known.next_at(head_at).timestamp_micros());
        let sealed = plan.seal(head, at.timestamp_micros());
        let side = crate::attachments::of(calls, &sealed.results);
        let events: Vec<Link<'_>> = sealed.rows.iter().map(|row| row.link).collect();
        // The read models' writes, planned to run in the call's statement, when nothing else
        // needs the transaction (ADR 0016).
        let planned = if in_transaction || !side.is_empty() || inline.is_empty() {
            None
        } else {
            planners.plan(connection, &events).await
        };
        let alone = (inline.is_empty() || planned.is_some()) && side.is_empty();
        if !alone && !in_transaction {
            sqlx::raw_sql("BEGIN")
                .execute(&mut *connection)
                .await
                .map_err(|e| BatchError::NotStarted(classify("starting an append", e)))?;
            in_transaction = true;
        }
        let columns = Columns::of(&sealed);
        let versions: Vec<i64> = touched
            .iter()
            .map(|&s| to_i64(assumed.get(s).copied().unwrap_or(0)))
            .collect();
        let writes = planned.as_deref().unwrap_or_default();
        let statement = planners.statement(writes);
        let query = sqlx::query(AssertSqlSafe(statement.as_str()))
            .bind(&ids)
            .bind(&versions)
            .bind(to_i64(head.position))
            .bind(&head.hash.as_bytes()[..])
            .bind(at);
        let query = columns
            .bind_streams(columns.bind_events(query))
            .bind(to_i64(sealed.new_head.position))
            .bind(&sealed.new_head.hash.as_bytes()[..]);
        let answer = writes
            .iter()
            .fold(query, |query, (_, write)| write.bind(query))
            .fetch_one(&mut *connection)
            .await;
        let last = sealed.new_head;
        let written = answer
            .as_ref()
            .ok()
            .and_then(|row| row.try_get::<bool, _>(0).ok())
            == Some(true);
        // What was planned is the read models' state only once the statement committed.
        if planned.is_some() && written {
            planners.committed();
        } else {
            planners.discarded();
        }
        let row = match answer {
            Ok(row) => row,
            // Inside a transaction nothing is committed before COMMIT.
            Err(error) if in_transaction => {
                return Err(BatchError::Failed(classify("appending", error)));
            }
            // Alone, the call is its own commit: a lost answer leaves the outcome unknown.
            Err(error) if retryable(&error) => {
                return Err(BatchError::CommitUnknown {
                    error: classify("appending", error),
                    outcome: BatchOutcome {
                        results: sealed.results,
                        head: Some(last.position),
                    },
                    last,
                });
            }
            Err(error) => return Err(BatchError::Failed(classify("appending", error))),
        };
        let answer = match decode(&row) {
            Ok(answer) => answer,
            Err(error) if in_transaction => {
                return Err(BatchError::Failed(classify("appending", error)));
            }
            // The call may have committed; the hash of its last event will tell.
            Err(error) => {
                return Err(BatchError::CommitUnknown {
                    error: StoreError::storage("reading the append's answer", error),
                    outcome: BatchOutcome {
                        results: sealed.results,
                        head: Some(last.position),
                    },
                    last,
                });
            }
        };
        if !answer.written {
            known.learn(
                answer.head,
                answer.at,
                answer.clock,
                touched.iter().map(|&s| s.clone()).zip(answer.versions),
            );
            continue;
        }
        let versions = sealed.streams.iter().map(|w| (w.stream.clone(), w.after));
        known.learn(last, at, answer.clock, versions);
        let outcome = BatchOutcome {
            results: sealed.results,
            head: Some(last.position),
        };
        if !in_transaction {
            return Ok(Some(outcome));
        }
        if !inline.is_empty() {
            for projection in inline {
                projection
                    .apply(Either::Postgres(&mut *connection), &events)
                    .await
                    .map_err(|e| crate::inline::failed(projection.name(), e, retryable))?;
            }
        }
        crate::attachments::write(Either::Postgres(&mut *connection), &side)
            .await
            .map_err(|e| classify("writing attachments", e))?;
        return super::commit(connection, outcome, last).await.map(Some);
    }
    if in_transaction {
        rollback(connection).await?;
    }
    Ok(None)
}

/// The inline read models' planners (ADR 0016), when every read model has one: then a batch
/// that all of them can plan is one statement, the call with their writes beside it.
#[derive(Debug)]
pub(super) struct Planners {
    writers: Option<Vec<Box<dyn InlineWriter>>>,
    /// The statements made so far, by which planners write in them (a bit per planner).
    statements: HashMap<u64, std::sync::Arc<String>>,
}

/// A planner's writes for one batch, with the planner's index.
type Writes = Vec<(usize, Box<dyn PgWrite>)>;

impl Planners {
    pub(super) fn of(inline: &InlineProjections) -> Self {
        let writers = if inline.is_empty() || inline.len() > 64 {
            None
        } else {
            inline
                .iter()
                .map(|projection| projection.writer())
                .collect()
        };
        Planners {
            writers,
            statements: HashMap::new(),
        }
    }

    /// The writes of every planner that has some, or `None` when one of them cannot plan the
    /// batch (it then takes the transaction, where the read models read what they need).
    async fn plan(&mut self, connection: &mut PgConnection, events: &[Link<'_>]) -> Option<Writes> {
        let writers = self.writers.as_mut()?;
        let mut writes = Vec::new();
        for (index, writer) in writers.iter_mut().enumerate() {
            match writer.plan(&mut *connection, events).await {
                Ok(Planned::Nothing) => {}
                Ok(Planned::Write(write)) => writes.push((index, write)),
                Ok(Planned::Unknown) => return self.give_up(),
                Err(error) => {
                    // The transaction's own read and fold meet (and report) the same problem.
                    tracing::debug!(%error, "an inline read model could not plan a batch");
                    return self.give_up();
                }
            }
        }
        Some(writes)
    }

    fn give_up(&mut self) -> Option<Writes> {
        self.discarded();
        None
    }

    fn committed(&mut self) {
        for writer in self.writers.iter_mut().flatten() {
            writer.committed();
        }
    }

    fn discarded(&mut self) {
        for writer in self.writers.iter_mut().flatten() {
            writer.discarded();
        }
    }

    /// The call alone, or the call with `writes` run after it, each only if it wrote.
    fn statement(&mut self, writes: &[(usize, Box<dyn PgWrite>)]) -> std::sync::Arc<String> {
        let key = writes.iter().fold(0u64, |key, (index, _)| key | 1 << index);
        self.statements
            .entry(key)
            .or_insert_with(|| {
                if writes.is_empty() {
                    return std::sync::Arc::new(APPEND.to_owned());
                }
                let mut sql = format!("WITH appended AS MATERIALIZED ({APPEND})");
                let mut next = APPEND_PARAMETERS + 1;
                for (index, write) in writes {
                    let part = write.statement(next, "(SELECT written FROM appended)");
                    sql.push_str(&format!(", inline_{index} AS ({part})"));
                    next += write.parameters();
                }
                sql.push_str(
                    " SELECT written, found_versions, found_position, found_hash, found_at, \
                     clock FROM appended",
                );
                std::sync::Arc::new(sql)
            })
            .clone()
    }
}

/// One answer of `opledger_append`.
struct Answer {
    written: bool,
    versions: Vec<StreamVersion>,
    head: Head,
    at: DateTime<Utc>,
    clock: DateTime<Utc>,
}

fn decode(row: &sqlx::postgres::PgRow) -> Result<Answer, sqlx::Error> {
    let versions: Option<Vec<i64>> = row.try_get(1)?;
    Ok(Answer {
        written: row.try_get(0)?,
        versions: versions
            .unwrap_or_default()
            .into_iter()
            .map(|v| to_u64(v, "version"))
            .collect::<Result<_, _>>()?,
        head: Head {
            position: to_u64(row.try_get(2)?, "last_position")?,
            hash: to_hash(&row.try_get::<Vec<u8>, _>(3)?, "last_hash")?,
        },
        at: row.try_get(4)?,
        clock: row.try_get(5)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_batch_never_records_an_earlier_time_than_the_head() {
        let mut known = Known::default();
        let head_at = Utc::now();
        assert_eq!(known.next_at(head_at), head_at, "no clock read yet");
        let behind = head_at - TimeDelta::seconds(5);
        known.learn(
            Head {
                position: 1,
                hash: crate::chain::Hash::GENESIS,
            },
            head_at,
            behind,
            [],
        );
        assert_eq!(known.next_at(head_at), head_at);
        let ahead = head_at + TimeDelta::seconds(5);
        known.clock = Some((ahead, Instant::now()));
        assert!(known.next_at(head_at) >= ahead);
    }

    #[test]
    fn versions_are_learned_and_a_missing_stream_is_forgotten() {
        let mut known = Known::default();
        let head = Head {
            position: 3,
            hash: crate::chain::Hash::GENESIS,
        };
        let a = StreamId::new("a-1").unwrap();
        known.learn(head, Utc::now(), Utc::now(), [(a.clone(), 2)]);
        assert_eq!(known.versions.get(&a), Some(&2));
        known.learn(head, Utc::now(), Utc::now(), [(a.clone(), 0)]);
        assert_eq!(known.versions.get(&a), None);
        known.forget_head();
        assert!(known.head.is_none());
    }
}
