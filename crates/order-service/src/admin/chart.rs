//! The overview's chart, drawn on the server as SVG: jobs done and jobs failed
//! per minute over the last hour. No script, no chart library, and it prints.

use chrono::{DateTime, Duration, DurationRound as _, Utc};

use super::queries::MinuteCount;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 200.0;
const LEFT: f64 = 48.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 28.0;
const MINUTES: i64 = 60;

/// An SVG of `minutes` (missing minutes count zero), ending at `now`. Every
/// value written into the markup is a number or a fixed label, so nothing
/// needs escaping. The chart carries a text alternative for screen readers.
pub(super) fn throughput_svg(minutes: &[MinuteCount], now: DateTime<Utc>) -> String {
    let end = now.duration_trunc(Duration::minutes(1)).unwrap_or(now);
    let start = end - Duration::minutes(MINUTES - 1);
    let mut done = vec![0_i64; MINUTES as usize];
    let mut failed = vec![0_i64; MINUTES as usize];
    for m in minutes {
        let index = (m.minute - start).num_minutes();
        if let Ok(i) = usize::try_from(index)
            && i < done.len()
        {
            done[i] += m.done;
            failed[i] += m.failed;
        }
    }
    let total_done: i64 = done.iter().sum();
    let total_failed: i64 = failed.iter().sum();
    let peak = done
        .iter()
        .chain(&failed)
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let scale = nice_ceiling(peak);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |i: usize| LEFT + plot_w * (i as f64) / ((MINUTES - 1) as f64);
    let y = |v: i64| TOP + plot_h * (1.0 - (v as f64) / (scale as f64));
    let line = |values: &[i64]| {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut svg = String::with_capacity(4096);
    svg.push_str(&format!(
        "<svg class=\"chart\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" \
         aria-labelledby=\"chart-title chart-desc\">\
         <title id=\"chart-title\">Jobs finished per minute, last hour</title>\
         <desc id=\"chart-desc\">{total_done} done and {total_failed} failed in the last 60 minutes; \
         the busiest minute had {peak} jobs.</desc>"
    ));
    for step in 0..=4 {
        let v = scale * step / 4;
        let gy = y(v);
        svg.push_str(&format!(
            "<line class=\"grid\" x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{gy:.1}\" y2=\"{gy:.1}\"/>\
             <text class=\"axis\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v}</text>",
            WIDTH - RIGHT,
            LEFT - 6.0,
            gy + 4.0
        ));
    }
    for (i, label) in [
        (0, "-60m"),
        (15, "-45m"),
        (30, "-30m"),
        (45, "-15m"),
        (59, "now"),
    ] {
        let anchor = if i == 59 { "end" } else { "middle" };
        svg.push_str(&format!(
            "<text class=\"axis\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"{anchor}\">{label}</text>",
            x(i),
            HEIGHT - 8.0
        ));
    }
    svg.push_str(&format!(
        "<polyline class=\"done\" points=\"{}\"/><polyline class=\"failed\" points=\"{}\"/></svg>",
        line(&done),
        line(&failed)
    ));
    svg
}

/// The smallest of 1, 2, 5 times a power of ten that is at least `n`.
fn nice_ceiling(n: i64) -> i64 {
    let mut base = 1_i64;
    loop {
        for m in [1, 2, 5] {
            if let Some(v) = base.checked_mul(m)
                && v >= n
            {
                return v;
            }
        }
        match base.checked_mul(10) {
            Some(next) => base = next,
            None => return n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_rounds_up_to_a_readable_number() {
        assert_eq!(nice_ceiling(1), 1);
        assert_eq!(nice_ceiling(3), 5);
        assert_eq!(nice_ceiling(17), 20);
        assert_eq!(nice_ceiling(501), 1000);
    }

    #[test]
    fn the_chart_places_each_minute_and_describes_itself() {
        let now = Utc::now();
        let minute = now.duration_trunc(Duration::minutes(1)).expect("trunc");
        let svg = throughput_svg(
            &[MinuteCount {
                minute,
                done: 7,
                failed: 2,
            }],
            now,
        );
        assert!(svg.contains("7 done and 2 failed"), "{svg}");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    }
}
