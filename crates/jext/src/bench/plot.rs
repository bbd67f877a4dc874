//! Draws the papers' kinds of figures from a run's samples, each as SVG and PNG: a bar
//! chart per experiment of every system's headline figure against ext4 data=ordered (one
//! panel per variant), and for the latency experiments the latency CDF of every system.
//!
//! Promises: a chart shows only runs that completed (a failed system is marked "failed",
//! never drawn as zero); ratios are the report's own (`report::headlines`), so pictures and
//! tables never disagree. Must never stop the harness: errors (no font) are returned and the
//! command reports them after the tables are already written.

use super::experiments::Measured;
use super::report::{self, Headline, Metric};
use super::stats::cdf_us;
use super::systems::System;
use super::{Experiment, Sample, Variant};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

type DrawResult = Result<(), Box<dyn Error>>;

/// Where a sans-serif TrueType font is looked for (Debian's fonts-dejavu-core first).
const FONT_CANDIDATES: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Quantiles of each system's CDF line.
const CDF_POINTS: usize = 200;

/// Pixels of one bar (and its gap) in a ratio chart.
const BAR_ROW_PX: u32 = 24;

/// One picture, drawn the same on every backend.
enum Figure<'a> {
    /// One bar per system and a panel per variant: its headline figure against ext4's.
    Ratio {
        title: String,
        metric: Metric,
        panels: &'a [(Variant, Vec<Headline>)],
    },
    /// One line per system and a panel per variant: the fraction of fsyncs done within x µs.
    Cdf {
        title: String,
        panels: &'a [CdfPanel],
    },
}

/// The latency CDF lines of one variant: per system, quantiles in µs.
struct CdfPanel {
    variant: Variant,
    lines: Vec<(System, Vec<f64>)>,
}

/// Draws every chart the samples allow into `dir`; returns the files written.
pub fn draw(
    samples: &[Sample],
    experiments: &[Experiment],
    dir: &Path,
) -> Result<Vec<PathBuf>, String> {
    load_font()?;
    let mut written = Vec::new();
    for &experiment in experiments {
        let Some(metric) = report::metric(experiment) else {
            continue;
        };
        let panels = report::headlines(samples, experiment);
        let name = experiment.name();
        // Systems on the simulator alone have nothing to put beside ext4.
        if panels
            .iter()
            .flat_map(|(_, bars)| bars)
            .any(|b| b.vs_ext4.is_some())
        {
            let title = format!("{name}: {} vs ext4 data=ordered", metric.unit);
            let size = grid_size(
                panels.len(),
                (760, 90 + BAR_ROW_PX * panels[0].1.len() as u32),
            );
            let ratio = Figure::Ratio {
                title,
                metric,
                panels: &panels,
            };
            written.extend(both_formats(dir, &format!("{name}-ratio"), size, &ratio)?);
        }
        if matches!(experiment, Experiment::FsyncLatency | Experiment::FsyncTail) {
            let panels = latency_panels(samples, experiment);
            let cdf = Figure::Cdf {
                title: format!("{name}: fsync latency CDF"),
                panels: &panels,
            };
            let size = grid_size(panels.len(), (760, 560));
            written.extend(both_formats(dir, &format!("{name}-cdf"), size, &cdf)?);
        }
    }
    Ok(written)
}

/// Every system's latency quantiles per variant, all repetitions pooled.
fn latency_panels(samples: &[Sample], experiment: Experiment) -> Vec<CdfPanel> {
    report::variants_of(samples, experiment)
        .into_iter()
        .map(|variant| {
            let mut pooled: Vec<(System, Vec<u64>)> = Vec::new();
            for s in samples
                .iter()
                .filter(|s| s.experiment == experiment && s.variant == variant)
            {
                let Ok(Measured::Latency { latencies_ns, .. }) = &s.outcome else {
                    continue;
                };
                match pooled.iter_mut().find(|(system, _)| *system == s.system) {
                    Some((_, all)) => all.extend_from_slice(latencies_ns),
                    None => pooled.push((s.system.clone(), latencies_ns.clone())),
                }
            }
            let lines = pooled
                .into_iter()
                .map(|(system, ns)| (system, cdf_us(&ns, CDF_POINTS)))
                .collect();
            CdfPanel { variant, lines }
        })
        .filter(|panel| !panel.lines.is_empty())
        .collect()
}

/// Rows and columns of a figure of `panels` panels: two columns, as many rows as needed.
fn grid(panels: usize) -> (usize, usize) {
    (panels.div_ceil(2).max(1), panels.clamp(1, 2))
}

