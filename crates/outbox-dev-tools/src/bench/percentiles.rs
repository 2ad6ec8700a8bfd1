//! Latency percentiles of a run's samples: what every measuring file of the
//! bench reports, and the report prints.

/// Nearest-rank percentiles, in milliseconds.
#[derive(Debug, Clone)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn from_sorted_micros(sorted: &[u64]) -> Latency {
        let pick = |q: f64| -> f64 {
            if sorted.is_empty() {
                return f64::NAN;
            }
            // Nearest rank.
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            sorted[rank - 1] as f64 / 1000.0
        };
        Latency {
            samples: sorted.len(),
            p50_ms: pick(0.50),
            p95_ms: pick(0.95),
            p99_ms: pick(0.99),
            max_ms: pick(1.0),
        }
    }
}
