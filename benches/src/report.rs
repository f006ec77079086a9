//! The rows the replay tool prints: a table for people, JSON lines or CSV
//! for scripts.

use crate::replay::Measurement;
use crate::resources::UpstreamKind;
use std::fmt::Write;

#[cfg(test)]
mod tests;

/// One (workload, resource) result.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The resource's registry name.
    pub resource: String,
    /// The workload's spec or path.
    pub workload: String,
    /// The workload's ops, in one pass of one thread (the table's line of
    /// the workload gives them: a row's own are K times as many with
    /// `--streams K`, and a failed row has none).
    pub workload_ops: u64,
    /// The upstream the row's resource used: `None` for a peer (its own
    /// bookkeeping, no upstream) and for a `--stack` (its leaf names it).
    pub upstream: Option<UpstreamKind>,
    /// Frees the workload skipped (pointers its trace never allocated).
    pub skipped_frees: u64,
    /// Failed allocations the trace logged, skipped.
    pub failed_allocations: u64,
    /// Allocations of a pointer the trace held live already
    /// ([`Workload::reused_pointers`](crate::workload::Workload::reused_pointers)).
    pub reused_pointers: u64,
    /// Frees stating another size than their allocation's
    /// ([`Workload::size_mismatches`](crate::workload::Workload::size_mismatches)).
    pub size_mismatches: u64,
    /// Whether the trace is held out from tuning
    /// ([`family::is_held_out`](crate::family::is_held_out)).
    pub held_out: bool,
    /// The figures, or why the replay failed.
    pub outcome: Result<Measurement, String>,
}

/// Bytes in binary units, e.g. `12.50 MiB` (the core's [`Bytes`](memres_core::Bytes)).
pub fn human_bytes(bytes: u64) -> String {
    memres_core::Bytes(bytes).to_string()
}

