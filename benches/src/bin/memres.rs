//! `memres`: replay allocation workloads through memres resources and their
//! peers, and compare speed and footprint.

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use memres_bench::paths::{check_distinct, check_outputs, Named};
use memres_bench::replay::MAX_PASSES;
use memres_bench::report::{csv_line, json_line, table, text_name, Row, CSV_HEADER};
use memres_bench::resources::{select, spelled, Param, Resource, RunOptions, UpstreamKind, RESOURCES};
use memres_bench::stack::{check_stack, run_stack};
use memres_bench::watch::{self, Outputs, SnapshotAt, Target};
use memres_bench::workload::{trace_path, Workload};
use std::ffi::OsString;
use std::fmt;
use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
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
    ///
    /// With no workload named, every trace of the family in `benches/data/`,
    /// those held out from tuning (`benches/data/held_out.txt`) last; a
    /// held-out trace's rows are marked wherever it lies.
    ///
    /// Exit status: 0 every replay ran, 1 some replay failed (its row says
    /// why) or stdout, stderr or an output could not be written, 2 bad
    /// usage (nothing ran, even where stderr could not say why). The
    /// outputs are written even where stdout or stderr could not be; a
    /// reader of either that went away (`| head`) ends the printing
    /// quietly, the status the run's.
    Replay {
        /// Resources to compare, comma separated (default, where no
        /// `--stack` is named either: every one that needs no parameter and
        /// can run as asked; see `memres resources`), e.g.
        /// `pool,fixed:1MiB,arena`: aliases of stack strings over the
        /// upstream (`pool` is `pool(sim(1TiB))`), the peers, the plain
        /// CUDA resources.
        #[arg(long, short, value_delimiter = ',')]
        resource: Vec<String>,
        /// Stacks to replay through, e.g. `stats(binning(pool(sim)))`
        /// (repeatable; see `memres stacks`); the row is named by the
        /// stack's text.
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
        /// Timed passes after the warm-up pass (at most 1,000,000: each
        /// pass's time is kept for the median); ns/op is the median pass's.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=MAX_PASSES as i64))]
        passes: u32,
        /// Print JSON lines instead of a table.
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// Print CSV (a header, then a line per row) instead of a table.
        #[arg(long)]
        csv: bool,
        /// Write a timeline of every memres stack's replay: bytes live,
        /// held and the largest free block per op, the peak marked
        /// (FILE.html, FILE.svg or FILE.csv).
        #[arg(long, value_name = "FILE")]
        timeline: Option<PathBuf>,
        /// Write a snapshot in the format of PyTorch's
        /// `torch.cuda.memory._snapshot()` (a pickle) per (workload, stack)
        /// that can be watched: FILE for one, FILE-0, FILE-1, ... for more
        /// (a device or a pipe takes one only); at an op that fails, there.
        #[arg(long, value_name = "FILE")]
        snapshot: Option<PathBuf>,
        /// When the snapshot is taken.
        #[arg(long, value_enum, default_value_t = SnapshotAt::Peak, requires = "snapshot")]
        snapshot_at: SnapshotAt,
        /// Print each memres stack's memory at its peak: every segment
        /// held from the upstream as a bar of used and free runs.
        #[arg(long)]
        map: bool,
        /// Workload specs or trace paths (default: the trace family).
        #[arg(value_name = "WORKLOAD_OR_TRACE")]
        workloads: Vec<OsString>,
    },
    /// Place each workload's blocks knowing every lifetime in advance:
    /// the footprint a placement that never moves a block can reach once
    /// it has seen the whole sequence (a reference, not a resource).
    ///
    /// Blocks are placed by each of the seven methods of
    /// `memres_core::planned::placement`, a column each: at the lowest
    /// offset free while a block is live, in three orders (`size`,
    /// `size-then-lifetime`, `area`), the skyline in the same orders
    /// (`skyline-size`, `skyline-size-then-lifetime`, `skyline-area`), and
    /// in the order they come, each in the smallest free stretch
    /// (`best-fit`); the lowest is the `offline` column. Every placement is
    /// checked before it is printed: no two live blocks share an address,
    /// none reaches 2^64 - 1 bytes. Footprint is the highest end offset
    /// over the peak live bytes, as for the peers in `replay`. Exit status:
    /// 0 printed, 1 a placement failed its check or stdout or stderr could
    /// not be written, 2 bad usage.
    Offline {
        /// Print CSV (a header, then a line per workload) instead of a table.
        #[arg(long)]
        csv: bool,
        /// Workload specs or trace paths, as for `replay`.
        #[arg(required = true, value_name = "WORKLOAD_OR_TRACE")]
        workloads: Vec<OsString>,
    },
    /// Replay each workload once through a stack with a `planned` layer,
    /// with no warm-up pass, calling `step()` every N allocations: the
    /// steps of a training loop inside one trace (`replay` makes each pass
    /// a step). Prints the peak live bytes, the leaf's peak (a `vpool`'s
    /// committed bytes), their ratio and each `planned` layer's figures.
    ///
    /// Exit status: 0 printed, 1 an op failed or stdout or stderr could not
    /// be written, 2 bad usage.
    Steps {
        /// The stack, e.g. `planned(vpool(sim(1TiB)))`.
        #[arg(long)]
        stack: String,
        /// Allocations per step.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        every: u64,
        /// The allocation before which the first step is called, counted
        /// from 0: one of the workload's (0 is taken for any workload).
        #[arg(long, default_value_t = 0)]
        phase: u64,
        /// Workload specs or trace paths, as for `replay`.
        #[arg(required = true, value_name = "WORKLOAD_OR_TRACE")]
        workloads: Vec<OsString>,
    },
    /// List the resources `replay` knows, with the stack strings they stand for.
    Resources,
    /// List the names of stack strings (leaves, resources, adaptors) with
    /// their keys.
    Stacks,
}

