//! Enqueue-to-start latency: jobs enqueued one at a time, each in its own
//! transaction, against an idle relay; measured from the enqueue's commit
//! returning to the effect starting, both on this process's monotonic clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use tokio_util::sync::CancellationToken;

use super::BenchArgs;
use super::report::Latency;
use crate::effects::{BoxFuture, EffectResult, Executor};
use crate::outbox::{ClaimedJob, NewJob, enqueue};
use crate::relay::{Relay, RelaySettings};

/// Notes when each job's effect started.
struct StartRecorder {
    starts: Arc<Mutex<HashMap<i64, Instant>>>,
}

impl Executor for StartRecorder {
    fn execute<'a>(&'a self, job: &'a ClaimedJob) -> BoxFuture<'a, EffectResult> {
        let now = Instant::now();
        self.starts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(job.id, now);
        Box::pin(std::future::ready(Ok(None)))
    }
}

pub async fn measure(url: &str, args: &BenchArgs) -> anyhow::Result<Latency> {
    let mut conn = PgConnection::establish(url)?;
    diesel::sql_query("TRUNCATE jobs").execute(&mut conn)?;

    let starts: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let settings = RelaySettings::new("bench-latency", vec!["noop".to_owned()]);
    let pool = crate::db::build_pool(
        url,
        u32::try_from(settings.concurrency + 4).unwrap_or(20),
        false,
    );
    let relay = Relay::new(
        pool,
        url,
        settings,
        Arc::new(StartRecorder {
            starts: Arc::clone(&starts),
        }),
    )?;
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay.run_until_stopped(stop.clone()));
    // Idle: listener connected, first empty claim done.
    tokio::time::sleep(Duration::from_millis(1000)).await;

    let samples = args.latency_samples;
    let interval = args.latency_interval;
    let url = url.to_owned();
    let committed = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<(i64, Instant)>> {
        let mut conn = PgConnection::establish(&url)?;
        let progress = indicatif::ProgressBar::new(samples as u64);
        let mut committed = Vec::with_capacity(samples);
        for i in 0..samples {
            let id = conn.transaction(|conn| {
                enqueue(
                    conn,
                    &NewJob::new("noop", serde_json::json!({ "sample": i })),
                )
            })?;
            committed.push((id, Instant::now()));
            progress.inc(1);
            std::thread::sleep(interval);
        }
        progress.finish_and_clear();
        Ok(committed)
    })
    .await??;

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = starts.lock().unwrap_or_else(|e| e.into_inner()).len();
        if seen >= committed.len() {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {seen} of {} latency samples started",
            committed.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    running.await??;

    let starts = starts.lock().unwrap_or_else(|e| e.into_inner());
    let mut micros: Vec<u64> = committed
        .iter()
        .filter_map(|(id, at)| starts.get(id).map(|s| s.saturating_duration_since(*at)))
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .collect();
    micros.sort_unstable();
    Ok(Latency::from_sorted_micros(&micros))
}