/// The pixel size of a figure of `panels` panels of `panel` pixels each.
fn grid_size(panels: usize, panel: (u32, u32)) -> (u32, u32) {
    let (rows, columns) = grid(panels);
    (panel.0 * columns as u32, panel.1 * rows as u32)
}

/// Registers a sans-serif font with plotters once per process.
fn load_font() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let path = FONT_CANDIDATES
                .iter()
                .find(|p| Path::new(p).exists())
                .ok_or_else(|| {
                    format!(
                        "no font for the plots: none of {} exists (install fonts-dejavu-core)",
                        FONT_CANDIDATES.join(", ")
                    )
                })?;
            let bytes = std::fs::read(path).map_err(|e| format!("reading font {path}: {e}"))?;
            // plotters keeps fonts for the life of the process; this one is loaded once.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("font {path} is not a TrueType font plotters can read"))
        })
        .clone()
}

/// Draws one figure twice, as `NAME.svg` and `NAME.png` in `dir`.
fn both_formats(
    dir: &Path,
    name: &str,
    size: (u32, u32),
    figure: &Figure,
) -> Result<Vec<PathBuf>, String> {
    let svg = dir.join(format!("{name}.svg"));
    let png = dir.join(format!("{name}.png"));
    let failed = |path: &Path, e: Box<dyn Error>| format!("drawing {}: {e}", path.display());
    render(SVGBackend::new(&svg, size).into_drawing_area(), figure).map_err(|e| failed(&svg, e))?;
    render(BitMapBackend::new(&png, size).into_drawing_area(), figure)
        .map_err(|e| failed(&png, e))?;
    Ok(vec![svg, png])
}

fn render<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, figure: &Figure) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let (title, count) = match figure {
        Figure::Ratio { title, panels, .. } => (title, panels.len()),
        Figure::Cdf { title, panels } => (title, panels.len()),
    };
    let body = root.titled(title, ("sans-serif", 26))?;
    let cells = body.split_evenly(grid(count));
    for (i, cell) in cells.iter().enumerate().take(count) {
        match figure {
            Figure::Ratio { metric, panels, .. } => {
                let (variant, bars) = &panels[i];
                ratio_panel(cell, *variant, metric, bars)?;
            }
            Figure::Cdf { panels, .. } => cdf_panel(cell, &panels[i])?,
        }
    }
    root.present()?;
    Ok(())
}

/// A panel's caption: `text`, after the variant's label when the experiment has variants.
fn captioned(variant: Variant, text: &str) -> String {
    match variant.label() {
        l if l.is_empty() => text.to_string(),
        l => format!("{l}: {text}"),
    }
}

/// A bar's colour says whose it is: jext blue, ext4 orange, the rest grey and green.
fn colour(system: &System) -> RGBColor {
    match system {
        System::Jext { .. } | System::JextPercore { .. } => RGBColor(31, 119, 180),
        System::JextFuse { .. } | System::JextMount { .. } => RGBColor(120, 180, 230),
        System::Ext4 { .. } => RGBColor(255, 127, 14),
        System::Fuse2fs => RGBColor(44, 160, 44),
        System::RawFile | System::RawLoop => RGBColor(127, 127, 127),
        System::Block(_) => RGBColor(148, 103, 189),
    }
}

/// Horizontal bars, first system on top, a dashed line at 1 (ext4 data=ordered itself).
fn ratio_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    variant: Variant,
    metric: &Metric,
    bars: &[Headline],
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let n = bars.len() as i32;
    let widest = bars.iter().filter_map(|b| b.vs_ext4).fold(1.0, f64::max);
    let better = if metric.higher_is_better {
        "higher is better"
    } else {
        "lower is better"
    };
    let caption = captioned(variant, &format!("× ext4 data=ordered ({better})"));
    // Row k (from the top) sits in segment n - 1 - k.
    let row = |k: usize| n - 1 - k as i32;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 17))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(270)
        .build_cartesian_2d(0.0..widest * 1.22, (0..n).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(bars.len())
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) if (0..n).contains(i) => {
                bars[(n - 1 - i) as usize].system.name()
            }
            _ => String::new(),
        })
        .label_style(("sans-serif", 13))
        .draw()?;
    chart.draw_series(bars.iter().enumerate().filter_map(|(k, bar)| {
        let r = bar.vs_ext4?;
        let mut rect = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(row(k))),
                (r, SegmentValue::Exact(row(k) + 1)),
            ],
            colour(&bar.system).filled(),
        );
        rect.set_margin(3, 3, 0, 0);
        Some(rect)
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(k, bar)| {
        let text = match (bar.vs_ext4, bar.value) {
            (Some(r), Some(v)) => format!("{r:.2}× ({v:.0})"),
            (None, Some(v)) => format!("{v:.0}"),
            (_, None) => "failed".to_string(),
        };
        let x = bar.vs_ext4.unwrap_or(0.0) + widest * 0.01;
        Text::new(
            text,
            (x, SegmentValue::CenterOf(row(k))),
            ("sans-serif", 12),
        )
    }))?;
    chart.draw_series(DashedLineSeries::new(
        [(1.0, SegmentValue::Exact(0)), (1.0, SegmentValue::Exact(n))],
        4,
        3,
        BLACK.stroke_width(1),
    ))?;
    Ok(())
}

