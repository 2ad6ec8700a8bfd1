//! `--growth`: what the relay's costs do as the data grows, each row set
//! against the same measurement on little data, in one run.
//!
//! - The drain rate of the first `--growth-drained` jobs off the top of a
//!   backlog of each `--growth-backlogs` size, in `--repeat` rounds
//!   (`backlog.rs`): a claim takes the front of the claim index, so its
//!   cost must not grow with what waits behind.
//! - Placement through the API with each `--growth-endpoints` count of
//!   webhook endpoints subscribed to `order.placed` (one delivery job each in
//!   the order's transaction up to `FANOUT_INLINE`, one `order_fanout` job
//!   past it), set against the first count, with the cost per endpoint from
//!   a linear fit of the time per order.
//! - Idle enqueue-to-start latency with `--growth-archive` done jobs in
//!   `jobs_done` against an empty archive: the claim never reads the
//!   archive, so the latency must not move.
//!
//! The backlogs and the archive are written by one `INSERT ... SELECT
//! generate_series` each, so a million rows take seconds, not the run. Each
//! backlog is checkpointed before its drain is timed, so that no drain pays
//! for writing back the pages its setup dirtied.

use std::time::Duration;

use anyhow::Context as _;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use serde_json::json;

use super::BenchArgs;
use super::backlog::{self, BacklogDrain};
use super::latency::{self, RecordingRelay};
use super::orders::{self, ApiUnderTest};
use super::percentiles::Latency;
use super::placement::median;
use super::stats::finite;

#[derive(Debug, Clone)]
pub struct Growth {
    pub drains: Vec<BacklogDrain>,
    pub placements: Vec<FanOutPlacement>,
    /// Microseconds per order at no endpoint, and per endpoint more, by a
    /// least-squares line through `placements`; `None` under two points.
    pub fan_out_fit: Option<LinearFit>,
    pub archive: Vec<ArchiveLatency>,
}

/// Placement with `endpoints` endpoints subscribed.
#[derive(Debug, Clone)]
pub struct FanOutPlacement {
    pub endpoints: usize,
    pub orders_per_second: f64,
    pub errors: u64,
    pub latency: Latency,
}

impl FanOutPlacement {
    /// Wall time per order at saturation, across all clients.
    pub fn micros_per_order(&self) -> f64 {
        1e6 / self.orders_per_second.max(f64::MIN_POSITIVE)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct LinearFit {
    pub intercept: f64,
    pub slope: f64,
}

/// y = intercept + slope x through `points`, by least squares.
pub fn linear_fit(points: &[(f64, f64)]) -> Option<LinearFit> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let slope = sxy / sxx;
    Some(LinearFit {
        intercept: mean_y - slope * mean_x,
        slope,
    })
}

/// Idle enqueue-to-start latency with `archived` done jobs in the archive.
#[derive(Debug, Clone)]
pub struct ArchiveLatency {
    pub archived: usize,
    pub latency: Latency,
}

pub async fn measure(url: &str, args: &BenchArgs) -> anyhow::Result<Growth> {
    let drains = backlog::drain_rounds(url, args).await?;
    let mut placements = Vec::new();
    if args.api_clients > 0 {
        for &endpoints in &args.growth_endpoints {
            let placement = place_with_endpoints(url, args, endpoints)
                .await
                .with_context(|| format!("placing orders with {endpoints} endpoints"))?;
            eprintln!(
                "  growth: placement with {endpoints} endpoints: {:.0} orders/s ({:.0} µs per order)",
                placement.orders_per_second,
                placement.micros_per_order()
            );
            placements.push(placement);
        }
    } else {
        eprintln!("  growth: placement rows skipped (--api-clients 0)");
    }
    let fan_out_fit = linear_fit(
        &placements
            .iter()
            .map(|p| (p.endpoints as f64, p.micros_per_order()))
            .collect::<Vec<_>>(),
    );
    let mut archive = Vec::new();
    if args.latency_samples > 0 {
        for archived in [0, args.growth_archive] {
            let latency = latency_with_archive(url, args, archived)
                .await
                .with_context(|| format!("latency with {archived} done jobs archived"))?;
            eprintln!(
                "  growth: idle enqueue-to-start with {archived} done jobs archived: p50 {:.2} ms p99 {:.2} ms",
                latency.p50_ms, latency.p99_ms
            );
            archive.push(ArchiveLatency { archived, latency });
        }
    } else {
        eprintln!("  growth: archive latency rows skipped (--latency-samples 0)");
    }
    latency::reset(url).await?;
    Ok(Growth {
        drains,
        placements,
        fan_out_fit,
        archive,
    })
}

pub(super) async fn blocking<T: Send + 'static>(
    url: &str,
    work: impl FnOnce(&mut PgConnection) -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<T> {
        let mut conn = PgConnection::establish(&url)?;
        work(&mut conn)
    })
    .await?
}

