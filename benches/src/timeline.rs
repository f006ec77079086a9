//! `memres replay --timeline FILE`: bytes live, bytes held from the upstream
//! and the largest free block against the operation index, one chart per
//! (workload, resource), the peak of held bytes marked and the op that made
//! it named. The file's extension picks the form: `.svg` (the charts),
//! `.html` or `.htm` (the charts inline and a table of peaks: one self-contained file)
//! or `.csv` (the numbers). The charts are drawn by `plotters`.

use crate::observe::Observation;
use crate::report::{csv_field, human_bytes, text_name};
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;

#[cfg(test)]
mod tests;

/// One chart: a resource's watched replay of a workload.
#[derive(Clone, Copy, Debug)]
pub struct Chart<'a> {
    /// The row's name.
    pub resource: &'a str,
    /// The workload's name.
    pub workload: &'a str,
    /// What the replay saw.
    pub observation: &'a Observation,
    /// The workload's time of each op, in microseconds, where the trace
    /// has times ([`crate::workload::Workload::times`]).
    pub times: Option<&'a [u64]>,
}

/// Width and height of one chart, in pixels.
pub const CHART: (u32, u32) = (960, 320);

/// The form of a timeline file, named by its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `.html` or `.htm`: [`html`].
    Html,
    /// `.svg`: [`svg`].
    Svg,
    /// `.csv`: [`csv`].
    Csv,
}

impl Form {
    /// The form `path`'s extension names, in either case (`T.HTML` too).
    ///
    /// # Errors
    ///
    /// The message to print for any other extension, or none.
    pub fn of(path: &Path) -> Result<Form, String> {
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("html" | "htm") => Ok(Form::Html),
            Some("svg") => Ok(Form::Svg),
            Some("csv") => Ok(Form::Csv),
            // `.html` alone is a hidden file's name, with no extension.
            None if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                matches!(n.to_ascii_lowercase().as_str(), ".html" | ".htm" | ".svg" | ".csv")
            }) =>
            {
                Err(format!(
                    "--timeline {}: the file needs a name before its extension (.html, .htm, .svg or .csv)",
                    path.display()
                ))
            }
            _ => Err(format!(
                "--timeline {}: the file must end in .html (or .htm), .svg or .csv",
                path.display()
            )),
        }
    }
}

