//! The one way a job enters the queue: an [`Enqueuer`], built once with how
//! it writes rows and how it wakes worker pools, used inside the caller's own
//! transaction.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashSet};

use diesel::connection::{AnsiTransactionManager, TransactionManager as _};
use diesel::prelude::*;
use diesel::sql_types::{Array, Text};

use super::args::JobArgs;
use super::{NOTIFY_CHANNEL, NewJob, Waker, depend};
use crate::db::{PrepareOnce, prepare_insert};
use crate::schema::jobs;

/// How the rows of an enqueue are written, once the queue has decided which
/// of them wait behind their ordering key ([`NewJob::is_blocked`]): one
/// multi-row INSERT that returns the ids in row order. The queue's own writes
/// its columns; an application that added columns of its own to `jobs`
/// writes those too, through [`Enqueuer::insert_with`]. It is given at most
/// [`INSERT_CHUNK`] jobs at a time, so a row of up to 32 bound values stays
/// within PostgreSQL's 65,535 parameters of one statement.
pub type InsertJobs = fn(&mut PgConnection, &[NewJob]) -> QueryResult<Vec<i64>>;

/// The most jobs one call of an [`InsertJobs`] writes: a larger enqueue is
/// written by several, in order, inside one transaction.
pub const INSERT_CHUNK: usize = 2_000;

/// Enqueues jobs inside the caller's Diesel transaction: they commit or
/// vanish with the caller's own writes. Build one at start-up and keep it in
/// the application's state (it is cheap to clone and safe to share).
///
/// By default it writes the queue's columns and wakes the worker pools with a
/// NOTIFY in the enqueuing transaction, which PostgreSQL delivers on commit.
/// [`Enqueuer::wake_after_commit`] moves that NOTIFY out of the transaction,
/// for services whose commit rate matters ([`Waker`] says why).
///
/// ```no_run
/// use diesel::Connection as _;
/// use outbox_core::outbox::{Enqueuer, JobOptions};
/// use outbox_core::worker::JobArgs;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendInvoice {
///     invoice_id: i64,
/// }
///
/// impl JobArgs for SendInvoice {
///     const KIND: &'static str = "send_invoice";
/// }
///
/// # fn demo(conn: &mut diesel::PgConnection) -> diesel::QueryResult<()> {
/// let enqueuer = Enqueuer::new();
/// conn.transaction(|conn| {
///     // ... your own writes on `conn` ...
///     let options = JobOptions::default().max_attempts(5).ordering_key("invoice-42");
///     let job_id = enqueuer.enqueue(conn, &SendInvoice { invoice_id: 42 }, &options)?;
///     println!("enqueued job {job_id}");
///     Ok(())
/// })
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Enqueuer {
    insert: InsertJobs,
    /// `None`: NOTIFY in the enqueuing transaction.
    pub(super) waker: Option<Waker>,
}

impl Default for Enqueuer {
    fn default() -> Self {
        Enqueuer::new()
    }
}

impl Enqueuer {
    /// Writes the queue's columns and wakes worker pools with a NOTIFY in the
    /// enqueuing transaction.
    pub fn new() -> Enqueuer {
        Enqueuer {
            insert: insert_jobs,
            waker: None,
        }
    }

    /// Writes the rows with `insert`, which also fills the application's own
    /// columns of `jobs`.
    pub fn insert_with(mut self, insert: InsertJobs) -> Enqueuer {
        self.insert = insert;
        self
    }

    /// Wakes worker pools through `waker` once the enqueuing transaction has
    /// committed, instead of with a NOTIFY inside it, so that commits do not
    /// queue on PostgreSQL's notify lock. This applies to the jobs enqueued
    /// inside [`Enqueuer::transaction`]; anywhere else the NOTIFY stays in the
    /// transaction, since only there is the commit known. Spawn
    /// [`Waker::run`] once for the waker.
    pub fn wake_after_commit(mut self, waker: Waker) -> Enqueuer {
        self.waker = Some(waker);
        self
    }