/// One line per system on a logarithmic latency axis.
fn cdf_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, panel: &CdfPanel) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let all = || panel.lines.iter().flat_map(|(_, q)| q.iter().copied());
    let low = all().filter(|&us| us > 0.0).fold(f64::INFINITY, f64::min);
    let high = all().fold(0.0, f64::max);
    if !low.is_finite() || high <= 0.0 {
        return Ok(());
    }
    let caption = captioned(panel.variant, "fraction of fsyncs done within x µs");
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 17))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(44)
        .build_cartesian_2d((low * 0.9..high * 1.1).log_scale(), 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("µs")
        .x_labels(8)
        .x_label_formatter(&|us| format!("{us:.0}"))
        .label_style(("sans-serif", 13))
        .draw()?;
    let points = |q: &[f64]| -> Vec<(f64, f64)> {
        let count = q.len() as f64;
        q.iter()
            .enumerate()
            .map(|(i, &us)| (us.max(low), (i + 1) as f64 / count))
            .collect()
    };
    for (i, (system, quantiles)) in panel.lines.iter().enumerate() {
        let style = Palette99::pick(i).stroke_width(2);
        chart
            .draw_series(LineSeries::new(points(quantiles), style))?
            .label(system.name())
            .legend(move |(x, y)| {
                PathElement::new(
                    vec![(x, y), (x + 18, y)],
                    Palette99::pick(i).stroke_width(2),
                )
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 12))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::EXT4_ORDERED;
    use jext::{CommitMode, DataMode};

    fn sample(system: System, outcome: Result<Measured, String>) -> Sample {
        Sample {
            experiment: Experiment::FsyncLatency,
            variant: Variant::Only,
            system,
            repetition: 0,
            outcome,
        }
    }

    fn latencies(us: u64) -> Result<Measured, String> {
        Ok(Measured::Latency {
            latencies_ns: (1..=100).map(|i| us * 1000 + i).collect(),
            io: None,
            background_mib_per_s: None,
        })
    }

    #[test]
    fn charts_show_ratios_and_name_a_failed_system() {
        if load_font().is_err() {
            eprintln!("skipping: no DejaVu font (scripts/setup installs fonts-dejavu-core)");
            return;
        }
        let jext = System::Jext {
            mode: DataMode::Ordered,
            backing: super::super::systems::Backing::Loop,
            fast_commit: true,
            commit: CommitMode::SingleIo,
            records: jext_journal::RecordMode::Bytes,
            small_syncs: jext::SmallSyncs::Journal,
        };
        let samples = [
            sample(EXT4_ORDERED, latencies(800)),
            sample(jext, latencies(1000)),
            sample(System::Fuse2fs, Err("mount refused".into())),
        ];
        let dir = std::env::temp_dir().join(format!("jext-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = draw(&samples, &[Experiment::FsyncLatency], &dir).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "fsync-latency-ratio.svg",
                "fsync-latency-ratio.png",
                "fsync-latency-cdf.svg",
                "fsync-latency-cdf.png"
            ]
        );
        let ratio = std::fs::read_to_string(&files[0]).unwrap();
        // 1000.05 µs / 800.05 µs, printed as the report prints it.
        for text in [
            "1.25×",
            "1.00×",
            "failed",
            "jext data=ordered (loop)",
            "lower is better",
        ] {
            assert!(ratio.contains(text), "{text} missing from the ratio chart");
        }
        let cdf = std::fs::read_to_string(&files[2]).unwrap();
        assert!(cdf.contains("ext4 data=ordered") && !cdf.contains("fuse2fs"));
        let png = std::fs::read(&files[1]).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
