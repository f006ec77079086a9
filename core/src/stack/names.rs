//! The core's names: its resources and adaptors as constructors of a
//! [`StackBuilder`], and the readers of their arguments, which code that
//! builds the same resources typed (the replay tool) shares.

use super::release::BinningLayer;
use super::{Call, Context, StackBuilder, StackError, StackErrorKind, Value};
use crate::adaptor::{Aligned, Limiting, Statistics, Tracking};
use crate::arena::{ArenaConfig, ArenaResource};
use crate::binning::BinningResource;
use crate::fixed::{FixedConfig, FixedSizeResource};
use crate::per_stream::{PerStreamPool, PoolMaker};
use crate::planned::Planned;
use crate::pool::{CoalescingPool, Growth, PoolConfig};
use crate::primitive::{AtomicU64, Ordering::Relaxed};
use crate::{Block, DynResource, Error, MemoryResource, Request, Result, Shared, Stream};
use alloc::format;
use alloc::sync::Arc;

/// Registers the core's names in `b`.
pub(super) fn register<S: Stream + ?Sized + 'static>(b: &mut StackBuilder<S>)
where
    S::Event: Send,
{
    // Each constructor builds its upstreams, a level of the stack's
    // recursion, then makes its resource `out_of_line`: the resources are
    // large (a pool 16 KiB, an arena 8 KiB, moved a few times as they are
    // made and kept), and made in the constructor's own frame they took that
    // much of the thread's stack for every level under them (MAX_DEPTH).
    b.register("pool", |call, cx| {
        let config = pool_config(call)?;
        let upstream = cx.upstream(call, 0)?;
        if call.bool_arg("per_stream")? == Some(true) {
            return out_of_line(|| per_stream_pool(call, cx, upstream, config));
        }
        out_of_line(|| {
            let pool = CoalescingPool::with_config(upstream, config, cx.stream)
                .map_err(|e| call.resource_error(e))?;
            Ok(cx.keep_releasing(call, Shared::new(pool)))
        })
    });
    b.register("fixed", |call, cx| {
        let config = fixed_config(call)?;
        let upstream = cx.upstream(call, 0)?;
        out_of_line(|| {
            let fixed = FixedSizeResource::with_config(upstream, config, cx.stream)
                .map_err(|e| call.resource_error(e))?;
            Ok(cx.keep_releasing(call, Shared::new(fixed)))
        })
    });
    b.register("binning", |call, cx| {
        let given = binning_bins(call)?;
        let powers = binning_exponents(call)?;
        let upstream = cx.upstream(call, 0)?;
        // The bins' resources are built before the binning resource is made.
        // The counted bins whose resources keep no layer: no layer but this
        // one counts their blocks.
        let mut own = alloc::vec::Vec::new();
        let mut bins = alloc::vec::Vec::with_capacity(given.len());
        for (size, bin) in given {
            let resource = match bin {
                None => None,
                Some(bin) => {
                    let kept = cx.layers_kept();
                    let resource = cx.upstream(bin, 1)?;
                    if cx.layers_kept() == kept {
                        own.push(size);
                    }
                    Some(resource)
                }
            };
            bins.push((size, resource));
        }
        out_of_line(|| keep_binning(call, cx, upstream, powers, bins, own))
    });
    b.register("arena", |call, cx| {
        let config = arena_config(call)?;
        let upstream = cx.upstream(call, 0)?;
        out_of_line(|| {
            let arena = ArenaResource::with_config(upstream, config, cx.stream)
                .map_err(|e| call.resource_error(e))?;
            Ok(cx.keep_releasing(call, arena))
        })
    });
    b.register("stats", |call, cx| {
        call.expect_args(1, &[])?;
        let upstream = cx.upstream(call, 0)?;
        out_of_line(|| Ok(cx.keep(call, Statistics::new(upstream))))
    });
    b.register("track", |call, cx| {
        call.expect_args(1, &["backtraces", "report_leaks"])?;
        let backtraces = call.bool_arg("backtraces")?.unwrap_or(false);
        let report_leaks = call.bool_arg("report_leaks")?.unwrap_or(true);
        #[cfg(not(feature = "std"))]
        if backtraces {
            let pos = call.keyed("backtraces").map_or(call.pos, |v| v.pos());
            return Err(StackError::new(
                pos,
                StackErrorKind::BadValue("backtraces need the feature `std`".into()),
            ));
        }
        let upstream = cx.upstream(call, 0)?;
        out_of_line(|| {
            let tracking = Tracking::new(upstream);
            // Said nowhere, as RMM's: what stays outstanding at the drop.
            let tracking = if report_leaks { tracking } else { tracking.on_leak(|_| {}) };
            #[cfg(feature = "std")]
            let tracking = tracking.with_backtraces(backtraces);
            Ok(cx.keep(call, tracking))
        })
    });
    b.register("planned", |call, cx| {
        call.expect_args(1, &[])?;
        let upstream = cx.upstream(call, 0)?;
        out_of_line(|| Ok(cx.keep_releasing(call, Planned::new(upstream))))
    });
    b.register("limit", |call, cx| {
        call.expect_args(2, &["bytes"])?;
        call.resource(0)?;
        let bytes = one_of(call, 1, "bytes")?
            .ok_or_else(|| call.error(StackErrorKind::MissingArg("the limit in bytes")))?
            .size()?;
        let upstream = cx.upstream(call, 0)?;
        out_of_line(|| Ok(cx.keep(call, Limiting::new(upstream, bytes))))
    });
    b.register("align", |call, cx| {
        call.expect_args(1, &["alignment", "threshold"])?;
        let alignment = call.size_arg("alignment")?.unwrap_or(Aligned::<()>::DEFAULT_ALIGNMENT);
        let threshold = call.size_arg("threshold")?.unwrap_or(Aligned::<()>::DEFAULT_THRESHOLD);
        let upstream = cx.upstream(call, 0)?;
        out_of_line(|| {
            let aligned = Aligned::new(upstream, alignment, threshold).map_err(|e| {
                let pos = call.keyed("alignment").map_or(call.pos, |v| v.pos());
                StackError::new(pos, StackErrorKind::Resource(e))
            })?;
            Ok(cx.keep(call, aligned))
        })
    });
    #[cfg(feature = "std")]
    b.register("log", |call, cx| {
        let file = log_file(call)?;
        let upstream = cx.upstream(call, 0)?;
        out_of_line(|| keep_log(call, cx, file, upstream))
    });
}

