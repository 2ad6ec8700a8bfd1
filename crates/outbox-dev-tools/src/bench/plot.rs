//! `--plot PATH`: an SVG of the growth rows and of the open-loop runs' p99,
//! four panels, each with its title and axes in units; a panel whose rows
//! did not run says so instead of drawing an empty frame.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::BenchReport;

const SIZE: (u32, u32) = (1400, 1000);
const TITLE_FONT: (&str, u32) = ("sans-serif", 26);
const CAPTION_FONT: (&str, u32) = ("sans-serif", 19);
const LABEL_FONT: (&str, u32) = ("sans-serif", 15);
/// Colours that stay apart when printed in grey.
const SERIES: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// One named line of points.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    /// Drawn dashed-looking (points only at the ends): a fit, not data.
    fitted: bool,
}

struct Panel<'a> {
    caption: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    series: Vec<Series>,
    missing: &'a str,
}

pub fn write(path: &Path, report: &BenchReport) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!(
            "outbox-relay bench: growth and open-loop repeats (concurrency {}, batch {})",
            report.concurrency, report.batch
        ),
        TITLE_FONT,
    )?;
    let areas = root.split_evenly((2, 2));
    for (area, panel) in areas.iter().zip(panels(report)) {
        draw(area, &panel)?;
    }
    root.present()?;
    Ok(())
}

fn panels(report: &BenchReport) -> Vec<Panel<'static>> {
    let growth = report.growth.as_ref();
    let drain = Series {
        name: "relay, noop jobs".to_owned(),
        points: growth
            .map(|g| {
                g.drains
                    .iter()
                    .map(|d| (d.backlog as f64, d.jobs_per_second))
                    .collect()
            })
            .unwrap_or_default(),
        fitted: false,
    };
    let placements: Vec<(f64, f64)> = growth
        .map(|g| {
            g.placements
                .iter()
                .map(|p| (p.endpoints as f64, p.micros_per_order()))
                .collect()
        })
        .unwrap_or_default();
    let mut fan_out = vec![Series {
        name: "measured".to_owned(),
        points: placements.clone(),
        fitted: false,
    }];
    if let Some(fit) = growth.and_then(|g| g.fan_out_fit) {
        let xs = placements.iter().map(|p| p.0);
        let (lo, hi) = (
            xs.clone().fold(f64::INFINITY, f64::min),
            xs.fold(0.0, f64::max),
        );
        fan_out.push(Series {
            name: format!(
                "linear fit: {:.0} µs + {:.2} µs per endpoint",
                fit.intercept, fit.slope
            ),
            points: vec![
                (lo, fit.intercept + fit.slope * lo),
                (hi, fit.intercept + fit.slope * hi),
            ],
            fitted: true,
        });
    }
    let archive = |pick: fn(&super::percentiles::Latency) -> f64, name: &str| Series {
        name: name.to_owned(),
        points: growth
            .map(|g| {
                g.archive
                    .iter()
                    .map(|a| (a.archived as f64, pick(&a.latency)))
                    .collect()
            })
            .unwrap_or_default(),
        fitted: false,
    };
    let mut repeats: Vec<Series> = Vec::new();
    for run in &report.open_loop {
        let name = format!("open loop at {}", run.requested);
        let point = (run.round as f64, run.enqueue_to_start.p99_ms);
        match repeats.iter_mut().find(|s| s.name == name) {
            Some(series) => series.points.push(point),
            None => repeats.push(Series {
                name,
                points: vec![point],
                fitted: false,
            }),
        }
    }
    vec![
        Panel {
            caption: "Drain rate off the top of a backlog",
            x_label: "pending jobs behind the drain",
            y_label: "jobs drained per second",
            series: vec![drain],
            missing: "not measured in this run (--growth)",
        },
        Panel {
            caption: "Order placement with endpoints subscribed",
            x_label: "endpoints subscribed to order.placed",
            y_label: "wall time per order at saturation (µs)",
            series: fan_out,
            missing: "not measured in this run (--growth, --api-clients above 0)",
        },
        Panel {
            caption: "Idle enqueue-to-start with done jobs archived",
            x_label: "done jobs in jobs_done",
            y_label: "enqueue-to-start (ms)",
            series: vec![archive(|l| l.p50_ms, "p50"), archive(|l| l.p99_ms, "p99")],
            missing: "not measured in this run (--growth, --latency-samples above 0)",
        },
        Panel {
            caption: "Open-loop enqueue-to-start p99, run by run",
            x_label: "run (--repeat)",
            y_label: "enqueue-to-start p99 (ms)",
            series: repeats,
            missing: "no open-loop run in this run (--arrival-rate)",
        },
    ]
}

fn draw(area: &DrawingArea<SVGBackend<'_>, Shift>, panel: &Panel<'_>) -> anyhow::Result<()> {
    let points: Vec<(f64, f64)> = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    if points.is_empty() {
        let (w, h) = area.dim_in_pixel();
        area.draw(&Text::new(
            panel.caption.to_owned(),
            (20, 20),
            CAPTION_FONT.into_font(),
        ))?;
        area.draw(&Text::new(
            panel.missing.to_owned(),
            (
                i32::try_from(w / 8).unwrap_or(0),
                i32::try_from(h / 2).unwrap_or(0),
            ),
            LABEL_FONT.into_font(),
        ))?;
        return Ok(());
    }
    let x_max = points.iter().map(|p| p.0).fold(0.0, f64::max);
    let y_max = points.iter().map(|p| p.1).fold(0.0, f64::max);
    // From zero, so that a flat line reads as flat and a ratio as a ratio;
    // headroom above the highest point for the legend.
    let x_range = 0.0..(x_max * 1.05).max(1.0);
    let y_range = 0.0..(y_max * 1.3).max(f64::MIN_POSITIVE);
    let mut chart = ChartBuilder::on(area)
        .caption(panel.caption, CAPTION_FONT)
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(x_range, y_range)?;
    chart
        .configure_mesh()
        .x_desc(panel.x_label)
        .y_desc(panel.y_label)
        .label_style(LABEL_FONT)
        .axis_desc_style(LABEL_FONT)
        .x_label_formatter(&|x| thousands(*x))
        .y_label_formatter(&|y| thousands(*y))
        .draw()?;
    for (i, series) in panel.series.iter().enumerate() {
        let colour = SERIES[i % SERIES.len()];
        let finite: Vec<(f64, f64)> = series
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        let style = if series.fitted {
            colour.stroke_width(1)
        } else {
            colour.stroke_width(2)
        };
        chart
            .draw_series(LineSeries::new(finite.clone(), style))?
            .label(series.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        if !series.fitted {
            chart.draw_series(
                finite
                    .iter()
                    .map(|&point| Circle::new(point, 4, colour.filled())),
            )?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(LABEL_FONT)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// 1234567.8 as "1,234,568"; a fraction below 10 with two decimals.
fn thousands(x: f64) -> String {
    if x.abs() < 10.0 && x.fract() != 0.0 {
        return format!("{x:.2}");
    }
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0.0 { format!("-{out}") } else { out }
}

#[cfg(test)]
mod tests {
    use super::thousands;

    #[test]
    fn axis_numbers_read_with_separators() {
        assert_eq!(thousands(1_000_000.0), "1,000,000");
        assert_eq!(thousands(50_000.0), "50,000");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(2.5), "2.50");
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(5.0), "5");
        assert_eq!(thousands(-12_345.0), "-12,345");
    }
}