    /// Enqueues one typed job (kind `A::KIND`, payload the arguments' JSON,
    /// `options` applied) in whatever transaction `conn` is in. Returns the
    /// job's id. Arguments that do not serialize (a map with non-string keys,
    /// say) are a [`diesel::result::Error::SerializationError`], so `?` rolls
    /// the caller's transaction back.
    pub fn enqueue<A: JobArgs>(
        &self,
        conn: &mut PgConnection,
        args: &A,
        options: &super::JobOptions,
    ) -> QueryResult<i64> {
        let job = NewJob::for_args(args, options)
            .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
        self.enqueue_many(conn, std::slice::from_ref(&job))?
            .pop()
            .ok_or(diesel::result::Error::NotFound)
    }

    /// Enqueues `new_jobs` with one INSERT (one per [`INSERT_CHUNK`] jobs),
    /// in whatever transaction `conn` is in (outside one, several INSERTs
    /// run in one of their own), and wakes the worker pools of their kinds.
    /// Returns their ids, in order.
    ///
    /// A job with an ordering key waits behind its key's unfinished jobs and
    /// behind earlier jobs of the same key in `new_jobs`. To know which keys
    /// have unfinished jobs, the enqueue locks the keys until the transaction
    /// ends (outside a transaction it opens one), and looks their heads up:
    /// two round trips, skipped for keys declared new
    /// ([`JobOptions::new_ordering_key`](super::JobOptions::new_ordering_key)).
    ///
    /// A job with parents ([`JobOptions::depends_on`](super::JobOptions::depends_on))
    /// waits for them: one more round trip looks them up and locks the
    /// unfinished ones until the transaction ends (outside one it opens one),
    /// and one draws the ids when jobs of `new_jobs` name each other
    /// ([`Parent::InBatch`](super::Parent::InBatch)). A refused parent is a
    /// [`DependencyError`](super::DependencyError), before anything is written.
    pub fn enqueue_many(
        &self,
        conn: &mut PgConnection,
        new_jobs: &[NewJob],
    ) -> QueryResult<Vec<i64>> {
        if new_jobs.is_empty() {
            return Ok(Vec::new());
        }
        let has_parents = new_jobs.iter().any(|j| !j.parents.is_empty());
        // The parents' locks must live until the enqueuing transaction
        // commits, as the ordering keys' do (see insert_queued); and the
        // INSERTs of a large enqueue commit together or not at all.
        if (has_parents || new_jobs.len() > INSERT_CHUNK) && !in_transaction(conn) {
            return conn.transaction(|conn| self.enqueue_many(conn, new_jobs));
        }
        // Parents first: a refused one must leave nothing written.
        let with_parents = match depend::resolve(conn, new_jobs)? {
            None => None,
            Some((resolved, in_batch)) => {
                let mut jobs = new_jobs.to_vec();
                for (job, columns) in jobs.iter_mut().zip(resolved) {
                    job.waiting_on = columns.waiting_on;
                    job.depends_on = columns.depends_on;
                    job.dependency_policy = columns.policy.map(str::to_owned);
                    job.unfinished_parents = columns.unfinished_parents;
                }
                if in_batch {
                    depend::assign_batch_ids(conn, &mut jobs)?;
                }
                Some(jobs)
            }
        };
        let new_jobs = with_parents.as_deref().unwrap_or(new_jobs);
        ensure_concurrency_keys(conn, new_jobs)?;
        let ids = insert_queued(conn, new_jobs, self.insert)?;
        let kinds = new_jobs.iter().map(NewJob::kind);
        match &self.waker {
            Some(waker) if AfterCommit::record(waker, kinds.clone()) => {}
            _ => notify(conn, kinds)?,
        }
        Ok(ids)
    }

    /// Runs `f` in a transaction on `conn`, as `conn.transaction(f)` does,
    /// and, with [`Enqueuer::wake_after_commit`], wakes the worker pools of the
    /// jobs this enqueuer enqueued inside it once it has committed. Inside
    /// another transaction it is a savepoint, and the outer transaction's
    /// commit is what counts.
    pub fn transaction<T, E, F>(&self, conn: &mut PgConnection, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut PgConnection) -> Result<T, E>,
        E: From<diesel::result::Error>,
    {
        let Some(waker) = &self.waker else {
            return conn.transaction(f);
        };
        if in_transaction(conn) {
            return conn.transaction(f);
        }
        let frame = AfterCommit::open(waker);
        let result = conn.transaction(f);
        let kinds = frame.close();
        if result.is_ok() {
            waker.wake(kinds.iter().map(String::as_str));
        }
        result
    }
}