/// Runs `make` in a frame of its own, popped before the caller returns:
/// what it makes takes the stack only while it is made, not for every
/// level of a build's recursion under the caller.
#[inline(never)]
fn out_of_line<T>(make: impl FnOnce() -> T) -> T {
    make()
}

/// The `log` layer over `upstream`, its file made once the whole stack is
/// built: a stack refused after this layer was built (an outer layer's
/// argument, a pool's initial size out of memory, another log file that
/// cannot be opened or written) leaves the file as it was. What the layer logs
/// meanwhile (that initial allocation) is held and written after the
/// header.
#[cfg(feature = "std")]
fn keep_log<S: Stream + ?Sized + 'static>(
    call: &Call,
    cx: &Context<'_, S>,
    file: &Value,
    upstream: DynResource<S>,
) -> Result<DynResource<S>, StackError> {
    let (path, pos) = (alloc::string::String::from(file.text()?), file.pos());
    let log = cx.kept(call, crate::adaptor::Logging::held(upstream));
    let held = log.clone();
    // Opened, and its first write tried, with every other log file of the
    // stack before any is cut.
    cx.when_built(move || {
        let mut file = crate::adaptor::LogFile::open(path.as_ref()).map_err(|e| log_error(pos, &path, e))?;
        held.try_held(&mut file).map_err(|e| log_error(pos, &path, e))?;
        Ok(move || held.start_held(file).map_err(|e| log_error(pos, &path, e)))
    });
    Ok(log)
}

/// The error of a log file that cannot be made.
#[cfg(feature = "std")]
fn log_error(pos: usize, path: &str, e: std::io::Error) -> StackError {
    StackError::new(pos, StackErrorKind::Io(format!("cannot log to `{path}`: {e}")))
}

/// A bin given to `binning`: its size, and its resource if it names one.
type GivenBin<S> = (u64, Option<DynResource<S>>);