/// Bad usage: nothing ran.
const USAGE: u8 = 2;

/// A standard stream, stdout or stderr, through a writer whose failure is
/// kept, not a panic (`println!` and `eprintln!` panic where the stream
/// cannot be written: a reader gone, a full disk). After the first failure
/// nothing more is written to it.
struct StdStream<W: Write> {
    out: W,
    failed: Option<io::Error>,
}

/// Standard output, locked once: the tool's one writer of it.
type Stdout = StdStream<io::StdoutLock<'static>>;

/// Standard error, locked at each write, not held: the core's adaptors and
/// the progress bar write to it too, from whatever thread they run on.
type Stderr = StdStream<io::Stderr>;

/// The tool's standard streams.
struct Console {
    out: Stdout,
    err: Stderr,
}

/// `print!` through a [`StdStream`].
macro_rules! out {
    ($out:expr, $($arg:tt)*) => { $out.print(format_args!($($arg)*)) };
}

/// `println!` through a [`StdStream`].
macro_rules! outln {
    ($out:expr) => { $out.print(format_args!("\n")) };
    ($out:expr, $($arg:tt)*) => { $out.print(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `memres: error: ...` on one line: a message quotes names as given
/// (a workload, a stack, a path), escaped here as the table escapes them.
macro_rules! error {
    ($out:expr, $($arg:tt)*) => { outln!($out, "memres: error: {}", text_name(&format!($($arg)*))) };
}

impl<W: Write> StdStream<W> {
    fn new(out: W) -> StdStream<W> {
        StdStream { out, failed: None }
    }

    fn print(&mut self, text: fmt::Arguments<'_>) {
        if self.failed.is_none() {
            self.failed = self.out.write_fmt(text).err();
        }
    }

    /// Keeps the failure of a write to the stream made by another writer
    /// (clap's), as if it were its own.
    fn keep_failure(&mut self, error: io::Error) {
        self.failed.get_or_insert(error);
    }

    /// Whether a write failed: what is left to print need not be made.
    fn failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Flushes what was printed; the failure, if any, other than a reader
    /// that went away (`| head`), which ends the printing quietly.
    fn finish(mut self) -> Option<io::Error> {
        if self.failed.is_none() {
            self.failed = self.out.flush().err();
        }
        self.failed.filter(|e| e.kind() != io::ErrorKind::BrokenPipe)
    }
}

/// The exit status of a command that ends with `code`, once what it printed
/// is flushed: a stream that could not be written (but for a reader gone)
/// makes a success 1, said on stderr where stdout failed; a failure keeps
/// its own status (2: nothing ran, even where stderr could not say why).
fn finish(code: ExitCode, Console { out, mut err }: Console) -> ExitCode {
    let stdout = out.finish();
    if let Some(e) = &stdout {
        error!(err, "cannot write to standard output: {e}");
    }
    let stderr = err.finish();
    if code == ExitCode::SUCCESS && (stdout.is_some() || stderr.is_some()) {
        ExitCode::FAILURE
    } else {
        code
    }
}

fn main() -> ExitCode {
    ignore_file_size_signal();
    let mut console = Console { out: StdStream::new(io::stdout().lock()), err: StdStream::new(io::stderr()) };
    let code = match Cli::try_parse() {
        Ok(cli) => run(cli.command, &mut console),
        Err(e) => clap_message(&e, &mut console),
    };
    finish(code, console)
}

/// A write past the process's limit of file size (`ulimit -f`) fails with
/// `EFBIG`, which the log, the timeline and the snapshots report as their
/// own error (docs/replay.md), rather than killing the process by
/// `SIGXFSZ` with nothing said and a temporary file left behind.
fn ignore_file_size_signal() {
    #[cfg(target_os = "linux")]
    // SAFETY: `SIG_IGN` installs no handler: no code of this process runs
    // on the signal, so nothing it could touch needs to be async-signal
    // safe; the call changes only the signal's disposition.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// Prints clap's help, version or usage error as clap does (in color on a
/// terminal): its exit status, a write that failed kept in the console as
/// the tool's own (clap's `Error::exit` drops it: `--help > /dev/full`
/// exited 0).
fn clap_message(e: &clap::Error, console: &mut Console) -> ExitCode {
    if let Err(failed) = e.print() {
        if e.use_stderr() {
            console.err.keep_failure(failed);
        } else {
            console.out.keep_failure(failed);
        }
    }
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(USAGE))
}

fn run(command: Command, console: &mut Console) -> ExitCode {
    match command {
        Command::Resources => {
            let width = RESOURCES.iter().map(|r| spelled(r).len()).max().unwrap_or(0);
            for r in RESOURCES {
                let stack = match r.stack(UpstreamKind::Sim, Some(1 << 30)) {
                    Some(text) if r.param == Param::None => format!(" (= {text})"),
                    Some(text) => format!(" (= {text} with SIZE 1GiB)"),
                    None => String::new(),
                };
                outln!(console.out, "{:<width$}  {}{stack}", spelled(r), r.about);
            }
            ExitCode::SUCCESS
        }
        Command::Stacks => {
            out!(console.out, "{}", memres_bench::names::listing());
            ExitCode::SUCCESS
        }
        Command::Offline { csv, workloads } => offline(csv, &workloads, console),
        Command::Steps { stack, every, phase, workloads } => steps(&stack, every, phase, &workloads, console),
        Command::Replay {
            resource,
            stack,
            upstream,
            streams,
            passes,
            json,
            csv,
            timeline,
            snapshot,
            snapshot_at,
            map,
            workloads,
        } => {
            let options = RunOptions { upstream, passes, threads: streams, param: None };
            let outputs = Outputs { timeline, snapshot, at: snapshot_at, map };
            let format = if json {
                Format::Json
            } else if csv {
                Format::Csv
            } else {
                Format::Table
            };
            match replay(&resource, &stack, options, format, &outputs, &workloads, console) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(Failure::Usage(message)) => {
                    error!(console.err, "{message}");
                    ExitCode::from(USAGE)
                }
                Err(Failure::Output(message)) => {
                    error!(console.err, "{message}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `memres offline`: one line per workload, every method's footprint and
/// the best.
fn offline(csv: bool, specs: &[OsString], console: &mut Console) -> ExitCode {
    use memres_bench::offline::{lifetimes, op_count, place_each};
    use memres_bench::report::{human_bytes, text_name};
    use memres_core::planned::placement::Method;
    let Console { out, err } = console;
    let workloads: Vec<Workload> = match specs.iter().map(Workload::load).collect() {
        Ok(w) => w,
        Err(e) => {
            error!(err, "{e}");
            return ExitCode::from(USAGE);
        }
    };
    // Refused before anything is printed, as a workload that does not decode.
    if let Some(e) = workloads.iter().find_map(|w| op_count(&w.name, w.ops.len()).err()) {
        error!(err, "{e}");
        return ExitCode::from(USAGE);
    }
    let methods: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
    // The column of names is as wide as its header at least: names shorter
    // than `workload` put every cell of their rows left of its header.
    let width = workloads.iter().map(|w| text_name(&w.name).chars().count()).chain(["workload".len()]).max();
    let width = width.unwrap_or_default();
    // A method's column as wide as its name (`skyline-size-then-lifetime`).
    let widths: Vec<usize> = methods.iter().map(|m| m.len().max(18)).collect();
    if csv {
        outln!(out, "workload,peak_live,{},best,best_method", methods.join(","));
    } else {
        out!(out, "{}  {:>11}", padded("workload", width), "peak live");
        methods.iter().zip(&widths).for_each(|(m, w)| out!(out, "  {m:>w$}"));
        outln!(out, "  {:>11}  {:>9}  best method", "offline", "footprint");
    }
    let mut ok = true;
    for w in &workloads {
        // Nothing more is placed once nothing more can be printed.
        if out.failed() {
            break;
        }
        let blocks = match lifetimes(w) {
            Ok(blocks) => blocks,
            Err(e) => {
                error!(err, "{e}");
                ok = false;
                continue;
            }
        };
        // None where nothing was ever live: `-`, as `replay` prints it.
        let footprint = |top: u64| memres_bench::replay::footprint(top, w.peak_live);
        let placements = match place_each(&blocks) {
            Ok(placements) => placements,
            Err(e) => {
                error!(err, "{}: {e}", w.name);
                ok = false;
                continue;
            }
        };
        // The lowest, the first of equal ones (as `placement::best` picks).
        let Some((method, placement)) = placements.iter().min_by_key(|(_, p)| p.top) else {
            continue;
        };
        let each: Vec<u64> = placements.iter().map(|(_, p)| p.top).collect();
        if csv {
            let field = |top: u64| footprint(top).map_or(String::new(), |f| format!("{f:.4}"));
            let fields: Vec<String> = each.iter().map(|&t| field(t)).collect();
            outln!(
                out,
                "{},{},{},{},{}",
                memres_bench::report::csv_field(&w.name),
                w.peak_live,
                fields.join(","),
                field(placement.top),
                method.name()
            );
        } else {
            let cell = |top: u64| footprint(top).map_or("-".into(), |f| format!("{f:.3}"));
            out!(out, "{}  {:>11}", padded(&text_name(&w.name), width), human_bytes(w.peak_live));
            each.iter().zip(&widths).for_each(|(&t, w)| out!(out, "  {:>w$}", cell(t)));
            outln!(
                out,
                "  {:>11}  {:>9}  {}",
                human_bytes(placement.top),
                cell(placement.top),
                method.name()
            );
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `memres steps`: one line per workload.
fn steps(stack: &str, every: u64, phase: u64, specs: &[OsString], console: &mut Console) -> ExitCode {
    use memres_bench::report::{human_bytes, text_name};
    use memres_bench::resources::RunError;
    let Console { out, err } = console;
    // The stack is checked first, as `replay` checks it: a `log` layer's
    // file may not be a workload's trace, which its build would empty.
    let logs = match check_stack(stack, UpstreamKind::Sim) {
        Ok(checked) => checked.logs,
        Err(e) => {
            error!(err, "{e}");
            return ExitCode::from(USAGE);
        }
    };
    let logs: Vec<Named> =
        logs.iter().map(|p| Named::new(p, format!("the log {} of `{stack}`", p.display()))).collect();
    let inputs: Vec<Named> = specs
        .iter()
        .filter_map(|s| trace_path(s))
        .map(|p| Named::new(p, format!("the workload {}", p.display())))
        .collect();
    if let Err(e) = check_distinct(&inputs, &[], &logs) {
        error!(err, "{e}");
        return ExitCode::from(USAGE);
    }
    let workloads: Vec<Workload> = match specs.iter().map(Workload::load).collect() {
        Ok(w) => w,
        Err(e) => {
            error!(err, "{e}");
            return ExitCode::from(USAGE);
        }
    };
    // Refused before anything is printed, as a workload that does not decode.
    if let Some(e) = workloads.iter().find_map(|w| memres_bench::stack::check_phase(w, phase).err()) {
        error!(err, "{e}");
        return ExitCode::from(USAGE);
    }
    for w in &workloads {
        // Nothing more is replayed once nothing more can be printed.
        if out.failed() {
            break;
        }
        match memres_bench::stack::run_steps(stack, w, every, phase) {
            Ok(run) => {
                // `-` where nothing was ever live, as `replay` prints it.
                let footprint = memres_bench::replay::footprint(run.peak_upstream, run.peak_live)
                    .map_or("-".into(), |f| format!("{f:.3}"));
                out!(
                    out,
                    "{}: peak live {}, peak upstream {}, footprint {footprint}",
                    text_name(&w.name),
                    human_bytes(run.peak_live),
                    human_bytes(run.peak_upstream)
                );
                for s in &run.steps {
                    out!(
                        out,
                        "; steps {}, followed {}, plans {}, region {}, carry region {}",
                        s.steps,
                        s.followed,
                        s.plans,
                        human_bytes(s.region),
                        human_bytes(s.carry_region)
                    );
                }
                outln!(out);
            }
            Err(RunError::Unsupported(e)) => {
                error!(err, "{e}");
                return ExitCode::from(USAGE);
            }
            Err(e) => {
                error!(err, "{}: {e}", w.name);
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Table,
    Json,
    Csv,
}

enum Failure {
    /// Bad usage, found before anything ran.
    Usage(String),
    /// A file of `--timeline`, `--snapshot` that could not be written.
    Output(String),
}

/// What a row replays.
enum Source {
    Resource(&'static Resource, Option<u64>),
    Stack(String),
}

/// Checks everything, runs every replay, prints every row, then writes the
/// outputs, whether or not the rows could be printed. `Ok(false)`: some
/// replay failed (its row says why).
fn replay(
    names: &[String],
    stacks: &[String],
    options: RunOptions,
    format: Format,
    outputs: &Outputs,
    specs: &[OsString],
    console: &mut Console,
) -> Result<bool, Failure> {
    let Console { out, err } = console;
    if options.upstream.is_cuda() && !cfg!(feature = "cuda") {
        return Err(Failure::Usage(format!(
            "--upstream {} needs the tool built with `--features cuda`",
            options.upstream
        )));
    }
    outputs.check().map_err(Failure::Usage)?;
    let mut sources: Vec<(String, Source)> = Vec::new();
    if names.is_empty() && stacks.is_empty() {
        // Those that can run as asked (the peers not on threads, say).
        let applies = |r: &&Resource| r.check(&RunOptions { param: None, ..options }).is_ok();
        for r in RESOURCES.iter().filter(applies) {
            sources.push((r.name.to_string(), Source::Resource(r, None)));
        }
    }
    for n in names {
        let (r, param) = select(n.trim()).map_err(Failure::Usage)?;
        sources.push((n.trim().to_string(), Source::Resource(r, param)));
    }
    for s in stacks {
        sources.push((s.clone(), Source::Stack(s.clone())));
    }
    // What no row could run is bad usage, told before any row runs.
    for (_, source) in &sources {
        match source {
            Source::Resource(r, param) => {
                r.check(&RunOptions { param: *param, ..options }).map_err(Failure::Usage)?
            }
            Source::Stack(_) if options.upstream == UpstreamKind::Host => {
                return Err(Failure::Usage(
                    "--upstream host does not apply to a stack: its leaf names the upstream".into(),
                ))
            }
            Source::Stack(_) => {}
        }
    }
    // Every stack is built once before anything is replayed: a wrong name,
    // key or value stops the run at once.
    let mut targets: Vec<Target> = sources
        .iter()
        .map(|(name, source)| Target {
            name: name.clone(),
            stack: match source {
                Source::Resource(r, param) => r.stack(options.upstream, *param),
                Source::Stack(text) => Some(text.clone()),
            },
            watched: false,
        })
        .collect();
    let mut logs = Vec::new();
    for t in &mut targets {
        if let Some(text) = &t.stack {
            let checked = check_stack(text, options.upstream).map_err(Failure::Usage)?;
            if let (Some(_), Some(layer)) = (options.threads, &checked.one_thread) {
                return Err(Failure::Usage(format!(
                    "`{text}` replays on one thread only, not with --streams: its `{layer}` layer follows \
                     the replay's op sequence"
                )));
            }
            if let Some(threads) = options.threads {
                memres_bench::stack::check_threads(text, threads).map_err(Failure::Usage)?;
            }
            let named = |p: PathBuf| Named::new(&p, format!("the log {} of `{text}`", p.display()));
            logs.extend(checked.logs.into_iter().map(named));
            t.watched = checked.watched;
        }
    }
    if outputs.any() && !targets.iter().any(|t| t.watched) {
        return Err(Failure::Usage(
            "--timeline, --snapshot and --map watch memres stacks with a `sim` or `host` leaf, and none \
             is named"
                .into(),
        ));
    }
    let family;
    let specs = if specs.is_empty() {
        let dir = std::path::Path::new(memres_bench::family::DATA_DIR);
        family = memres_bench::family::traces(dir).map_err(|e| {
            Failure::Usage(format!("no workload named, and the trace family at {}: {e}", dir.display()))
        })?;
        if family.is_empty() {
            return Err(Failure::Usage(format!("no workload named, and no trace in {}", dir.display())));
        }
        // Named from the working directory where they lie under it, as a
        // user would name them.
        let here = std::env::current_dir().unwrap_or_default();
        family.iter().map(|p| p.strip_prefix(&here).unwrap_or(p).as_os_str().to_owned()).collect()
    } else {
        specs.to_vec()
    };
    // No output may overwrite a trace or another output.
    let inputs: Vec<Named> = specs
        .iter()
        .filter_map(|s| trace_path(s))
        .map(|p| Named::new(p, format!("the workload {}", p.display())))
        .collect();
    let files = outputs.files(watch::pairs(&targets, specs.len())).map_err(Failure::Usage)?;
    check_distinct(&inputs, &files, &logs).map_err(Failure::Usage)?;
    // Each output can be written: told now, not after the run.
    check_outputs(&files).map_err(Failure::Usage)?;
    // Decode every workload before replaying any: a bad one stops the run
    // before it prints anything.
    let workloads: Vec<Workload> = specs
        .iter()
        .map(Workload::load)
        .collect::<Result<_, _>>()
        .map_err(|e| Failure::Usage(e.to_string()))?;
    let held_out: Vec<bool> = specs
        .iter()
        .zip(&workloads)
        .map(|(spec, w)| {
            trace_path(spec).map_or(Ok(false), memres_bench::family::is_held_out).map_err(|e| {
                Failure::Usage(format!("{}: the list of held-out traces beside it: {e}", w.name))
            })
        })
        .collect::<Result<_, _>>()?;
    let rows = run_all(&sources, &workloads, &held_out, &options);
    match format {
        Format::Json => rows.iter().for_each(|row| outln!(out, "{}", json_line(row))),
        Format::Csv => {
            outln!(out, "{CSV_HEADER}");
            rows.iter().for_each(|row| outln!(out, "{}", csv_line(row)));
        }
        Format::Table => out!(out, "{}", table(&rows)),
    }
    if outputs.any() {
        let (map, notes) = match watch::write(&targets, &workloads, outputs) {
            Ok(written) => written,
            Err(e) => {
                // The files written before it are there all the same.
                for note in e.notes {
                    outln!(err, "memres: {note}");
                }
                return Err(Failure::Output(e.error));
            }
        };
        // The map joins the table; machine output stays machine output.
        if format == Format::Table {
            out!(out, "\n{map}");
        } else {
            out!(err, "{map}");
        }
        for note in notes {
            outln!(err, "memres: {note}");
        }
    }
    Ok(rows.iter().all(|r| r.outcome.is_ok()))
}

/// Replays every source on every workload, with a progress bar on a terminal
/// for long workloads.
fn run_all(
    sources: &[(String, Source)],
    workloads: &[Workload],
    held_out: &[bool],
    options: &RunOptions,
) -> Vec<Row> {
    let show_progress = std::io::stderr().is_terminal();
    let mut rows = Vec::new();
    for (w, &held_out) in workloads.iter().zip(held_out) {
        for (name, source) in sources {
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
            let outcome = match source {
                Source::Resource(r, param) => {
                    r.run(w, &RunOptions { param: *param, ..*options }, &mut progress)
                }
                Source::Stack(text) => run_stack(text, w, options, &mut progress),
            }
            .map_err(|e| e.to_string());
            bar.finish_and_clear();
            rows.push(Row {
                resource: match options.threads {
                    Some(k) => format!("{name} x{k}"),
                    None => name.clone(),
                },
                workload: w.name.clone(),
                workload_ops: w.ops.len() as u64,
                upstream: match source {
                    Source::Resource(r, _) => r.upstream(options.upstream),
                    Source::Stack(_) => None,
                },
                skipped_frees: w.skipped_frees,
                failed_allocations: w.failed_allocations,
                reused_pointers: w.reused_pointers,
                size_mismatches: w.size_mismatches,
                held_out,
                outcome,
            });
        }
    }
    rows
}

/// `s` padded with spaces to `width` characters, by hand: a format width
/// above `u16::MAX` panics, and a workload's name may be longer.
fn padded(s: &str, width: usize) -> String {
    format!("{s}{}", " ".repeat(width.saturating_sub(s.chars().count())))
}
