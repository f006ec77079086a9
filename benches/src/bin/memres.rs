//! `memres`: replay allocation workloads through memres resources and their
//! peers, and compare speed and footprint.

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use memres_bench::report::{json_line, table, Row};
use memres_bench::resources::{find, Resource, RunOptions, UpstreamKind, RESOURCES};
use memres_bench::workload::Workload;
use std::io::IsTerminal;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "memres", version, about = "memres command-line tool")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Replay workloads through resources: one row per (workload, resource).
    ///
    /// A workload is `random:N:MAXBYTES:SEED` (uniform sizes),
    /// `lograndom:N:MINB:MAXB:SEED` (log-uniform sizes), both generated as
    /// RMM's replay harness does, or the path of a trace in RMM's log
    /// format (CSV `Thread,Time,Action,Pointer,Size,Stream`, plain or gzip).
    Replay {
        /// Resources to compare, comma separated (default: all; see
        /// `memres resources`).
        #[arg(long, short, value_delimiter = ',')]
        resource: Vec<String>,
        /// Where memres resources take memory from: `sim` (a simulated
        /// 1 TiB device) or `host` (real host memory).
        #[arg(long, default_value = "sim")]
        upstream: UpstreamKind,
        /// Timed passes after the warm-up pass; ns/op is the median pass's.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        passes: u32,
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
        /// Workload specs or trace paths.
        #[arg(required = true, value_name = "WORKLOAD_OR_TRACE")]
        workloads: Vec<String>,
    },
    /// List the resources `replay` knows.
    Resources,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Resources => {
            let width = RESOURCES.iter().map(|r| r.name.len()).max().unwrap_or(0);
            for r in RESOURCES {
                println!("{:<width$}  {}", r.name, r.about);
            }
            ExitCode::SUCCESS
        }
        Command::Replay { resource, upstream, passes, json, workloads } => {
            match replay(&resource, RunOptions { upstream, passes }, json, &workloads) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(message) => {
                    eprintln!("memres: error: {message}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Runs every replay, then prints every row. `Ok(false)`: some replay
/// failed (its row says why); `Err`: nothing ran.
fn replay(names: &[String], options: RunOptions, json: bool, specs: &[String]) -> Result<bool, String> {
    let resources: Vec<&Resource> = if names.is_empty() {
        RESOURCES.iter().collect()
    } else {
        names.iter().map(|n| find(n.trim())).collect::<Result<_, _>>()?
    };
    // Decode every workload before replaying any: a bad one stops the run
    // before it prints anything.
    let workloads: Vec<Workload> =
        specs.iter().map(|s| Workload::load(s)).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    let show_progress = std::io::stderr().is_terminal();
    let mut rows = Vec::new();
    for w in &workloads {
        for r in &resources {
            let bar = if show_progress && w.ops.len() >= 1 << 20 {
                let bar = ProgressBar::new((1 + options.passes as u64) * w.ops.len() as u64)
                    .with_message(format!("{} on {}", r.name, w.name));
                if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ops ({eta})") {
                    bar.set_style(style.progress_chars("=> "));
                }
                bar
            } else {
                ProgressBar::hidden()
            };
            let outcome = (r.run)(w, &options, &mut |n| bar.inc(n as u64)).map_err(|e| e.to_string());
            bar.finish_and_clear();
            rows.push(Row {
                resource: r.name.to_owned(),
                workload: w.name.clone(),
                upstream: options.upstream,
                skipped_frees: w.skipped_frees,
                outcome,
            });
        }
    }
    if json {
        for row in &rows {
            println!("{}", json_line(row));
        }
    } else {
        print!("{}", table(&rows));
    }
    Ok(rows.iter().all(|r| r.outcome.is_ok()))
}