/// The `binning` resource over `upstream`: a fixed bin for each power of
/// two from `powers` that no bin given replaces, and the bins given
/// (`bins`, their resources built), kept with the counted bins of its own.
fn keep_binning<S: Stream + ?Sized + 'static>(
    call: &Call,
    cx: &Context<'_, S>,
    upstream: DynResource<S>,
    powers: Option<(u32, u32)>,
    bins: alloc::vec::Vec<GivenBin<S>>,
    own: alloc::vec::Vec<u64>,
) -> Result<DynResource<S>, StackError>
where
    S::Event: Send,
{
    let mut binning = BinningResource::<'static, DynResource<S>, S>::new(upstream);
    // A refusal (which `binning_exponents` and `binning_bins` leave none
    // of) at what asked for the bin: `max_bin=` or `min_bin=` for a power
    // of two, else the call; a bin's size for a bin given.
    let powers_at = call.keyed("max_bin").or(call.keyed("min_bin")).map_or(call.pos, Value::pos);
    let size_at = |i: usize| {
        let bin = call.positional(i + 1).and_then(|v| v.call().ok());
        bin.and_then(|b| b.positional(0)).map_or(call.pos, Value::pos)
    };
    // A bin given for a size replaces the power of two of that size.
    for e in powers.into_iter().flat_map(|(min, max)| min..=max) {
        if !bins.iter().any(|&(size, _)| size == 1 << e) {
            binning
                .add_fixed_bin(FixedConfig::new(1 << e))
                .map_err(|e| StackError::new(powers_at, StackErrorKind::Resource(e)))?;
        }
    }
    // Added from the smallest up: each goes at the end of the sorted table
    // (before at most the powers of two), where the text's order, largest
    // first, shifted the whole table at every bin.
    let mut bins: alloc::vec::Vec<_> = bins.into_iter().enumerate().collect();
    bins.sort_unstable_by_key(|&(_, (size, _))| size);
    for (i, (size, bin)) in bins {
        let added = match bin {
            None => binning.add_fixed_bin(FixedConfig::new(size)),
            Some(resource) => binning.add_counted_bin(size, resource),
        };
        added.map_err(|e| StackError::new(size_at(i), StackErrorKind::Resource(e)))?;
    }
    Ok(cx.keep_releasing_as(call, binning, |bins| Arc::new(BinningLayer { bins, own })))
}

// Every name above but `binning` (whose bins may be any resource) builds a
// layer that forwards `MemoryOf` from its upstream: checked here by the
// compiler, with an upstream promised by hand standing for the one a stack
// of such leaves is. A caller that knows every leaf of a stack is memory of
// an engine (the Python package's buffers) relies on it.
const _: fn() = || {
    use crate::copy::{AssumeMemoryOf, MemoryOf};
    struct Engine;
    type Up = AssumeMemoryOf<DynResource<()>, Engine>;
    fn forwards<R: MemoryOf<Engine>>() {}
    forwards::<Shared<CoalescingPool<Up>>>();
    // The builder's upstreams are `DynResource`s, `Arc`s as this one.
    forwards::<Shared<PerStreamPool<PoolMaker<alloc::sync::Arc<Up>>, ()>>>();
    forwards::<Shared<FixedSizeResource<Up>>>();
    forwards::<ArenaResource<Up>>();
    forwards::<Statistics<Up>>();
    forwards::<Tracking<Up>>();
    forwards::<Planned<Up>>();
    forwards::<Limiting<Up>>();
    forwards::<Aligned<Up>>();
    #[cfg(feature = "std")]
    forwards::<crate::adaptor::Logging<Up>>();
};

/// The value given either as the `i`th positional argument or as `key=`,
/// if either.
///
/// # Errors
///
/// [`StackErrorKind::DuplicateKey`] at the keyed value when both are given.
///
/// ```
/// use memres_core::stack::{one_of, parse};
/// let c = parse("limit(sim, bytes=2GiB)")?;
/// assert_eq!(one_of(&c, 1, "bytes")?.unwrap().size()?, 2 << 30);
/// assert!(one_of(&parse("limit(sim, 1G, bytes=2G)")?, 1, "bytes").is_err());
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn one_of<'c>(call: &'c Call, i: usize, key: &str) -> Result<Option<&'c Value>, StackError> {
    match (call.positional(i), call.keyed(key)) {
        (Some(_), Some(v)) => Err(StackError::new(v.pos(), StackErrorKind::DuplicateKey(key.into()))),
        (Some(v), None) | (None, Some(v)) => Ok(Some(v)),
        (None, None) => Ok(None),
    }
}