/// Writes the timeline of `charts` to `path`, in the [`Form`] its
/// extension names.
///
/// # Errors
///
/// An extension [`Form::of`] refuses, a chart that cannot be drawn, or the
/// file's I/O error.
pub fn write(path: &Path, charts: &[Chart<'_>]) -> Result<(), String> {
    let text = match Form::of(path)? {
        Form::Csv => csv(charts),
        Form::Svg => svg(charts)?,
        Form::Html => html(charts)?,
    };
    // Whole, as a snapshot: a browser open on the file never reads part of
    // it, and a failure leaves the file as it was.
    memres_core::snapshot::write_file(path, text.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The samples as CSV: one line per (workload, resource, sample).
pub fn csv(charts: &[Chart<'_>]) -> String {
    let mut out = String::from("workload,resource,op,time_us,live_bytes,held_bytes,largest_free_bytes\n");
    for c in charts {
        for s in &c.observation.samples {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{}",
                csv_field(c.workload),
                csv_field(c.resource),
                s.op,
                s.time_us.map_or(String::new(), |t| t.to_string()),
                s.live,
                s.held,
                s.largest_free
            );
        }
    }
    out
}

/// What the chart says of its peak (and of a failed op).
pub fn peak_label(o: &Observation) -> String {
    let mut label = match o.peak {
        Some(p) => format!(
            "peak {} held ({} live) after op {}: {} of {} (id {})",
            human_bytes(p.held),
            human_bytes(p.live),
            p.op,
            if p.alloc { "allocation" } else { "free" },
            human_bytes(p.size),
            p.id
        ),
        None => "nothing held".to_string(),
    };
    if let Some(f) = &o.failure {
        let _ = write!(label, "; op {} ({}) failed: {}", f.op, human_bytes(f.size), f.error);
    }
    label
}

/// The unit the axis counts in, for values up to `max` bytes.
fn unit(max: u64) -> (&'static str, f64) {
    match max {
        m if m >= 1 << 30 => ("GiB", (1u64 << 30) as f64),
        m if m >= 1 << 20 => ("MiB", (1u64 << 20) as f64),
        m if m >= 1 << 10 => ("KiB", 1024.0),
        _ => ("bytes", 1.0),
    }
}

/// The charts, one above the other, as one SVG document.
///
/// # Errors
///
/// What plotters says when it cannot draw.
pub fn svg(charts: &[Chart<'_>]) -> Result<String, String> {
    let mut out = String::new();
    let height = CHART.1 * charts.len().max(1) as u32;
    {
        let root = SVGBackend::with_string(&mut out, (CHART.0, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        for (area, c) in root.split_evenly((charts.len().max(1), 1)).iter().zip(charts) {
            draw(area, c).map_err(|e| format!("cannot draw {} on {}: {e}", c.resource, c.workload))?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// The label of the x-axis tick at op `op`: the op, and where the trace
/// has times, op `op`'s time since op 0's.
///
/// Read from the workload's times, not from the samples: a sample's time
/// is its bucket's last op's, up to a bucket's worth of ops after the
/// tick's (and the first sample's is not op 0's).
pub fn tick_label(c: &Chart<'_>, op: u64) -> String {
    let times = c.times.unwrap_or_default();
    let at = usize::try_from(op).ok().and_then(|i| times.get(i));
    match (times.first(), at) {
        (Some(start), Some(t)) => format!("{op} ({:.2} s)", t.saturating_sub(*start) as f64 / 1e6),
        // Past the last op (the axis's end) there is no op to time.
        _ => op.to_string(),
    }
}

/// Reads one series' value from a sample.
type Value = fn(&crate::observe::Sample) -> u64;

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw(area: &Area<'_>, c: &Chart<'_>) -> Result<(), Box<dyn std::error::Error>> {
    let o = c.observation;
    let xmax = o.samples.last().map_or(1, |s| s.op + 1);
    let ymax = o.samples.iter().map(|s| s.held.max(s.live)).max().unwrap_or(0).max(1);
    let (unit, div) = unit(ymax);
    let y = |b: u64| b as f64 / div;
    // XML allows no control character (a trace's file name may hold one):
    // written as the text table writes it.
    let caption = format!("{} on {}", text_name(c.resource), text_name(c.workload));
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        // Headroom above the data for the legend, so that it hides no line.
        .build_cartesian_2d(0u64..xmax, 0f64..y(ymax) * 1.4)?;
    let timed = c.times.is_some_and(|t| !t.is_empty());
    let at = |op: &u64| tick_label(c, *op);
    let x_desc = if timed { "operation (trace time)" } else { "operation" };
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(unit)
        .x_label_formatter(&at)
        .x_labels(if timed { 6 } else { 10 })
        .light_line_style(WHITE)
        .draw()?;
    let series: [(&str, RGBColor, Value); 3] = [
        ("held from upstream", BLUE, |s| s.held),
        ("live", RED, |s| s.live),
        ("largest free block", RGBColor(0, 140, 0), |s| s.largest_free),
    ];
    for (name, color, value) in series {
        chart
            .draw_series(LineSeries::new(
                o.samples.iter().map(|s| (s.op, y(value(s)))),
                color.stroke_width(2),
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    if let Some(p) = o.peak {
        chart.draw_series(std::iter::once(Circle::new((p.op, y(p.held)), 5, BLACK.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    area.draw(&Text::new(text_name(&peak_label(o)), (80, CHART.1 as i32 - 14), ("sans-serif", 13)))?;
    Ok(())
}

/// `s` for a table cell: its control characters written as [`text_name`]
/// writes them, then HTML's special characters escaped.
fn escape(s: &str) -> String {
    text_name(s).replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// One self-contained page: a table of peaks and the SVG inline (nothing
/// fetched from the network).
///
/// # Errors
///
/// As [`svg`].
pub fn html(charts: &[Chart<'_>]) -> Result<String, String> {
    let mut rows = String::new();
    for c in charts {
        let _ = writeln!(
            rows,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(c.workload),
            escape(c.resource),
            escape(&peak_label(c.observation))
        );
    }
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>memres timeline</title>\n\
         <style>body{{font-family:sans-serif;margin:1em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:2px 6px;text-align:left}}</style></head><body>\n\
         <h1>memres replay timeline</h1>\n\
         <p>Per resource over the same workload: bytes <b>held</b> from the upstream (blue), bytes \
         <b>live</b> as requested (red) and the <b>largest free block</b> inside what is held (green), \
         against the operation index. The dot marks the peak of held bytes; the line under each chart \
         names the operation that made it.</p>\n\
         <table><tr><th>workload</th><th>resource</th><th>peak</th></tr>\n{rows}</table>\n{}\n</body></html>\n",
        svg(charts)?
    ))
}
