//! The worker pool's own connections, on which its hot statements run prepared.
//!
//! Claims, outcomes, heartbeats, releases and the reaper's statements run on
//! tokio-postgres connections that this worker pool opens from `DATABASE_URL` (TLS
//! as libpq reads it, like the LISTEN connection), each with the statements
//! prepared once (`outbox/prepared.rs`). Errors there carry their SQLSTATE,
//! so a timeout or a deadlock is told apart whatever the server's language.
//!
//! Each role has its own connections: claims on theirs, each completer writer
//! on its own, the heartbeat and releases on one, the reaper on one (a
//! writer's and the reaper's transactions must carry nothing else). A
//! statement runs on one server process at a time, so a long write of 512
//! outcomes never holds a claim up behind it.
//!
//! Where no connection of its own can be opened (a URL or TLS setting only
//! libpq understands, say), the same statements run on the pool through
//! Diesel, unprepared, as they did before; a warning says so once, and the
//! worker pool tries its own connections again every
//! [`REOPEN_AFTER`](crate::db::REOPEN_AFTER). Outcomes
//! with a local write stay here when each hook hands over its row
//! ([`HookRow`](crate::outbox::HookRow)); a hook that writes through Diesel
//! takes its batch there.

use crate::lock;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::{BackoffPolicy, PoolSettings};
use crate::db::{DbError, OwnConnection, OwnConnections, PgPool, run_blocking};
use crate::outbox::LocalWrite;
use crate::outbox::claim_plan::{BY_KEY_PLANNING, CHECK_EVERY, ClaimPlanner};
use crate::outbox::finish::{finish_jobs_with, hook_rows};
use crate::outbox::prepared::{HookStatements, HotStatements};
use crate::statements::{
    ClaimPosition, ClaimRequest, ClaimedJob, Finish, FinishReport, HeartbeatReport, JobLease,
    ReapReport, ReapRequest, advance_stranded_keys, claim_jobs, claim_jobs_after, extend_leases,
    hand_back_jobs, reap_expired_leases,
};

/// The least time a statement on the worker pool's own connection gets before the
/// connection is taken for dead (a peer that went silent, a network that drops
/// packets without a reset): the lease, or this if longer. Past the lease
/// whatever the statement would renew has lapsed anyway; the floor keeps a slow
/// but live server under a short test lease from losing its connections.
const MIN_DEADLINE: Duration = Duration::from_secs(30);
/// Most connections claims run on: claims of one worker pool compete for the same
/// index pages, and two cover what a small server runs side by side.
const MAX_CLAIM_CONNECTIONS: usize = 2;

/// Which of the worker pool's connections a statement runs on.
#[derive(Debug, Clone, Copy)]
pub(super) enum Role {
    Claim,
    /// The completer writer of this index.
    Write(usize),
    /// Heartbeats and releases: a connection of their own, since a writer's
    /// may be inside a transaction.
    Upkeep,
    /// The reaper's transactions: a connection only the reaper's one task
    /// uses, so nothing else can land inside its `BEGIN` … `COMMIT`.
    Reap,
}

/// One open connection and its prepared statements.
struct Open {
    client: Client,
    /// A claim's connection chooses its claim's plan
    /// (`outbox/claim_plan.rs`) every [`CHECK_EVERY`] with this; any other
    /// plans as [`BY_KEY_PLANNING`] says, once.
    planner: Option<ClaimPlanner>,
    /// When a claim's connection last chose.
    planned: Mutex<Instant>,
    statements: HotStatements,
    /// The statements of local writes' rows, prepared as they come.
    hooks: HookStatements,
}

impl OwnConnection for Open {
    fn client(&self) -> &Client {
        &self.client
    }
}

/// The worker pool's connections, opened on first use and again after one breaks.
pub(super) struct HotPath {
    pool: PgPool,
    worker_id: String,
    kinds: Vec<String>,
    lease: Duration,
    own: OwnConnections<Open>,
    claim_slots: usize,
    next_claim: AtomicUsize,
}