/// What the table's figures mean, printed under it.
pub const LEGEND: &str = "\
ns/op: wall time per op of the median timed pass; cpu ns/op: the threads' CPU time per op.
peak live: the most bytes requested and not yet freed at once (with --streams, all threads').
peak upstream: the most bytes the resource held from its upstream at once.
footprint: peak upstream / peak live; 1.000 means no byte held beyond what was live.
grows/pass: allocations from the upstream per timed pass (mean; warm-up left out), a vpool's
  commits (maps) of granules: churn, 0 in a steady state; - where not counted (peers, CUDA,
  --streams).
stray frees: frees of pointers the trace never allocated (skipped, as are rows it cannot use);
  a pointer allocated again while live keeps its first block live to the end; a free of
  another size is replayed with its allocation's.
";

/// `s` for a line of text: its control characters (a line break, a tab, an
/// escape) as [`char::escape_debug`] writes them (`\n`, `\u{1b}`), the
/// rest as it is, so that a name (a trace's file name may hold a line
/// break) keeps its row to one line. U+FFFE and U+FFFF are written so too:
/// XML allows neither, and the timeline's SVG writes its names through
/// this.
pub fn text_name(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() || matches!(c, '\u{fffe}' | '\u{ffff}') {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// The rows as text: per workload (in order of first appearance) a line
/// that names it with its figures (its ops, from the row, not a
/// measurement: one row's may be of several threads, or missing) (and `held out` for a trace held out
/// from tuning), then one aligned line per resource;
/// then the errors of failed replays and the [`LEGEND`]. Names and errors
/// are written through [`text_name`].
pub fn table(rows: &[Row]) -> String {
    let header = ["resource", "ns/op", "cpu ns/op", "peak live", "peak upstream", "footprint", "grows/pass"];
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    let mut errors = Vec::new();
    for row in rows {
        let mut line = vec![text_name(&row.resource)];
        match &row.outcome {
            Ok(m) => line.extend([
                format!("{:.1}", m.ns_per_op()),
                m.cpu_ns_per_op().map_or("-".into(), |c| format!("{c:.1}")),
                human_bytes(m.peak_live),
                human_bytes(m.peak_upstream),
                m.footprint().map_or("-".into(), |f| format!("{f:.3}")),
                m.upstream_allocations_per_pass.map_or("-".into(), |a| format!("{a:.1}")),
            ]),
            Err(e) => {
                line.push("FAILED".to_string());
                line.extend(std::iter::repeat_n("-".to_string(), header.len() - 2));
                errors.push(format!(
                    "{} on {}: {}",
                    text_name(&row.resource),
                    text_name(&row.workload),
                    text_name(e)
                ));
            }
        }
        cells.push(line);
    }
    let widths: Vec<usize> =
        (0..header.len()).map(|c| cells.iter().map(|l| l[c].chars().count()).max().unwrap_or(0)).collect();
    let render = |line: &[String]| {
        let mut out = String::from("  ");
        for (c, cell) in line.iter().enumerate() {
            if c > 0 {
                out.push_str("  ");
            }
            // Padded by hand: a format width above u16::MAX panics, and a
            // name may be longer. Names to the left, figures to the right.
            let pad = " ".repeat(widths[c] - cell.chars().count());
            if c == 0 {
                out.push_str(cell);
                out.push_str(&pad);
            } else {
                out.push_str(&pad);
                out.push_str(cell);
            }
        }
        out.push('\n');
        out
    };
    let mut out = render(&cells[0]);
    let mut workload: Option<&str> = None;
    for (row, line) in rows.iter().zip(&cells[1..]) {
        if workload != Some(row.workload.as_str()) {
            workload = Some(&row.workload);
            out.push_str(&text_name(&row.workload));
            if row.held_out {
                out.push_str(" (held out)");
            }
            let _ = write!(out, ": {} ops, {} stray frees", row.workload_ops, row.skipped_frees);
            if row.failed_allocations > 0 {
                let _ = write!(out, ", {} failed allocations skipped", row.failed_allocations);
            }
            if row.reused_pointers > 0 {
                let _ = write!(out, ", {} pointers allocated again while live", row.reused_pointers);
            }
            if row.size_mismatches > 0 {
                let _ = write!(out, ", {} frees of another size", row.size_mismatches);
            }
            out.push('\n');
        }
        out.push_str(&render(line));
    }
    for e in errors {
        let _ = writeln!(out, "error: {e}");
    }
    out.push('\n');
    out.push_str(LEGEND);
    out
}

/// `s` as a CSV field: quoted when it holds a comma, a quote or a line
/// break.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The header of [`csv_line`]'s lines.
pub const CSV_HEADER: &str =
    "resource,workload,ops,ns_per_op,peak_live,peak_upstream,footprint,passes,best_ns_per_op,cpu_ns_per_op,upstream,skipped_frees,failed_allocations,error,upstream_allocs_per_pass,held_out,reused_pointers,size_mismatches";

/// The row as a line of CSV with the fields of [`json_line`] (empty where
/// JSON has `null`); `upstream_allocs_per_pass`, `held_out`,
/// `reused_pointers` and `size_mismatches` come last, after `error`, so that
/// the columns before them keep their places.
pub fn csv_line(row: &Row) -> String {
    let mut f = vec![csv_field(&row.resource), csv_field(&row.workload)];
    match &row.outcome {
        Ok(m) => f.extend([
            m.ops.to_string(),
            json_f64(m.ns_per_op()),
            m.peak_live.to_string(),
            m.peak_upstream.to_string(),
            m.footprint().map_or(String::new(), json_f64),
            m.passes.to_string(),
            json_f64(m.best_ns_per_op()),
            m.cpu_ns_per_op().map_or(String::new(), json_f64),
        ]),
        Err(_) => f.extend(std::iter::repeat_n(String::new(), 8)),
    }
    f.push(row.upstream.map_or(String::new(), |u| u.to_string()));
    f.push(row.skipped_frees.to_string());
    f.push(row.failed_allocations.to_string());
    f.push(row.outcome.as_ref().err().map_or(String::new(), |e| csv_field(e)));
    f.push(
        row.outcome
            .as_ref()
            .ok()
            .and_then(|m| m.upstream_allocations_per_pass)
            .map_or(String::new(), json_f64),
    );
    f.push(row.held_out.to_string());
    f.push(row.reused_pointers.to_string());
    f.push(row.size_mismatches.to_string());
    f.join(",")
}

/// `s` as a JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_f64(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

/// The row as one JSON object on one line: `resource`, `workload`, `ops`,
/// `ns_per_op`, `peak_live`, `peak_upstream`, `footprint` (figures `null`
/// for a failed replay), `passes`, `best_ns_per_op` (the fastest pass's
/// figure), `cpu_ns_per_op` (`null` where not measured) and
/// `upstream_allocs_per_pass` (allocations from the upstream per timed
/// pass, the mean, a vpool's commits of granules; `null` where not
/// counted) for a replay that ran,
/// `upstream` (`null` for a peer and a `--stack`), `skipped_frees`,
/// `failed_allocations`, `reused_pointers` and `size_mismatches` (the
/// trace's figures: see
/// [`Workload`](crate::workload::Workload)), `held_out` (a trace held out
/// from tuning), and `error` (why the replay failed, `null` where it ran):
/// every row has every key, as every CSV line has every column.
pub fn json_line(row: &Row) -> String {
    let mut out =
        format!("{{\"resource\":{},\"workload\":{},", json_string(&row.resource), json_string(&row.workload));
    match &row.outcome {
        Ok(m) => {
            let _ = write!(
                out,
                "\"ops\":{},\"ns_per_op\":{},\"peak_live\":{},\"peak_upstream\":{},\"footprint\":{},\"passes\":{},\"best_ns_per_op\":{},\"cpu_ns_per_op\":{},\"upstream_allocs_per_pass\":{},",
                m.ops,
                json_f64(m.ns_per_op()),
                m.peak_live,
                m.peak_upstream,
                m.footprint().map_or("null".into(), json_f64),
                m.passes,
                json_f64(m.best_ns_per_op()),
                m.cpu_ns_per_op().map_or("null".into(), json_f64),
                m.upstream_allocations_per_pass.map_or("null".into(), json_f64)
            );
        }
        // Every key of a row that ran, as CSV has every column.
        Err(_) => out.push_str(
            "\"ops\":null,\"ns_per_op\":null,\"peak_live\":null,\"peak_upstream\":null,\"footprint\":null,\"passes\":null,\"best_ns_per_op\":null,\"cpu_ns_per_op\":null,\"upstream_allocs_per_pass\":null,",
        ),
    }
    let _ = write!(
        out,
        "\"upstream\":{},\"skipped_frees\":{},\"failed_allocations\":{},\"reused_pointers\":{},\"size_mismatches\":{},\"held_out\":{}",
        row.upstream.map_or("null".into(), |u| json_string(&u.to_string())),
        row.skipped_frees,
        row.failed_allocations,
        row.reused_pointers,
        row.size_mismatches,
        row.held_out
    );
    // `null` where it ran: every row has every key.
    let error = row.outcome.as_ref().err().map_or("null".into(), |e| json_string(e));
    let _ = write!(out, ",\"error\":{error}}}");
    out
}
