//! The names of stack strings as the tool explains them: `memres stacks`
//! lists each with its keys and a line of help, and a stack that does not
//! build is told with the valid names or keys and the nearest one.
//!
//! [`NAMES`] covers exactly the names the tool's builder registers (a test
//! holds them equal), plus the CUDA leaves of `--features cuda`.

use memres_core::stack::{parse, Call, StackError, StackErrorKind, Value};

#[cfg(test)]
mod tests;

/// What a name stands for in a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Where memory comes from.
    Leaf,
    /// An algorithm over an upstream.
    Resource,
    /// An adaptor: the upstream's blocks, with something added.
    Adaptor,
}

/// One name of a stack string.
#[derive(Clone, Copy, Debug)]
pub struct Name {
    /// The name.
    pub name: &'static str,
    /// What it is.
    pub role: Role,
    /// Its arguments as written.
    pub args: &'static str,
    /// The keys it takes, each with a line of help.
    pub keys: &'static [(&'static str, &'static str)],
    /// One line on what it is.
    pub help: &'static str,
    /// Only in a build with `--features cuda` (with `--upstream cuda|async`).
    pub cuda: bool,
}

const fn name(name: &'static str, role: Role, args: &'static str, help: &'static str) -> Name {
    Name { name, role, args, keys: &[], help, cuda: false }
}

/// Every name, leaves first.
pub const NAMES: &[Name] = &[
    Name {
        // The default is memres_sim::DEFAULT_SIM_CAPACITY (a test holds them equal).
        keys: &[("capacity", "the device's bytes (default 80 GiB), or as the first argument")],
        ..name("sim", Role::Leaf, "[capacity]", "a simulated device: addresses only, no bytes behind them")
    },
    name("host", Role::Leaf, "", "real host memory (the bytes exist)"),
    Name {
        keys: &[
            ("reserve", "bytes of address space reserved once (default 64 GiB)"),
            ("release_threshold", "free bytes kept mapped rather than given back (default all)"),
            ("granule", "bytes mapped at a time (default 2 MiB)"),
            ("slack", "free memory kept mapped up to this many permille above the peak in use (default 40)"),
            ("trim_on_commit", "true|false: give free memory back before mapping beyond the peak (default true)"),
            (
                "handle_granules",
                "memory held in pieces of up to this many granules, given back whole, as vmm's handles (default: any granule alone)",
            ),
            ("per_stream", "true|false: one virtual pool per stream, each in a reservation of its own"),
        ],
        ..name(
            "vpool",
            Role::Leaf,
            "sim(...)",
            "a virtual pool over a simulated address space: granules mapped where blocks live",
        )
    },
    Name {
        cuda: true,
        ..name("cuda", Role::Leaf, "", "cuMemAlloc (--upstream cuda|async, --features cuda)")
    },
    Name {
        cuda: true,
        ..name("async", Role::Leaf, "", "cuMemAllocAsync's pool (--upstream cuda|async, --features cuda)")
    },
    Name {
        keys: &[
            ("initial", "bytes taken when made"),
            ("max", "the most bytes it holds"),
            ("growth", "double, default, or N: grow by 1/N of the pool in steps of granule"),
            ("granule", "the step of growth (default 32 MiB)"),
            (
                "release",
                "true|false|peak: give wholly free chunks back before growing (default true), or only past the peak in use",
            ),
            (
                "large",
                "requests of at least this many bytes get chunks of their own (default none)",
            ),
            ("per_stream", "true|false: one pool per stream, as PyTorch's allocator"),
        ],
        ..name(
            "pool",
            Role::Resource,
            "upstream",
            "CoalescingPool: best fit over chunks, free neighbours merged",
        )
    },
    Name {
        keys: &[
            ("size", "the block size (default 1 MiB), or as the second argument"),
            ("blocks", "blocks per chunk (default 128)"),
        ],
        ..name("fixed", Role::Resource, "upstream[, size]", "FixedSizeResource: blocks of one size")
    },
    Name {
        keys: &[
            ("min_bin", "the smallest bin's bytes, a power of two (default 256 KiB)"),
            ("max_bin", "the largest bin's bytes, a power of two (default 4 MiB)"),
            ("powers", "false: no power-of-two bins, only those given (default: powers unless bins are given)"),
        ],
        ..name(
            "binning",
            Role::Resource,
            "upstream, bin(SIZE), bin(SIZE, RESOURCE)...",
            "BinningResource: a fixed-size bin per power of two, larger requests to the upstream",
        )
    },
    Name {
        keys: &[
            ("initial", "bytes of the global arena when made"),
            ("max", "the most bytes it holds"),
            ("superblock", "the superblock's bytes"),
            ("max_arenas", "slots of the table of arenas, streams and threads with blocks live at once (default 64)"),
        ],
        ..name(
            "arena",
            Role::Resource,
            "upstream",
            "ArenaResource: RMM's arena, per-thread arenas over a global one",
        )
    },
    name(
        "stream",
        Role::Adaptor,
        "upstream",
        "StreamOrdered: per-stream free lists, blocks moved between streams by events",
    ),
    name("stats", Role::Adaptor, "upstream", "Statistics: counts bytes and blocks, current and peak"),
    Name {
        keys: &[("backtraces", "true: a backtrace of each allocation, in its report")],
        ..name("track", Role::Adaptor, "upstream", "Tracking: keeps every live block")
    },
    name(
        "planned",
        Role::Adaptor,
        "upstream",
        "Planned: each step laid out from the last (in replay each pass is a step)",
    ),
    Name {
        keys: &[("bytes", "the limit, or as the second argument")],
        ..name("limit", Role::Adaptor, "upstream, bytes", "Limiting: refuses what would pass a limit")
    },
    Name {
        keys: &[
            ("alignment", "the alignment of large requests"),
            ("threshold", "requests of at least this many bytes are aligned"),
        ],
        ..name("align", Role::Adaptor, "upstream", "Aligned: a larger alignment above a threshold")
    },
    Name {
        keys: &[("file", "the path of the log (RMM's CSV format)")],
        ..name(
            "log",
            Role::Adaptor,
            "upstream, file=PATH",
            "Logging: every allocation and free to a file (the first timed pass)",
        )
    },
];