/// The kinds enqueued inside the [`Enqueuer::transaction`]s open on this
/// thread, innermost last, each with its waker. Diesel runs a transaction's
/// closure on the calling thread, so the frame open here is the one the
/// enqueue belongs to.
pub(super) struct AfterCommit;

thread_local! {
    static FRAMES: RefCell<Vec<(Waker, BTreeSet<String>)>> = const { RefCell::new(Vec::new()) };
}

/// Pops its frame when dropped, so a panic in the transaction's closure
/// leaves no frame behind.
struct Frame {
    depth: usize,
}

impl AfterCommit {
    fn open(waker: &Waker) -> Frame {
        FRAMES.with_borrow_mut(|frames| {
            frames.push((waker.clone(), BTreeSet::new()));
            Frame {
                depth: frames.len(),
            }
        })
    }

    /// Whether a frame of `waker` is open on this thread.
    pub(super) fn is_open(waker: &Waker) -> bool {
        FRAMES.with_borrow(|frames| frames.iter().any(|(w, _)| w.same_as(waker)))
    }

    /// Notes `kinds` for the innermost open frame of `waker`; false when
    /// there is none, and the caller must NOTIFY in the transaction.
    pub(super) fn record<'a>(waker: &Waker, kinds: impl Iterator<Item = &'a str>) -> bool {
        FRAMES.with_borrow_mut(|frames| {
            match frames.iter_mut().rev().find(|(w, _)| w.same_as(waker)) {
                Some((_, pending)) => {
                    pending.extend(kinds.map(str::to_owned));
                    true
                }
                None => false,
            }
        })
    }
}

impl Frame {
    fn close(self) -> BTreeSet<String> {
        let kinds = FRAMES.with_borrow_mut(|frames| {
            frames
                .get_mut(self.depth - 1)
                .map(|(_, kinds)| std::mem::take(kinds))
                .unwrap_or_default()
        });
        drop(self);
        kinds
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        FRAMES.with_borrow_mut(|frames| frames.truncate(self.depth - 1));
    }
}

pub(super) fn in_transaction(conn: &mut PgConnection) -> bool {
    AnsiTransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .is_ok_and(|depth| depth.is_some())
}

/// Wakes the worker pools of `kinds` when the current transaction commits (at once
/// outside one): one NOTIFY per distinct kind, in one round trip.
fn notify<'a>(
    conn: &mut PgConnection,
    kinds: impl IntoIterator<Item = &'a str>,
) -> QueryResult<()> {
    let mut kinds: Vec<&str> = kinds.into_iter().collect();
    kinds.sort_unstable();
    kinds.dedup();
    diesel::sql_query(include_str!("sql/notify_in_transaction.sql"))
        .bind::<Text, _>(NOTIFY_CHANNEL)
        .bind::<Array<Text>, _>(&kinds)
        .prepared()
        .execute(conn)
        .map(drop)
}

/// Gives each concurrency key of `new_jobs` its row, through which the claim
/// finds the key's jobs: one round trip, only when a job has a key.
fn ensure_concurrency_keys(conn: &mut PgConnection, new_jobs: &[NewJob]) -> QueryResult<()> {
    let mut keys: Vec<&str> = new_jobs
        .iter()
        .filter_map(NewJob::concurrency_key_value)
        .collect();
    if keys.is_empty() {
        return Ok(());
    }
    keys.sort_unstable();
    keys.dedup();
    diesel::sql_query(include_str!("sql/ensure_concurrency_keys.sql"))
        .bind::<Array<Text>, _>(&keys)
        .prepared()
        .execute(conn)
        .map(drop)
}