/// The configuration of `pool(UP, initial=, max=, growth=double|default|N,
/// granule=, release=true|false|peak, large=SIZE|none, per_stream=true|false)`, its keys checked
/// (`per_stream=` is the caller's to read).
///
/// # Errors
///
/// An unknown key, a bad size, growth or granule, at its position.
///
/// ```
/// use memres_core::pool::{Growth, PoolConfig};
/// use memres_core::stack::{parse, pool_config};
/// let c = pool_config(&parse("pool(sim, initial=1GiB, growth=4, granule=1MiB)")?)?;
/// assert_eq!(c, PoolConfig::new().initial_size(1 << 30).growth(Growth::Fraction { divisor: 4, granule: 1 << 20 }));
/// assert!(pool_config(&parse("pool(sim, growth=0)")?).is_err());
/// assert_eq!(pool_config(&parse("pool(sim, large=8MiB)")?)?, PoolConfig::new().large_threshold(8 << 20));
/// let compact = "pool(sim, growth=32, granule=2MiB, large=16MiB, release=peak)";
/// assert_eq!(pool_config(&parse(compact)?)?, PoolConfig::compact());
/// assert_eq!(pool_config(&parse("pool(sim, large=none)")?)?, PoolConfig::new().large_threshold(u64::MAX));
/// assert!(pool_config(&parse("pool(sim, large=big)")?).is_err());
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn pool_config(call: &Call) -> Result<PoolConfig, StackError> {
    call.expect_args(1, &["initial", "max", "growth", "granule", "release", "large", "per_stream"])?;
    let mut config = PoolConfig::new();
    if let Some(initial) = call.size_arg("initial")? {
        config = config.initial_size(initial);
    }
    if let Some(max) = call.size_arg("max")? {
        config = config.maximum_size(max);
    }
    let granule = granule_arg(call, Growth::DEFAULT_GRANULE)?;
    let growth = call.keyed("growth").map(|g| g.text().map(|text| (g.pos(), text))).transpose()?;
    let growth = match growth {
        None | Some((_, "default")) => Growth::Fraction { divisor: Growth::DEFAULT_DIVISOR, granule },
        Some((_, "double")) => match call.keyed("granule") {
            Some(v) => {
                return Err(StackError::new(
                    v.pos(),
                    StackErrorKind::BadValue("granule= sizes fractional growth, not growth=double".into()),
                ))
            }
            None => Growth::Double,
        },
        Some((pos, text)) => match super::parse::whole_u32(text) {
            Some(divisor) if divisor > 0 => Growth::Fraction { divisor, granule },
            _ => {
                return Err(StackError::new(
                    pos,
                    StackErrorKind::BadValue(format!(
                        "growth `{text}`: double, default or a divisor from 1 to {}",
                        u32::MAX
                    )),
                ))
            }
        },
    };
    config = config.growth(growth);
    match call.keyed("release") {
        Some(v) if v.text().ok() == Some("peak") => {
            config = config.release_on_grow(true).keep_under_peak(true)
        }
        Some(v) => {
            let on = call.bool_arg("release").map_err(|_| {
                StackError::new(
                    v.pos(),
                    StackErrorKind::BadValue(format!(
                        "release `{}`: true, false or peak",
                        v.text().unwrap_or("")
                    )),
                )
            })?;
            config = config.release_on_grow(on.unwrap_or(true))
        }
        None => {}
    }
    match call.keyed("large") {
        Some(v) if v.text().ok() == Some("none") => config = config.large_threshold(u64::MAX),
        Some(v) => config = config.large_threshold(v.size()?),
        None => {}
    }
    // Refused at the value its message names, as the arena's sizes are:
    // the pool's own check names no key.
    config.validate().map_err(|e| {
        let key = match e {
            Error::InvalidConfig { what } if what.starts_with("initial") => call.keyed("initial"),
            Error::InvalidConfig { what } if what.starts_with("maximum") => call.keyed("max"),
            Error::InvalidConfig { what } if what.starts_with("growth") => {
                call.keyed("granule").or(call.keyed("growth"))
            }
            _ => None,
        };
        refused_at(call, key, e)
    })?;
    Ok(config)
}

/// `e`, what a resource refuses of its configuration, at `value` (the one
/// its message names), else at the call's name.
fn refused_at(call: &Call, value: Option<&Value>, e: Error) -> StackError {
    StackError::new(value.map_or(call.pos, Value::pos), StackErrorKind::Resource(e))
}

/// `pool(UP, per_stream=true, ...)`: a [`PerStreamPool`] of pools with
/// `config` over `upstream`; the initial size, if any, is the pool of the
/// build stream.
fn per_stream_pool<S: Stream + ?Sized + 'static>(
    call: &Call,
    cx: &Context<'_, S>,
    upstream: DynResource<S>,
    config: PoolConfig,
) -> Result<DynResource<S>, StackError>
where
    S::Event: Send,
{
    if let Some(v) = call.keyed("max") {
        return Err(StackError::new(
            v.pos(),
            StackErrorKind::BadValue(
                "max= bounds one pool, and per_stream=true makes one per stream: \
                 limit the upstream instead, as in pool(limit(async, 4GiB), per_stream=true)"
                    .into(),
            ),
        ));
    }
    let initial = call.size_arg("initial")?.unwrap_or(0);
    let maker = PoolMaker::with_config(upstream, config.initial_size(0))
        .and_then(|m| m.first_initial_size(initial))
        .map_err(|e| call.resource_error(e))?;
    let mut pools = PerStreamPool::new(maker);
    if initial > 0 {
        pools.make_pool(cx.stream).map_err(|e| call.resource_error(e))?;
    }
    Ok(cx.keep_releasing(call, Shared::new(pools)))
}

