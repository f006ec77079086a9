//! What `memres replay` writes besides its rows: the timeline
//! (`--timeline`), snapshots in PyTorch's format (`--snapshot`) and the
//! memory map (`--map`), each from a watched replay ([`crate::observe`]) of
//! every (workload, stack) pair of the run.

use crate::map;
use crate::observe::{observe, Observation};
use crate::paths::Named;
use crate::report::text_name;
use crate::resources::RunError;
use crate::timeline::{self, Chart};
use crate::workload::Workload;
use std::path::{Path, PathBuf};

#[cfg(test)]
mod tests;

/// When a snapshot is taken (an op that fails takes it at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SnapshotAt {
    /// After the op that made the peak of held bytes.
    #[default]
    Peak,
    /// After the last op: a workload frees what is live at its end, so
    /// this shows what the resource keeps from its upstream when idle.
    End,
}

/// What to write.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    /// `--timeline FILE`.
    pub timeline: Option<PathBuf>,
    /// `--snapshot FILE`.
    pub snapshot: Option<PathBuf>,
    /// `--snapshot-at`.
    pub at: SnapshotAt,
    /// `--map`.
    pub map: bool,
}

impl Outputs {
    /// Whether anything is asked for.
    pub fn any(&self) -> bool {
        self.timeline.is_some() || self.snapshot.is_some() || self.map
    }

    /// Refuses a timeline file of an unknown kind, and a timeline or
    /// snapshot that names a directory, before anything runs.
    ///
    /// # Errors
    ///
    /// The message to print.
    pub fn check(&self) -> Result<(), String> {
        for (option, path) in [("--timeline", &self.timeline), ("--snapshot", &self.snapshot)] {
            let Some(path) = path else { continue };
            // Numbered snapshots of `out/` (and `out/.`) were written
            // beside it, `out-0`.
            let named = memres_core::snapshot::check_names_a_file(path);
            if named.is_err() || path.is_dir() {
                return Err(format!("cannot write {option} {}: it names a directory", path.display()));
            }
        }
        if let Some(path) = &self.timeline {
            timeline::Form::of(path)?;
        }
        Ok(())
    }

    /// The files written for `pairs` watched (workload, stack) pairs, each
    /// named as the command line named it.
    ///
    /// # Errors
    ///
    /// Snapshots of more than one pair into a device or a pipe: each is a
    /// numbered file (`/dev/null-0`, made beside the device), so a file
    /// must be named.
    pub fn files(&self, pairs: usize) -> Result<Vec<Named>, String> {
        let mut files = Vec::new();
        if let Some(path) = &self.snapshot {
            if pairs > 1 && std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
                return Err(format!(
                    "cannot write --snapshot {}: {pairs} snapshots are numbered files beside it \
                     (NAME-0.EXT, ...), and it is a device or a pipe; name a file",
                    path.display()
                ));
            }
            for i in 0..pairs {
                let file = numbered(path, i, pairs);
                let what = match pairs {
                    1 => format!("--snapshot {}", path.display()),
                    _ => format!("--snapshot {} (its file {})", path.display(), file.display()),
                };
                files.push(Named::new(file, what));
            }
        }
        if let Some(path) = &self.timeline {
            files.push(Named::new(path, format!("--timeline {}", path.display())));
        }
        Ok(files)
    }
}

/// One pair to watch: a row's name and its stack (`None`: not a memres
/// stack, a peer or a plain CUDA resource, which cannot be watched).
#[derive(Clone, Debug)]
pub struct Target {
    /// The row's name.
    pub name: String,
    /// The stack string.
    pub stack: Option<String>,
    /// Whether its stack can be watched
    /// ([`Checked::watched`](crate::stack::Checked::watched)).
    pub watched: bool,
}

/// How many (workload, stack) pairs of `workloads` workloads are watched:
/// the snapshots written, numbered in row order.
pub fn pairs(targets: &[Target], workloads: usize) -> usize {
    workloads * targets.iter().filter(|t| t.watched).count()
}

/// The file of the `i`th of `n` snapshots: `path` itself for one, else
/// `STEM-i.EXT`.
pub fn numbered(path: &Path, i: usize, n: usize) -> PathBuf {
    if n <= 1 {
        return path.to_path_buf();
    }
    // Built of the name's own bytes: one not UTF-8 is kept as it is.
    let mut name = std::ffi::OsString::from(path.file_stem().unwrap_or_default());
    name.push(format!("-{i}"));
    if let Some(ext) = path.extension() {
        name.push(".");
        name.push(ext);
    }
    path.with_file_name(name)
}

/// The state that the map and a snapshot at the peak show (the replay up
/// to the peak's op, or the whole replay): the one they are labelled by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shown {
    /// At the failed op, where the replay stopped.
    Failed(u64),
    /// After the op that made the peak of held bytes.
    Peak(u64),
    /// At the end: nothing was ever held, so there is no peak.
    End,
}

impl Shown {
    fn of(full: &Observation) -> Shown {
        match (&full.failure, full.peak) {
            (Some(f), _) => Shown::Failed(f.op),
            (None, Some(p)) => Shown::Peak(p.op),
            (None, None) => Shown::End,
        }
    }

    /// As a snapshot's note says it.
    fn note(self) -> String {
        match self {
            Shown::Failed(op) => format!("at the failed op {op}"),
            Shown::Peak(op) => format!("at the peak, after op {op}"),
            Shown::End => "at the end".into(),
        }
    }