impl HotPath {
    pub(super) fn new(
        pool: PgPool,
        database_url: String,
        settings: &PoolSettings,
        writers: usize,
    ) -> Self {
        let claim_slots = super::claim_pace::most_claims(settings.batch_size, settings.concurrency)
            .min(MAX_CLAIM_CONNECTIONS);
        HotPath {
            own: OwnConnections::new(
                pool.clone(),
                database_url,
                claim_slots + writers.max(1) + 2,
                settings.lease.max(MIN_DEADLINE),
                "the relay's",
            ),
            pool,
            worker_id: settings.worker_id.clone(),
            kinds: settings.kinds.clone(),
            lease: settings.lease,
            claim_slots,
            next_claim: AtomicUsize::new(0),
        }
    }

    /// Claims up to `limit` jobs (from `after` in the claim order, or the front).
    pub(super) async fn claim(
        &self,
        limit: usize,
        after: Option<ClaimPosition>,
    ) -> Result<Vec<ClaimedJob>, DbError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let request = ClaimRequest {
            worker_id: &self.worker_id,
            kinds: &self.kinds,
            limit,
            lease: self.lease,
        };
        if let Some(result) = self
            .on_own(Role::Claim, async |open| {
                open.statements.claim(&open.client, &request, after).await
            })
            .await
        {
            return result;
        }
        let (worker_id, kinds, lease) = (self.worker_id.clone(), self.kinds.clone(), self.lease);
        run_blocking(&self.pool, move |conn| {
            let request = ClaimRequest {
                worker_id: &worker_id,
                kinds: &kinds,
                limit,
                lease,
            };
            Ok(match after {
                Some(after) => claim_jobs_after(conn, &request, after)?,
                None => claim_jobs(conn, &request)?,
            })
        })
        .await
    }

    /// Writes `finishes` (see [`finish_jobs`](crate::statements::finish_jobs)),
    /// each with its `writes` (committed with its outcome, whatever it is),
    /// on writer `writer`'s connection. A batch without local writes sends
    /// the `done`s of claims `standalone` marks to the standalone finish
    /// ([`HotStatements::finish_standalone_first`](crate::statements::HotStatements::finish_standalone_first)).
    pub(super) async fn finish(
        &self,
        writer: usize,
        finishes: Vec<Finish>,
        writes: Vec<Vec<LocalWrite>>,
        standalone: Vec<bool>,
    ) -> Result<FinishReport, DbError> {
        if let Some(rows) = hook_rows(&finishes, &writes)
            && let Some(result) = self
                .on_own(Role::Write(writer), async |open| {
                    if rows.is_empty() {
                        open.statements
                            .finish_standalone_first(&open.client, &finishes, &standalone)
                            .await
                    } else {
                        open.statements
                            .finish_with_rows(&open.client, &open.hooks, &finishes, rows)
                            .await
                    }
                })
                .await
        {
            return result;
        }
        run_blocking(&self.pool, move |conn| {
            Ok(finish_jobs_with(conn, &finishes, &writes)?)
        })
        .await
    }

    /// Extends `leases` (see [`extend_leases`]).
    pub(super) async fn extend(&self, leases: Vec<JobLease>) -> Result<HeartbeatReport, DbError> {
        let lease = self.lease;
        if let Some(result) = self
            .on_own(Role::Upkeep, async |open| {
                open.statements.extend(&open.client, &leases, lease).await
            })
            .await
        {
            return result;
        }
        run_blocking(&self.pool, move |conn| {
            Ok(extend_leases(conn, &leases, lease)?)
        })
        .await
    }

    /// Hands `leases` back unstarted (see [`hand_back_jobs`]).
    pub(super) async fn hand_back(&self, leases: Vec<JobLease>) -> Result<Vec<i64>, DbError> {
        if let Some(result) = self
            .on_own(Role::Upkeep, async |open| {
                open.statements.hand_back(&open.client, &leases).await
            })
            .await
        {
            return result;
        }
        run_blocking(&self.pool, move |conn| Ok(hand_back_jobs(conn, &leases)?)).await
    }

    /// Reaps the expired leases `request` selects (see
    /// [`reap_expired_leases`]), in one transaction on the reaper's connection.
    pub(super) async fn reap(
        &self,
        request: ReapRequest<'_>,
        policy: BackoffPolicy,
    ) -> Result<ReapReport, DbError> {
        let retry_delay = move |attempt| policy.jittered_delay(attempt);
        if let Some(result) = self
            .on_own(Role::Reap, async |open| {
                open.statements
                    .reap(&open.client, &request, retry_delay)
                    .await
            })
            .await
        {
            return result;
        }
        let (limit, margin, spare) = (request.limit, request.margin, request.spare.to_vec());
        run_blocking(&self.pool, move |conn| {
            let request = ReapRequest {
                limit,
                margin,
                spare: &spare,
            };
            Ok(reap_expired_leases(conn, &request, retry_delay)?)
        })
        .await
    }

    /// Releases the heads of up to `limit` stranded ordering keys (see
    /// [`advance_stranded_keys`]), on the reaper's connection.
    pub(super) async fn advance_stranded(&self, limit: i64) -> Result<Vec<i64>, DbError> {
        if let Some(result) = self
            .on_own(Role::Reap, async |open| {
                open.statements.advance_stranded(&open.client, limit).await
            })
            .await
        {
            return result;
        }
        run_blocking(&self.pool, move |conn| {
            Ok(advance_stranded_keys(conn, limit)?)
        })
        .await
    }

    /// Runs `statement` on a connection of `role`; `None` when none could be
    /// had (the caller runs it on the pool).
    async fn on_own<T>(
        &self,
        role: Role,
        statement: impl AsyncFnOnce(&Open) -> Result<T, tokio_postgres::Error>,
    ) -> Option<Result<T, DbError>> {
        let slot = self.slot(role);
        let claims = slot < self.claim_slots;
        let kinds = &self.kinds;
        self.own
            .run(
                slot,
                async |client| Open::prepare(client, claims, kinds).await,
                async |open| {
                    open.plan_if_due(kinds).await;
                    statement(open).await
                },
            )
            .await
    }

    fn slot(&self, role: Role) -> usize {
        let reap = self.own.slots() - 1;
        let upkeep = reap - 1;
        let writers = upkeep - self.claim_slots;
        match role {
            Role::Claim => self.next_claim.fetch_add(1, Ordering::Relaxed) % self.claim_slots,
            Role::Write(writer) => self.claim_slots + writer % writers,
            Role::Upkeep => upkeep,
            Role::Reap => reap,
        }
    }
}