/// The chunk or page granule given as `granule=`, else `default`.
///
/// # Errors
///
/// A bad size, or one that is not a power of two of at least 256, at the
/// value.
///
/// ```
/// use memres_core::stack::{granule_arg, parse};
/// assert_eq!(granule_arg(&parse("pool(sim, granule=1MiB)")?, 4096)?, 1 << 20);
/// assert_eq!(granule_arg(&parse("pool(sim)")?, 4096)?, 4096);
/// assert!(granule_arg(&parse("pool(sim, granule=3000)")?, 4096).is_err());
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn granule_arg(call: &Call, default: u64) -> Result<u64, StackError> {
    let granule = call.size_arg("granule")?.unwrap_or(default);
    if !granule.is_power_of_two() || granule < 256 {
        let pos = call.keyed("granule").map_or(call.pos, |v| v.pos());
        return Err(StackError::new(
            pos,
            StackErrorKind::BadValue(format!("granule {granule}: a power of two of at least 256")),
        ));
    }
    Ok(granule)
}

/// The configuration of `fixed(UP, size, blocks=)`: blocks of `size` bytes
/// (or `size=`; default 1 MiB), `blocks=` per chunk (default 128; more than
/// [`FixedConfig::MAX_BLOCKS_PER_CHUNK`] is refused when the layer is built).
///
/// # Errors
///
/// A missing upstream, an unknown key, a size given twice, a bad size or
/// count, at its position.
///
/// ```
/// use memres_core::fixed::FixedConfig;
/// use memres_core::stack::{fixed_config, parse};
/// assert_eq!(fixed_config(&parse("fixed(sim, 64KiB, blocks=16)")?)?, FixedConfig::new(64 << 10).blocks_per_chunk(16));
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn fixed_config(call: &Call) -> Result<FixedConfig, StackError> {
    call.expect_args(2, &["size", "blocks"])?;
    call.resource(0)?;
    let mut config = FixedConfig::new(fixed_block_size(call)?);
    if let Some(blocks) = call.u32_arg("blocks", "a whole number")? {
        config = config.blocks_per_chunk(blocks);
    }
    // At the value its message names (a chunk too large: at `blocks=`
    // where given, else at the size).
    config.validate().map_err(|e| {
        let size = one_of(call, 1, "size").ok().flatten();
        let key = match e {
            Error::InvalidConfig { what } if what.starts_with("block size") => size,
            Error::InvalidConfig { what } if what.starts_with("blocks") => call.keyed("blocks"),
            Error::InvalidConfig { what } if what.starts_with("chunk size") => call.keyed("blocks").or(size),
            _ => None,
        };
        refused_at(call, key, e)
    })?;
    Ok(config)
}

/// The block size of a `fixed` call: its `size` or `size=`, else 1 MiB.
///
/// # Errors
///
/// A size given twice or a bad size, at its position.
///
/// ```
/// use memres_core::stack::{fixed_block_size, parse};
/// assert_eq!(fixed_block_size(&parse("fixed(sim, size=64KiB)")?)?, 64 << 10);
/// assert_eq!(fixed_block_size(&parse("fixed(sim)")?)?, 1 << 20);
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn fixed_block_size(call: &Call) -> Result<u64, StackError> {
    Ok(one_of(call, 1, "size")?.map(Value::size).transpose()?.unwrap_or(FixedConfig::DEFAULT_BLOCK_SIZE))
}

/// The largest block size of a fixed-size bin (a power of two, or a bin
/// given without a resource), 2^55 bytes: its chunk of
/// [`FixedConfig::DEFAULT_BLOCKS_PER_CHUNK`] blocks is a request, at most
/// [`Request::MAX_SIZE`].
const LARGEST_FIXED_BIN: u64 = Request::MAX_SIZE / FixedConfig::DEFAULT_BLOCKS_PER_CHUNK as u64;

