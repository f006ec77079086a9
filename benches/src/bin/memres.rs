//! `memres`: replay allocation workloads through memres resources and their
//! peers, and compare speed and footprint.

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use memres_bench::report::{json_line, table, Row};
use memres_bench::resources::{
    select, spelled, Kind, Param, Resource, RunError, RunOptions, UpstreamKind, RESOURCES,
};
use memres_bench::stack::run_stack;
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
        /// Resources to compare, comma separated (default: all but those
        /// that need a parameter; see `memres resources`), e.g.
        /// `pool,fixed:1MiB,arena`: aliases of stack strings over the
        /// upstream (`pool` is `pool(sim(1TiB))`), the peers, the plain
        /// CUDA resources.
        #[arg(long, short, value_delimiter = ',')]
        resource: Vec<String>,
        /// Stacks to replay through, e.g. `stats(binning(pool(sim)))`
        /// (repeatable); the row is named by the stack's text.
        #[arg(long)]
        stack: Vec<String>,
        /// Where memres resources take memory from: `sim` (a simulated
        /// 1 TiB device), `host` (real host memory), `cuda` (cuMemAlloc)
        /// or `async` (cuMemAllocAsync; `cuda` and `async` need the
        /// feature `cuda`).
        #[arg(long, default_value = "sim")]
        upstream: UpstreamKind,
        /// K threads, each replaying the whole workload on its own stream
        /// through one shared resource (RMM's harness with K threads);
        /// ns/op is wall time over ops x K.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
        streams: Option<u32>,
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
    /// List the resources `replay` knows, with the stack strings they stand for.
    Resources,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Resources => {
            let width = RESOURCES.iter().map(|r| spelled(r).len()).max().unwrap_or(0);
            for r in RESOURCES {
                let stack = match r.stack(UpstreamKind::Sim, Some(1 << 30)) {
                    Some(text) if r.param == Param::None => format!(" (= {text})"),
                    Some(text) => format!(" (= {text} with SIZE 1GiB)"),
                    None => String::new(),
                };
                println!("{:<width$}  {}{stack}", spelled(r), r.about);
            }
            ExitCode::SUCCESS
        }
        Command::Replay { resource, stack, upstream, streams, passes, json, workloads } => {
            let options = RunOptions { upstream, passes, threads: streams, param: None };
            match replay(&resource, &stack, options, json, &workloads) {
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
fn replay(
    names: &[String],
    stacks: &[String],
    options: RunOptions,
    json: bool,
    specs: &[String],
) -> Result<bool, String> {
    enum Target {
        Resource(&'static Resource, Option<u64>, String),
        Stack(String),
    }
    let mut targets: Vec<Target> = Vec::new();
    if names.is_empty() && stacks.is_empty() {
        let applies = |r: &&Resource| {
            r.param != Param::Size
                && (!matches!(r.kind, Kind::Cuda(_)) || cfg!(feature = "cuda"))
                && (!r.sim_only || options.upstream == UpstreamKind::Sim)
        };
        for r in RESOURCES.iter().filter(applies) {
            targets.push(Target::Resource(r, None, r.name.to_string()));
        }
    }
    for n in names {
        let (r, param) = select(n.trim())?;
        targets.push(Target::Resource(r, param, n.trim().to_string()));
    }
    for s in stacks {
        // A stack that does not parse stops the run before anything runs.
        memres_core::stack::parse(s).map_err(|e| format!("stack `{s}`: {e}"))?;
        targets.push(Target::Stack(s.clone()));
    }
    // Decode every workload before replaying any: a bad one stops the run
    // before it prints anything.
    let workloads: Vec<Workload> =
        specs.iter().map(|s| Workload::load(s)).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    let show_progress = std::io::stderr().is_terminal();
    let mut rows = Vec::new();
    for w in &workloads {
        for t in &targets {
            let name = match t {
                Target::Resource(_, _, name) | Target::Stack(name) => name,
            };
            let bar = if show_progress && w.ops.len() >= 1 << 20 {
                let bar = ProgressBar::new((1 + options.passes as u64) * w.ops.len() as u64)
                    .with_message(format!("{name} on {}", w.name));
                if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ops ({eta})") {
                    bar.set_style(style.progress_chars("=> "));
                }
                bar
            } else {
                ProgressBar::hidden()
            };
            let mut progress = |n: usize| bar.inc(n as u64);
            let outcome = match t {
                Target::Resource(r, param, _) => {
                    r.run(w, &RunOptions { param: *param, ..options }, &mut progress)
                }
                // The stack's leaves name its upstream.
                Target::Stack(_) if options.upstream == UpstreamKind::Host => Err(RunError::Unsupported(
                    "--upstream host does not apply to a stack: its leaf names the upstream".into(),
                )),
                Target::Stack(text) => run_stack(text, w, &options, &mut progress),
            }
            .map_err(|e| e.to_string());
            bar.finish_and_clear();
            rows.push(Row {
                resource: match options.threads {
                    Some(k) => format!("{name} x{k}"),
                    None => name.clone(),
                },
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