/// The entry of `name`.
pub fn find(name: &str) -> Option<&'static Name> {
    NAMES.iter().find(|n| n.name == name)
}

/// The candidate nearest to `word`, if one is near enough to be a typo;
/// case is no part of the distance, since names are lower case and a name
/// typed in capitals is the commonest slip.
///
/// ```
/// use memres_bench::names::nearest;
/// assert_eq!(nearest("poool", ["pool", "fixed"]), Some("pool"));
/// assert_eq!(nearest("POOL", ["pool", "fixed"]), Some("pool"));
/// assert_eq!(nearest("zzz", ["pool", "fixed"]), None);
/// ```
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(2);
    let word = word.to_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(&word, &c.to_lowercase()), c))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// `known` listed, and the nearest to `word` suggested.
pub fn hint<'a>(word: &str, known: impl IntoIterator<Item = &'a str> + Clone) -> String {
    let list: Vec<&str> = known.clone().into_iter().collect();
    let mut out = format!(" (valid: {})", list.join(", "));
    if let Some(n) = nearest(word, known) {
        out.push_str(&format!("; did you mean `{n}`?"));
    }
    out
}

/// The call whose `key=` argument sits at byte `pos`.
fn call_with_key_at(call: &Call, pos: usize) -> Option<&Call> {
    if call.args.iter().any(|a| a.key.is_some() && a.key_pos == pos) {
        return Some(call);
    }
    call.args.iter().find_map(|a| match &a.value {
        Value::Call(inner) => call_with_key_at(inner, pos),
        _ => None,
    })
}

/// The message for a stack that does not build: the error, and for an
/// unknown name or key the valid ones and the nearest.
///
/// ```
/// use memres_bench::names::explain;
/// let e = memres_core::stack::parse("pool(sim, inital=1GiB)").and_then(|c| {
///     memres_bench::stack::builder().build_call(&c, &memres_sim::SimWorld::new().default_stream()).map(|_| ())
/// }).unwrap_err();
/// assert!(explain("pool(sim, inital=1GiB)", &e).ends_with("did you mean `initial`?"));
/// ```
pub fn explain(text: &str, e: &StackError) -> String {
    let mut out = format!("stack `{text}`: {e}");
    match &e.kind {
        StackErrorKind::UnknownName(n) => {
            out.push_str(&hint(
                n,
                NAMES.iter().filter(|n| !n.cuda || cfg!(feature = "cuda")).map(|n| n.name),
            ));
        }
        StackErrorKind::UnknownKey(k) => {
            let call = parse(text).ok();
            let keys = call.as_ref().and_then(|c| call_with_key_at(c, e.pos)).and_then(|c| find(&c.name));
            match keys {
                Some(entry) if entry.keys.is_empty() => {
                    out.push_str(&format!(" (`{}` takes no keys)", entry.name));
                }
                Some(entry) => out.push_str(&hint(k, entry.keys.iter().map(|&(k, _)| k))),
                None => {}
            }
        }
        _ => {}
    }
    out
}

/// The listing of `memres stacks`.
pub fn listing() -> String {
    let mut out = String::from(
        "Stack strings nest calls: NAME(upstream, key=value, ...), e.g. stats(pool(sim, initial=1GiB)).\n\
         Sizes: 4096, 64K, 64KiB, 64KB (10^3), 1m, 2GiB, 2GB (10^9); any case.\n",
    );
    for (role, title) in [(Role::Leaf, "leaves"), (Role::Resource, "resources"), (Role::Adaptor, "adaptors")]
    {
        out.push_str(&format!("\n{title}:\n"));
        for n in NAMES.iter().filter(|n| n.role == role) {
            let call = if n.args.is_empty() { n.name.to_string() } else { format!("{}({})", n.name, n.args) };
            out.push_str(&format!("  {call:<28} {}\n", n.help));
            for (k, help) in n.keys {
                out.push_str(&format!("      {:<24} {help}\n", format!("{k}=")));
            }
        }
    }
    out
}