/// Why a fixed-size bin above [`LARGEST_FIXED_BIN`] is refused.
const TOO_LARGE_FOR_A_FIXED_BIN: &str =
    "too large for a fixed-size bin, at most 36028797018963968 (2^55): its chunk of 128 blocks must fit in a request";

const _: () = assert!(LARGEST_FIXED_BIN == 1 << 55 && FixedConfig::DEFAULT_BLOCKS_PER_CHUNK == 128);

/// The power-of-two bins of `binning(UP, ..., min_bin=, max_bin=,
/// powers=)`, as the exponents of [`BinningResource::with_exponents`]:
/// the smallest and the largest bin size in bytes, each a power of two of
/// at least 256 (defaults 256 KiB and 4 MiB, as RMM's harness); `None`
/// where it has none: with `powers=false` (RMM's binning resource made
/// without exponents, whose bins are those added), or with bins given
/// (`binning_bins`) and neither key.
///
/// # Errors
///
/// An unknown key, a bad size or one that is not a power of two of at
/// least 256 or is above 2^55 (the largest fixed-size bin, whose chunk of
/// 128 blocks is a request), `min_bin=` above `max_bin=`, or either beside
/// `powers=false`, at its position.
///
/// ```
/// use memres_core::stack::{binning_exponents, parse};
/// assert_eq!(binning_exponents(&parse("binning(sim, max_bin=1MiB)")?)?, Some((18, 20)));
/// assert_eq!(binning_exponents(&parse("binning(sim, bin(768))")?)?, None);
/// assert_eq!(binning_exponents(&parse("binning(sim, bin(768), powers=true)")?)?, Some((18, 22)));
/// assert_eq!(binning_exponents(&parse("binning(sim, powers=false)")?)?, None);
/// assert!(binning_exponents(&parse("binning(sim, min_bin=3000)")?).is_err());
/// assert!(binning_exponents(&parse("binning(sim, powers=false, max_bin=1MiB)")?).is_err());
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn binning_exponents(call: &Call) -> Result<Option<(u32, u32)>, StackError> {
    // The upstream, then the bins given (`binning_bins`).
    call.expect_args(usize::MAX, &["min_bin", "max_bin", "powers"])?;
    let exponent = |key: &str, default: u32| -> Result<u32, StackError> {
        let Some(v) = call.keyed(key) else { return Ok(default) };
        let what = match v.size()? {
            size if !size.is_power_of_two() || size < 256 => {
                format!("{key} {size}: a power of two of at least 256 bytes")
            }
            size if size > LARGEST_FIXED_BIN => format!("{key} {size}: {TOO_LARGE_FOR_A_FIXED_BIN}"),
            size => return Ok(size.trailing_zeros()),
        };
        Err(StackError::new(v.pos(), StackErrorKind::BadValue(what)))
    };
    let (min, max) = (exponent("min_bin", 18)?, exponent("max_bin", 22)?);
    if min > max {
        // Said here in the text's terms: `with_exponents` speaks of exponents.
        let pos = call.keyed("min_bin").or(call.keyed("max_bin")).map_or(call.pos, |v| v.pos());
        return Err(StackError::new(
            pos,
            StackErrorKind::BadValue(format!("min_bin {} above max_bin {}", 1u64 << min, 1u64 << max)),
        ));
    }
    let asked = call.keyed("min_bin").or(call.keyed("max_bin"));
    match (call.bool_arg("powers")?, asked) {
        (Some(false), Some(v)) => Err(StackError::new(
            v.pos(),
            StackErrorKind::BadValue(
                "a smallest or largest bin beside powers=false (no power-of-two bins)".into(),
            ),
        )),
        (Some(false), None) => Ok(None),
        (Some(true), _) => Ok(Some((min, max))),
        (None, _) => {
            let bins_given = call.args.iter().filter(|a| a.key.is_none()).count() > 1;
            Ok((!bins_given || asked.is_some()).then_some((min, max)))
        }
    }
}