    /// As the map's heading says it (the peak's op follows in its label).
    fn heading(self) -> String {
        match self {
            Shown::Peak(_) => "at the peak".into(),
            other => other.note(),
        }
    }
}

/// A file of `--timeline` or `--snapshot` that could not be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwritten {
    /// Why, naming the file.
    pub error: String,
    /// The notes of the files written before it (as [`write()`]'s).
    pub notes: Vec<String>,
}

impl std::fmt::Display for Unwritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.error)
    }
}

/// Watches every pair and writes what `outputs` asks for; returns the
/// map's text (empty without `--map`) and notes for stderr (files written,
/// pairs that cannot be watched), their names and the notes written
/// through [`text_name`].
///
/// # Errors
///
/// A file that cannot be written, with the notes of those written before
/// it (a pair that cannot be watched is a note).
pub fn write(
    targets: &[Target],
    workloads: &[Workload],
    outputs: &Outputs,
) -> Result<(String, Vec<String>), Unwritten> {
    write_with(targets, workloads, outputs, &observe)
}

/// A watched replay: [`observe`], or a stand-in in tests.
type Observe = dyn Fn(&str, &Workload, Option<u64>) -> Result<Observation, RunError>;

/// [`write()`], each pair watched by `observe`.
fn write_with(
    targets: &[Target],
    workloads: &[Workload],
    outputs: &Outputs,
    observe: &Observe,
) -> Result<(String, Vec<String>), Unwritten> {
    let mut seen: Vec<(String, &Workload, Observation)> = Vec::new();
    let mut notes = Vec::new();
    let mut map_text = String::new();
    let pairs = pairs(targets, workloads.len());
    // The number of the next watched pair's snapshot, whether or not the
    // one before could be watched: the names the check before the run saw.
    let mut next = 0;
    for w in workloads {
        for t in targets {
            let Some(stack) = &t.stack else {
                notes.push(format!("{} is not a memres stack: no timeline, snapshot or map", t.name));
                continue;
            };
            if !t.watched {
                notes.push(format!(
                    "{} has no sim or host leaf whose allocations can be watched: no timeline, snapshot or map",
                    t.name
                ));
                continue;
            }
            let number = next;
            next += 1;
            let full = match observe(stack, w, None) {
                Ok(full) => full,
                Err(e) => {
                    notes.push(format!("{} on {}: {e}: no timeline, snapshot or map", t.name, w.name));
                    continue;
                }
            };
            // The state at the peak (or where it failed): replayed again up
            // to that op, the replay being deterministic.
            let at_peak = || -> Result<Observation, RunError> {
                match (&full.failure, full.peak) {
                    (None, Some(p)) => observe(stack, w, Some(p.op)),
                    _ => Ok(full.clone()),
                }
            };
            let peak_state = if outputs.map || (outputs.snapshot.is_some() && outputs.at == SnapshotAt::Peak)
            {
                // As the first replay's error: its table may not fit now.
                match at_peak() {
                    Ok(p) => Some(p),
                    Err(e) => {
                        notes.push(format!("{} on {}: {e}: no timeline, snapshot or map", t.name, w.name));
                        continue;
                    }
                }
            } else {
                None
            };
            let shown = Shown::of(&full);
            if let Some(path) = &outputs.snapshot {
                let file = numbered(path, number, pairs);
                let (state, when) = match (outputs.at, &peak_state, shown) {
                    (SnapshotAt::Peak, Some(p), _) => (p, shown),
                    // The end of a replay that failed is the failed op.
                    (_, _, Shown::Failed(_)) => (&full, shown),
                    _ => (&full, Shown::End),
                };
                let when = when.note();
                // Whole: a viewer open on the file never reads part of it.
                if let Err(e) = memres_core::snapshot::write_file(&file, &state.map.pickle()) {
                    let error = format!("cannot write {}: {e}", file.display());
                    return Err(Unwritten { error, notes: lines(&notes) });
                }
                notes.push(format!("wrote snapshot {} ({} on {}, {when})", file.display(), t.name, w.name));
            }
            if let (true, Some(p)) = (outputs.map, &peak_state) {
                map_text.push_str(&format!(
                    "map of {} on {} {} ({}):\n",
                    text_name(&t.name),
                    text_name(&w.name),
                    shown.heading(),
                    timeline::peak_label(&full)
                ));
                map_text.push_str(&map::render(&p.map.runs()));
                map_text.push('\n');
            }
            seen.push((t.name.clone(), w, full));
        }
    }
    if let Some(path) = &outputs.timeline {
        let charts: Vec<Chart<'_>> = seen
            .iter()
            .map(|(r, w, o)| Chart {
                resource: r,
                workload: &w.name,
                observation: o,
                times: w.times.as_deref(),
            })
            .collect();
        if let Err(error) = timeline::write(path, &charts) {
            return Err(Unwritten { error, notes: lines(&notes) });
        }
        notes.push(format!("wrote timeline {}", path.display()));
    }
    Ok((map_text, lines(&notes)))
}

/// `notes` one line each, as the table's names (a trace's name may hold a
/// line break).
fn lines(notes: &[String]) -> Vec<String> {
    notes.iter().map(|n| text_name(n)).collect()
}