/// Inserts `new_jobs` with `insert`, each keyed job queued behind its key's
/// unfinished jobs (those of keys declared new have none).
fn insert_queued(
    conn: &mut PgConnection,
    new_jobs: &[NewJob],
    insert: InsertJobs,
) -> QueryResult<Vec<i64>> {
    let mut keys: Vec<&str> = new_jobs
        .iter()
        .filter(|j| !j.key_is_new)
        .filter_map(|j| j.ordering_key.as_deref())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    if keys.is_empty() {
        if new_jobs.iter().all(|j| j.ordering_key.is_none()) {
            return insert_in_chunks(conn, new_jobs, insert);
        }
        return insert_in_chunks(conn, &queue_behind(new_jobs, &HashSet::new()), insert);
    }
    // The key locks must live until the enqueuing transaction commits.
    // Inside the caller's transaction (the one that wrote the rows the jobs
    // are for) they do as they are; outside one, a transaction of our own
    // makes sure there is one. A savepoint would only add two round trips to
    // every enqueuing transaction.
    if in_transaction(conn) {
        insert_keyed(conn, new_jobs, &keys, insert)
    } else {
        conn.transaction(|conn| insert_keyed(conn, new_jobs, &keys, insert))
    }
}

/// `new_jobs` with `blocked` set for each job whose key is in `busy` (has an
/// unfinished job) or appeared earlier in `new_jobs`.
fn queue_behind(new_jobs: &[NewJob], busy: &HashSet<String>) -> Vec<NewJob> {
    let mut started = HashSet::new();
    new_jobs
        .iter()
        .map(|job| {
            let mut job = job.clone();
            if let Some(key) = job.ordering_key.clone() {
                job.blocked = busy.contains(&key) || !started.insert(key);
            }
            job
        })
        .collect()
}

/// Inserts `new_jobs`, whose not-new ordering keys are `keys`, each queued
/// behind its key's unfinished jobs. Runs inside a transaction, which holds
/// the locks.
fn insert_keyed(
    conn: &mut PgConnection,
    new_jobs: &[NewJob],
    keys: &[&str],
    insert: InsertJobs,
) -> QueryResult<Vec<i64>> {
    #[derive(QueryableByName)]
    struct KeyRow {
        #[diesel(sql_type = Text)]
        key: String,
    }
    diesel::sql_query(include_str!("sql/lock_ordering_keys.sql"))
        .bind::<Array<Text>, _>(keys)
        .execute(conn)?;
    let busy: HashSet<String> = diesel::sql_query(include_str!("sql/lock_ordering_heads.sql"))
        .bind::<Array<Text>, _>(keys)
        .load::<KeyRow>(conn)?
        .into_iter()
        .map(|r| r.key)
        .collect();
    insert_in_chunks(conn, &queue_behind(new_jobs, &busy), insert)
}

/// Writes `new_jobs` with `insert`, [`INSERT_CHUNK`] at a time, in order:
/// one statement for most enqueues. The caller is in a transaction whenever
/// there is more than one chunk (see [`Enqueuer::enqueue_many`]).
fn insert_in_chunks(
    conn: &mut PgConnection,
    new_jobs: &[NewJob],
    insert: InsertJobs,
) -> QueryResult<Vec<i64>> {
    if new_jobs.len() <= INSERT_CHUNK {
        return insert(conn, new_jobs);
    }
    let mut ids = Vec::with_capacity(new_jobs.len());
    for chunk in new_jobs.chunks(INSERT_CHUNK) {
        ids.extend(insert(conn, chunk)?);
    }
    Ok(ids)
}

/// The queue's [`InsertJobs`]: its own columns, one multi-row INSERT.
fn insert_jobs(conn: &mut PgConnection, new_jobs: &[NewJob]) -> QueryResult<Vec<i64>> {
    let rows: Vec<QueueRow<'_>> = new_jobs.iter().map(QueueRow::from).collect();
    // One multi-row INSERT draws the ids in row order: enqueue order.
    let insert = diesel::insert_into(jobs::table)
        .values(&rows)
        .returning(jobs::id);
    if prepare_insert(rows.iter().map(QueueRow::shape)) {
        insert.prepared().get_results(conn)
    } else {
        insert.get_results(conn)
    }
}

// The queue's columns of one [`NewJob`], as [`insert_jobs`] writes them:
// private, so that `NewJob` itself is no `Insertable` a caller could write
// past the enqueue.
crate::queue_row!(QueueRow for jobs);