/// The bins given to `binning(UP, bin(SIZE), bin(SIZE, RESOURCE), ...)`,
/// in order: each size (bytes, a multiple of 256, each given once) with the
/// call of its `bin` when it names a resource (a bin served by it, whose
/// blocks the binning resource counts:
/// [`add_counted_bin`](BinningResource::add_counted_bin)), or `None` for a
/// fixed-size bin over the upstream, as RMM's `add_bin` with and without a
/// resource.
///
/// # Errors
///
/// A positional argument after the upstream that is not a `bin` call, a
/// `bin` without a size, with a key or more than two arguments, a size
/// that is not a non-zero multiple of 256, above 2^55 for a fixed-size bin
/// (its chunk of 128 blocks is a request) or above [`Request::MAX_SIZE`]
/// for a bin with a resource, or a size given twice, at its position.
///
/// # Time Complexity
///
/// O(n log n) for n bins.
///
/// ```
/// use memres_core::stack::{binning_bins, parse};
/// let call = parse("binning(sim, bin(1KiB), bin(128MiB, pool(sim)))")?;
/// let bins = binning_bins(&call)?;
/// assert_eq!(bins.iter().map(|b| b.0).collect::<Vec<_>>(), [1 << 10, 128 << 20]);
/// assert_eq!(bins[1].1.map(|c| c.resource(1).unwrap().name.as_str()), Some("pool"));
/// assert!(binning_bins(&parse("binning(sim, bin(1000))")?).is_err());
/// assert!(binning_bins(&parse("binning(sim, pool(sim))")?).is_err());
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn binning_bins(call: &Call) -> Result<alloc::vec::Vec<(u64, Option<&Call>)>, StackError> {
    let mut bins = alloc::vec::Vec::new();
    // The sizes so far, for "given twice" in log time: a scan of `bins`
    // made thousands of bins quadratic.
    let mut seen = alloc::collections::BTreeSet::new();
    for value in call.args.iter().filter(|a| a.key.is_none()).skip(1).map(|a| &a.value) {
        let bin = value.call()?;
        if bin.name != "bin" {
            return Err(StackError::new(
                bin.pos,
                StackErrorKind::WrongKind("a bin, `bin(SIZE)` or `bin(SIZE, RESOURCE)`"),
            ));
        }
        bin.expect_args(2, &[])?;
        let at = bin.positional(0).ok_or_else(|| bin.error(StackErrorKind::MissingArg("the bin's size")))?;
        let size = at.size()?;
        let bad = |what: &str| {
            StackError::new(at.pos(), StackErrorKind::BadValue(format!("bin size {size}: {what}")))
        };
        if size == 0 || size % 256 != 0 {
            return Err(bad("a non-zero multiple of 256 bytes"));
        }
        let served = bin.positional(1).is_some();
        if !served && size > LARGEST_FIXED_BIN {
            return Err(bad(TOO_LARGE_FOR_A_FIXED_BIN));
        }
        if served && size > Request::MAX_SIZE {
            return Err(bad(&format!("too large, above {}, the largest request", Request::MAX_SIZE)));
        }
        if !seen.insert(size) {
            return Err(bad("given twice"));
        }
        bins.push((size, served.then_some(bin)));
    }
    Ok(bins)
}