impl Open {
    /// `claims`: a claim's connection (see [`Open::planner`]).
    async fn prepare(client: Client, claims: bool, kinds: &[String]) -> Result<Open, DbError> {
        let statements = HotStatements::prepare(&client).await?;
        let planner = if claims {
            let planner = ClaimPlanner::prepare(&client).await?;
            choose_plan(&planner, &client, kinds).await;
            Some(planner)
        } else {
            client.batch_execute(BY_KEY_PLANNING).await?;
            None
        };
        Ok(Open {
            client,
            planner,
            planned: Mutex::new(Instant::now()),
            statements,
            hooks: HookStatements::default(),
        })
    }

    /// A claim's connection chooses its claim's plan again when
    /// [`CHECK_EVERY`] has passed. A failure is the next statement's to
    /// report: the connection is what failed.
    async fn plan_if_due(&self, kinds: &[String]) {
        let Some(planner) = &self.planner else {
            return;
        };
        {
            let mut at = lock(&self.planned);
            if at.elapsed() < CHECK_EVERY {
                return;
            }
            *at = Instant::now();
        }
        choose_plan(planner, &self.client, kinds).await;
    }
}

/// [`ClaimPlanner::choose`] on a claim connection. A failure leaves the
/// settings as they were (PostgreSQL's own, on a new connection): the claim
/// is as correct either way, and reports a broken connection itself.
async fn choose_plan(planner: &ClaimPlanner, client: &Client, kinds: &[String]) {
    match planner.choose(client, kinds).await {
        Ok(plan) => tracing::debug!(?plan, "claim plan chosen"),
        Err(error) => {
            tracing::debug!(error = %DbError::Server(error), "could not choose the claim's plan")
        }
    }
}