pub(super) fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

async fn place_with_endpoints(
    url: &str,
    args: &BenchArgs,
    endpoints: usize,
) -> anyhow::Result<FanOutPlacement> {
    orders::truncate(url).await?;
    blocking(url, move |conn| {
        diesel::sql_query("DELETE FROM endpoints").execute(conn)?;
        // Never called: no relay runs in these rows, the deliveries queue.
        diesel::sql_query(
            "INSERT INTO endpoints (name, url, event_types, secret, allow_http) \
             SELECT 'bench-' || g, 'http://127.0.0.1:9/hook/' || g, ARRAY['order.placed'], \
                    'whsec_YmVuY2gtZ3Jvd3RoLXNlY3JldA==', true \
             FROM generate_series(1, $1) AS g",
        )
        .bind::<BigInt, _>(count(endpoints))
        .execute(conn)?;
        Ok(())
    })
    .await?;
    let clients = args.api_clients;
    let api = ApiUnderTest::start(
        url,
        clients,
        0,
        Duration::from_secs(30),
        order_service::api::ApiAuth::Keys,
    )
    .await?;
    let client = orders::load_client(clients, api.api_key.as_deref())?;
    let endpoint = api.endpoint();
    orders::load(&client, &endpoint, clients, Duration::from_millis(300)).await;
    orders::truncate(url).await?;
    let run = orders::load(&client, &endpoint, clients, args.api_duration).await;
    api.stop().await?;
    let deliveries: i64 = blocking(url, |conn| {
        #[derive(QueryableByName)]
        struct N {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        // The deliveries written, and those an `order_fanout` job holds to
        // write after commit (no relay runs here).
        let n: N = diesel::sql_query(
            "SELECT (SELECT count(*) FROM jobs WHERE kind = 'order_webhook') \
                  + (SELECT coalesce(sum((run->>1)::bigint - (run->>0)::bigint + 1), 0) \
                     FROM jobs, jsonb_array_elements(payload->'webhook_endpoints') AS run \
                     WHERE kind = 'order_fanout')::bigint AS n",
        )
        .get_result(conn)?;
        Ok(n.n)
    })
    .await?;
    // Each order must have fanned out to every endpoint, or the row
    // measures something else.
    anyhow::ensure!(
        run.ok == 0 || deliveries >= count(endpoints) * i64::try_from(run.ok).unwrap_or(i64::MAX),
        "{} orders placed with {endpoints} endpoints made only {deliveries} delivery jobs",
        run.ok
    );
    orders::truncate(url).await?;
    blocking(url, |conn| {
        diesel::sql_query("DELETE FROM endpoints").execute(conn)?;
        Ok(())
    })
    .await?;
    Ok(FanOutPlacement {
        endpoints,
        orders_per_second: run.rate(),
        errors: run.errors,
        latency: run.latency(),
    })
}

async fn latency_with_archive(
    url: &str,
    args: &BenchArgs,
    archived: usize,
) -> anyhow::Result<Latency> {
    latency::reset(url).await?;
    if archived > 0 {
        blocking(url, move |conn| {
            // Negative ids: never one a real job has.
            diesel::sql_query(
                "INSERT INTO jobs_done (id, kind, payload, status, run_after, attempts, max_attempts, \
                                        created_at, finished_at) \
                 SELECT -g, 'noop', '{}'::jsonb, 'done', now(), 1, 1, now(), now() \
                 FROM generate_series(1, $1) AS g",
            )
            .bind::<BigInt, _>(count(archived))
            .execute(conn)?;
            diesel::sql_query("VACUUM ANALYZE jobs_done").execute(conn)?;
            Ok(())
        })
        .await?;
    }
    let relay = RecordingRelay::start(url, vec!["noop".to_owned()], args).await?;
    let began = latency::take_samples(url, args).await?;
    relay.latency_of(&began).await
}

impl Growth {
    pub fn lines(&self) -> String {
        let mut out = String::from(
            "\ngrowth (each row against the same measurement on little data, in this run):\n",
        );
        if let Some(base) = self.drains.first() {
            for d in &self.drains {
                let ratios = d.ratios_to(base);
                out.push_str(&format!(
                    "  drain of the first {} jobs off a backlog of {:>9}: {:>8.0} jobs/s (median of {}), \
                     {:.2}x the first backlog's (median of the rounds' ratios: {})\n",
                    d.drained,
                    d.backlog,
                    d.jobs_per_second,
                    d.rounds.len(),
                    median(&ratios).unwrap_or(f64::NAN),
                    ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ")
                ));
                out.push_str(&format!("    {}\n", d.buffers.line()));
            }
        }
        let first = self.placements.first().map(|p| p.orders_per_second);
        for p in &self.placements {
            out.push_str(&format!(
                "  placement with {:>5} endpoints subscribed: {:>6.0} orders/s ({} errors), {:>8.0} µs per order, \
                 POST p50 {:.2} ms p99 {:.2} ms, {:.2}x the first count's\n",
                p.endpoints,
                p.orders_per_second,
                p.errors,
                p.micros_per_order(),
                p.latency.p50_ms,
                p.latency.p99_ms,
                p.orders_per_second / first.unwrap_or(1.0).max(f64::MIN_POSITIVE)
            ));
        }
        if let Some(fit) = self.fan_out_fit {
            out.push_str(&format!(
                "  fan-out, linear fit of µs per order: {:.0} µs + {:.2} µs per endpoint\n",
                fit.intercept, fit.slope
            ));
        }
        for a in &self.archive {
            out.push_str(&format!(
                "  idle enqueue-to-start with {:>9} done jobs archived: p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms ({} samples)\n",
                a.archived, a.latency.p50_ms, a.latency.p99_ms, a.latency.max_ms, a.latency.samples
            ));
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "drain": self.drains.iter().map(|d| json!({
                "backlog": d.backlog,
                "drained": d.drained,
                "jobs_per_second": finite(d.jobs_per_second),
                "rounds_jobs_per_second": d.rounds.iter().copied().map(finite).collect::<Vec<_>>(),
                "over_first_backlog": self.drains.first()
                    .and_then(|base| median(&d.ratios_to(base))).and_then(finite),
                "buffers": d.buffers.json(),
            })).collect::<Vec<_>>(),
            "placement": self.placements.iter().map(|p| json!({
                "endpoints": p.endpoints,
                "orders_per_second": finite(p.orders_per_second),
                "errors": p.errors,
                "micros_per_order": finite(p.micros_per_order()),
                "post_ms": { "p50": finite(p.latency.p50_ms), "p99": finite(p.latency.p99_ms) },
            })).collect::<Vec<_>>(),
            "fan_out_fit": self.fan_out_fit.map(|f| json!({
                "micros_per_order_at_zero": finite(f.intercept),
                "micros_per_endpoint": finite(f.slope),
            })),
            "archive_latency": self.archive.iter().map(|a| json!({
                "archived": a.archived,
                "samples": a.latency.samples,
                "p50_ms": finite(a.latency.p50_ms),
                "p99_ms": finite(a.latency.p99_ms),
                "max_ms": finite(a.latency.max_ms),
            })).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_line_and_refuses_too_few_points() {
        let fit = linear_fit(&[(1.0, 12.0), (100.0, 210.0), (1000.0, 2010.0)]).expect("a fit");
        assert!((fit.slope - 2.0).abs() < 1e-9, "{fit:?}");
        assert!((fit.intercept - 10.0).abs() < 1e-6, "{fit:?}");
        assert!(linear_fit(&[(1.0, 2.0)]).is_none());
        assert!(linear_fit(&[(5.0, 2.0), (5.0, 3.0)]).is_none());
    }
}