/// The configuration of `arena(UP, initial=, max=, superblock=,
/// max_arenas=)`: each size a multiple of 256 bytes, the superblock from
/// 1 MiB to 1 TiB (8 MiB by default), the maximum at least the initial size
/// and the superblock, the slots of the table of arenas from 1 to
/// [`MAX_ARENAS`](crate::arena::MAX_ARENAS) (64 by default).
/// A superblock above [`ArenaConfig::DEFAULT_CHUNK_SIZE`] makes the chunk,
/// the global arena's smallest growth, its size: a chunk holds whole
/// superblocks.
///
/// # Errors
///
/// An unknown key, a bad size, or a size the arena refuses, at its value
/// (a maximum below the initial size or the superblock: at `max=`).
///
/// ```
/// use memres_core::stack::{arena_config, parse};
/// assert_eq!(arena_config(&parse("arena(sim, max=1GiB)")?)?.maximum(), Some(1 << 30));
/// assert_eq!(arena_config(&parse("arena(sim, max_arenas=200)")?)?.slots(), 200);
/// assert!(arena_config(&parse("arena(sim, superblock=lots)")?).is_err());
/// assert!(arena_config(&parse("arena(sim, max_arenas=256)")?).is_err());
/// let e = arena_config(&parse("arena(sim, superblock=1000000)")?).unwrap_err();
/// assert_eq!(e.to_string(), "at byte 22: bad value: superblock 1000000: a multiple of 256 bytes from 1 MiB to 1 TiB");
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn arena_config(call: &Call) -> Result<ArenaConfig, StackError> {
    call.expect_args(1, &["initial", "max", "superblock", "max_arenas"])?;
    // Checked here, at each value and in the text's terms: the arena's own
    // check names no key, and one of its messages covers several.
    let bad = |key: &str, what: alloc::string::String| {
        let pos = call.keyed(key).map_or(call.pos, |v| v.pos());
        StackError::new(pos, StackErrorKind::BadValue(what))
    };
    let mut config = ArenaConfig::new();
    if let Some(initial) = call.size_arg("initial")? {
        if initial % 256 != 0 || initial > Request::MAX_SIZE {
            let what = format!("initial {initial}: a multiple of 256 bytes of at most {}", Request::MAX_SIZE);
            return Err(bad("initial", what));
        }
        config = config.initial_size(initial);
    }
    let superblock = call.size_arg("superblock")?;
    if let Some(sb) = superblock {
        if sb % 256 != 0 || !(1 << 20..=1 << 40).contains(&sb) {
            return Err(bad(
                "superblock",
                format!("superblock {sb}: a multiple of 256 bytes from 1 MiB to 1 TiB"),
            ));
        }
        // A chunk holds whole superblocks: one above the default chunk
        // makes the chunk its size.
        config = config.superblock_size(sb).chunk_size(sb.max(ArenaConfig::DEFAULT_CHUNK_SIZE));
    }
    if let Some(max) = call.size_arg("max")? {
        let initial = call.size_arg("initial")?.unwrap_or(0);
        let sb = superblock.unwrap_or(ArenaConfig::DEFAULT_SUPERBLOCK_SIZE);
        let refused = if max % 256 != 0 {
            Some(format!("max {max}: a multiple of 256 bytes"))
        } else if max < initial {
            Some(format!("max {max} below initial {initial}"))
        } else if max < sb {
            // No superblock could be had: no small request could be served.
            let default = if superblock.is_none() { " (the default)" } else { "" };
            Some(format!("max {max} below superblock {sb}{default}"))
        } else {
            None
        };
        if let Some(what) = refused {
            return Err(bad("max", what));
        }
        config = config.maximum_size(max);
    }
    let slots = format!("from 1 to {}", crate::arena::MAX_ARENAS);
    if let Some(n) = call.u32_arg("max_arenas", &slots)? {
        if n == 0 || n > crate::arena::MAX_ARENAS {
            return Err(bad("max_arenas", format!("max_arenas {n}: {slots}")));
        }
        config = config.max_arenas(n);
    }
    Ok(config)
}

/// The `file=` of `log(UP, file=)`, its arguments checked.
///
/// # Errors
///
/// An unknown key, a positional argument after the upstream, or no `file=`.
///
/// ```
/// use memres_core::stack::{log_file, parse};
/// assert_eq!(log_file(&parse("log(sim, file=/tmp/x.csv)")?)?.text()?, "/tmp/x.csv");
/// assert!(log_file(&parse("log(sim)")?).is_err());
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn log_file(call: &Call) -> Result<&Value, StackError> {
    call.expect_args(1, &["file"])?;
    call.keyed("file").ok_or_else(|| call.error(StackErrorKind::MissingArg("file=")))
}

/// A leaf with no memory behind it: it hands out addresses from a counter,
/// never the same twice, and takes frees without looking. It stands in for
/// a device while a stack is only checked (a C caller's stack before any
/// device is touched), so that what a stack allocates as it is built (a
/// pool's initial size) succeeds whatever the size.
///
/// # Examples
///
/// ```
/// use memres_core::stack::Unbacked;
/// use memres_core::{MemoryResource, Request};
/// let leaf = Unbacked::new();
/// let a = leaf.allocate(Request::aligned(1000, 4096)?, &())?;
/// let b = leaf.allocate(Request::new(1 << 40)?, &())?;
/// assert!(a.addr() % 4096 == 0 && b.addr() >= a.addr() + 1024);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct Unbacked {
    /// The next address to hand out.
    next: AtomicU64,
}

impl Unbacked {
    /// Addresses from 4 GiB up, so that 0 is never one.
    pub fn new() -> Self {
        Unbacked { next: AtomicU64::new(1 << 32) }
    }
}

impl Default for Unbacked {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Stream + ?Sized> MemoryResource<S> for Unbacked {
    fn allocate(&self, request: Request, _: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        let span = request.rounded_size(256) + request.align();
        let start =
            self.next.fetch_update(Relaxed, Relaxed, |next| next.checked_add(span)).map_err(|_| {
                crate::Error::OutOfMemory {
                    requested: request.size(),
                    largest_free: 0,
                    pool_size: 0,
                    max_size: None,
                }
            })?;
        Ok(Block::new(start.next_multiple_of(request.align()), request.size(), 0))
    }

    fn deallocate(&self, _: Block, _: &S) -> Result<()> {
        Ok(())
    }
}
