//! Builds resource stacks from descriptions such as
//! `limit(stats(pool(sim, initial=1GiB, max=4GiB)), 2GiB)`.
//!
//! The parser is [`memres_core::stack`]; this module turns its tree into
//! resources through a registry of constructors, one per name:
//!
//! | name | arguments | resource |
//! | --- | --- | --- |
//! | `sim` | `[capacity]` (default 80 GiB) | [`SimDevice`] |
//! | `pool` | `upstream, initial=, max=, growth=double\|default\|N, granule=, release=true\|false, per_stream=true\|false` | [`CoalescingPool`] behind [`Shared`] (`N`: grow by 1/N of the pool in steps of `granule=`, default 32 MiB; `release=`: give wholly free chunks back before growing, default true); with `per_stream=true` a [`PerStreamPool`] of such pools behind [`Shared`], one per stream, stream-ordered (no `max=`: limit the upstream; `initial=` is the build stream's pool) |
//! | `stats` | `upstream` | [`Statistics`] |
//! | `track` | `upstream` | [`Tracking`] |
//! | `limit` | `upstream, bytes` (or `bytes=`) | [`Limiting`] |
//! | `align` | `upstream, alignment=, threshold=` | [`Aligned`] |
//! | `log` | `upstream, file=` | [`Logging`] to a file |
//! | `host` | | [`HostMemory`] |
//! | `fixed` | `upstream, size` (or `size=`, default 1 MiB), `blocks=` (per chunk, default 128) | [`FixedSizeResource`] behind [`Shared`] |
//! | `binning` | `upstream, min=, max=` (bin exponents, default 18 and 22: 256 KiB..4 MiB) | [`BinningResource::with_exponents`] |
//! | `arena` | `upstream, initial=, max=, superblock=` | [`ArenaResource`] |
//! | `vpool` | `sim` or `sim(physical)`, `reserve=` (64 GiB), `keep=` (all), `slack=` (40 permille), `granule=` (2 MiB) | [`VirtualPool`] over a [`SimAddressSpace`], behind [`Shared`] |
//! | `stream` | `upstream` | [`StreamOrdered`] behind [`Shared`], inner calls on the build stream (registered by [`StackBuilder::register_stream_layer`], for stream types that clone) |
//!
//! Other resources join with one [`StackBuilder::register`] call each.
//! [`StackBuilder::build_with_handles`] also hands back the typed
//! resources (to read a `stats` adaptor's figures, a `sim`'s peak...).
//!
//! # Examples
//!
//! ```
//! use memres_core::{MemoryResource, Request};
//! use memres_sim::StackBuilder;
//! let stack = StackBuilder::<()>::new().build("limit(stats(pool(sim, initial=1MiB)), 2MiB)", &())?;
//! let b = stack.allocate(Request::new(1 << 20)?, &())?;
//! assert!(stack.allocate(Request::new(2 << 20)?, &()).is_err());
//! stack.deallocate(b, &())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::{HostMemory, Logging, SimAddressSpace, SimDevice};
use memres_core::adaptor::{Aligned, Limiting, Statistics, Tracking};
use memres_core::arena::{ArenaConfig, ArenaResource};
use memres_core::binning::BinningResource;
use memres_core::fixed::{FixedConfig, FixedSizeResource};
use memres_core::per_stream::{PerStreamPool, PoolMaker};
use memres_core::pool::{CoalescingPool, Growth, PoolConfig};
use memres_core::stack::{parse, Call, StackError, StackErrorKind};
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::{
    Block, DynResource, MemoryResource, MemoryResourceMut, Request, Shared, Stream, StreamOrdered,
};
use std::any::Any;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// What a constructor gets besides its call: the builder (to build its
/// upstream) and the stream to make initial allocations on.
pub struct Context<'a, S: ?Sized> {
    /// The builder, with every registered name.
    pub builder: &'a StackBuilder<S>,
    /// The stream a resource that allocates when made (a pool's initial
    /// size) allocates on.
    pub stream: &'a S,
    /// Typed handles kept so far (see [`Context::keep`]).
    handles: RefCell<Vec<Handle>>,
}

/// A typed resource of a built stack, kept so that its figures can be read.
struct Handle {
    name: String,
    pos: usize,
    resource: Arc<dyn Any + Send + Sync>,
}

impl<S: ?Sized> fmt::Debug for Context<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("builder", &self.builder).finish_non_exhaustive()
    }
}

impl<S: Stream + ?Sized + 'static> Context<'_, S> {
    /// Builds the `i`th positional argument of `call` as a resource.
    ///
    /// # Errors
    ///
    /// A missing or malformed argument, or the upstream's own error.
    pub fn upstream(&self, call: &Call, i: usize) -> Result<DynResource<S>, StackError> {
        self.builder.build_in(call.resource(i)?, self)
    }

    /// Keeps `resource` as the typed handle of `call` and returns it as a
    /// [`DynResource`], so that [`Built::get`] can hand it back.
    pub fn keep<T: MemoryResource<S> + Send + Sync + 'static>(
        &self,
        call: &Call,
        resource: T,
    ) -> DynResource<S> {
        let resource = Arc::new(resource);
        self.handles.borrow_mut().push(Handle {
            name: call.name.clone(),
            pos: call.pos,
            resource: resource.clone(),
        });
        resource
    }
}

/// A built stack and the typed handles of its resources.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Statistics;
/// use memres_core::{DynResource, MemoryResource, Request};
/// use memres_sim::{SimDevice, StackBuilder};
/// let built = StackBuilder::<()>::new().build_with_handles("stats(pool(sim))", &())?;
/// let b = built.resource.allocate(Request::new(1000)?, &())?;
/// let stats = built.get::<Statistics<DynResource>>("stats").unwrap();
/// assert_eq!(stats.bytes().value, 1000);
/// let sim = built.get::<SimDevice>("sim").unwrap();
/// assert!(sim.held_bytes() >= 1024);
/// # built.resource.deallocate(b, &())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Built<S: ?Sized> {
    /// The stack.
    pub resource: DynResource<S>,
    /// Sorted by position in the text: outermost first.
    handles: Vec<Handle>,
}

impl<S: ?Sized> fmt::Debug for Built<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<(&str, usize)> = self.handles.iter().map(|h| (h.name.as_str(), h.pos)).collect();
        f.debug_struct("Built").field("handles", &names).finish_non_exhaustive()
    }
}

impl<S: ?Sized> Built<S> {
    /// The outermost resource named `name`, if it has type `T`. The
    /// standard names keep these types (`D` is [`DynResource<S>`]): `sim`
    /// [`SimDevice`], `pool` `Shared<CoalescingPool<D>>` (with
    /// `per_stream=true`: `Shared<PerStreamPool<PoolMaker<D>, S>>`), `stats`
    /// `Statistics<D>`, `track` `Tracking<D>`, `limit` `Limiting<D>`,
    /// `align` `Aligned<D>`, `log` `Logging<D>`, `host` [`HostMemory`],
    /// `fixed` `Shared<FixedSizeResource<D>>`, `binning`
    /// `BinningResource<'static, D, S>`, `arena` `ArenaResource<D>`,
    /// `vpool` `Shared<VirtualPool<SimAddressSpace>>`, `stream`
    /// `Shared<StreamOrdered<OnStream<S>, S>>`.
    pub fn get<T: Any + Send + Sync>(&self, name: &str) -> Option<Arc<T>> {
        self.all(name).into_iter().next()
    }

    /// Every resource named `name` of type `T`, outermost first.
    pub fn all<T: Any + Send + Sync>(&self, name: &str) -> Vec<Arc<T>> {
        self.handles
            .iter()
            .filter(|h| h.name == name)
            .filter_map(|h| h.resource.clone().downcast::<T>().ok())
            .collect()
    }
}

/// Makes one resource from its call.
pub type Constructor<S> =
    Arc<dyn Fn(&Call, &Context<'_, S>) -> Result<DynResource<S>, StackError> + Send + Sync>;

/// A registry of constructors by name, which builds stacks for streams of
/// type `S`.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Statistics;
/// use memres_core::stack::StackErrorKind;
/// use memres_core::DynResource;
/// use memres_sim::StackBuilder;
/// use std::sync::Arc;
/// let mut b = StackBuilder::<()>::new();
/// let e = b.build("stats(counted(sim))", &()).err().unwrap();
/// assert_eq!((e.pos, e.kind), (6, StackErrorKind::UnknownName("counted".into())));
/// // One line adds a resource:
/// b.register("counted", |call, cx| Ok(Arc::new(Statistics::new(cx.upstream(call, 0)?)) as DynResource));
/// assert!(b.build("stats(counted(sim))", &()).is_ok());
/// ```
pub struct StackBuilder<S: ?Sized> {
    constructors: BTreeMap<String, Constructor<S>>,
}

impl<S: ?Sized> fmt::Debug for StackBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackBuilder").field("names", &self.constructors.keys().collect::<Vec<_>>()).finish()
    }
}

impl<S: Stream + ?Sized + 'static> Default for StackBuilder<S>
where
    S::Event: Send,
{
    fn default() -> Self {
        Self::new()
    }
}

/// The capacity of `sim` when none is given: an 80 GiB device, as an H100.
pub const DEFAULT_SIM_CAPACITY: u64 = 80 << 30;

fn resource_error(call: &Call, e: memres_core::Error) -> StackError {
    call.error(StackErrorKind::Resource(e))
}

impl<S: Stream + ?Sized + 'static> StackBuilder<S> {
    /// A builder with no names.
    pub fn empty() -> Self {
        StackBuilder { constructors: BTreeMap::new() }
    }

    /// A builder with the standard names (see the module's table).
    pub fn new() -> Self
    where
        S::Event: Send,
    {
        let mut b = Self::empty();
        b.register("sim", |call, cx| {
            call.expect_args(1, &["capacity"])?;
            let capacity = match (call.positional(0), call.keyed("capacity")) {
                (Some(_), Some(v)) => {
                    return Err(StackError::new(v.pos(), StackErrorKind::DuplicateKey("capacity".into())))
                }
                (Some(v), None) | (None, Some(v)) => v.size()?,
                (None, None) => DEFAULT_SIM_CAPACITY,
            };
            Ok(cx.keep(call, SimDevice::new(capacity)))
        });
        b.register("host", |call, cx| {
            call.expect_args(0, &[])?;
            Ok(cx.keep(call, HostMemory::new()))
        });
        b.register("fixed", |call, cx| {
            call.expect_args(2, &["size", "blocks"])?;
            call.resource(0)?;
            let size = match (call.positional(1), call.keyed("size")) {
                (Some(_), Some(v)) => {
                    return Err(StackError::new(v.pos(), StackErrorKind::DuplicateKey("size".into())))
                }
                (Some(v), None) | (None, Some(v)) => v.size()?,
                (None, None) => FixedConfig::DEFAULT_BLOCK_SIZE,
            };
            let mut config = FixedConfig::new(size);
            if let Some(v) = call.keyed("blocks") {
                config = config.blocks_per_chunk(number(v)?);
            }
            let upstream = cx.upstream(call, 0)?;
            let fixed = FixedSizeResource::with_config(upstream, config, cx.stream)
                .map_err(|e| resource_error(call, e))?;
            Ok(cx.keep(call, Shared::new(fixed)))
        });
        b.register("binning", |call, cx| {
            call.expect_args(1, &["min", "max"])?;
            let min = call.keyed("min").map(number).transpose()?.unwrap_or(18);
            let max = call.keyed("max").map(number).transpose()?.unwrap_or(22);
            let upstream = cx.upstream(call, 0)?;
            let bins = BinningResource::<'static, DynResource<S>, S>::with_exponents(upstream, min, max)
                .map_err(|e| resource_error(call, e))?;
            Ok(cx.keep(call, bins))
        });
        b.register("arena", |call, cx| {
            call.expect_args(1, &["initial", "max", "superblock"])?;
            let mut config = ArenaConfig::new();
            if let Some(initial) = call.size_arg("initial")? {
                config = config.initial_size(initial);
            }
            if let Some(max) = call.size_arg("max")? {
                config = config.maximum_size(max);
            }
            if let Some(sb) = call.size_arg("superblock")? {
                config = config.superblock_size(sb);
            }
            let upstream = cx.upstream(call, 0)?;
            let arena = ArenaResource::with_config(upstream, config, cx.stream)
                .map_err(|e| resource_error(call, e))?;
            Ok(cx.keep(call, arena))
        });
        b.register("vpool", |call, cx| {
            call.expect_args(1, &["reserve", "keep", "granule", "slack"])?;
            let space = call.resource(0)?;
            if space.name != "sim" {
                return Err(space.error(StackErrorKind::BadValue(format!(
                    "vpool maps granules of a simulated address space: its upstream is `sim`, not `{}`",
                    space.name
                ))));
            }
            space.expect_args(1, &[])?;
            let physical = space.positional(0).map(|v| v.size()).transpose()?.unwrap_or(DEFAULT_SIM_CAPACITY);
            let granule = granule_arg(call, SimAddressSpace::DEFAULT_GRANULE)?;
            let reserve = call.size_arg("reserve")?.unwrap_or(64 << 30);
            // Keep free memory mapped under a 4 % slack above the peak in
            // use: steady-state replays of the PyTorch traces then map nothing.
            let keep = call.size_arg("keep")?.unwrap_or(u64::MAX);
            let slack = match call.keyed("slack") {
                Some(v) => {
                    let text = v.text()?;
                    text.parse::<u32>().map_err(|_| {
                        StackError::new(
                            v.pos(),
                            StackErrorKind::BadValue(format!("slack `{text}`: a whole number of permille")),
                        )
                    })?
                }
                None => 40,
            };
            let pool = VirtualPool::with_config(
                SimAddressSpace::new(physical, granule),
                VirtualConfig::new(reserve).keep(keep).slack_permille(slack),
            )
            .map_err(|e| resource_error(call, e))?;
            Ok(cx.keep(call, Shared::new(pool)))
        });
        b.register("pool", |call, cx| {
            call.expect_args(1, &["initial", "max", "growth", "granule", "release", "per_stream"])?;
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
                            StackErrorKind::BadValue(
                                "granule= sizes fractional growth, not growth=double".into(),
                            ),
                        ))
                    }
                    None => Growth::Double,
                },
                Some((pos, text)) => match text.parse::<u32>() {
                    Ok(divisor) if divisor > 0 => Growth::Fraction { divisor, granule },
                    _ => {
                        return Err(StackError::new(
                            pos,
                            StackErrorKind::BadValue(format!(
                                "growth `{text}`: double, default or a divisor > 0"
                            )),
                        ))
                    }
                },
            };
            config = config.growth(growth);
            if let Some(release) = call.bool_arg("release")? {
                config = config.release_on_grow(release);
            }
            let upstream = cx.upstream(call, 0)?;
            if call.bool_arg("per_stream")? == Some(true) {
                return per_stream_pool(call, cx, upstream, config);
            }
            let pool = CoalescingPool::with_config(upstream, config, cx.stream)
                .map_err(|e| resource_error(call, e))?;
            Ok(cx.keep(call, Shared::new(pool)))
        });
        b.register("stats", |call, cx| {
            call.expect_args(1, &[])?;
            Ok(cx.keep(call, Statistics::new(cx.upstream(call, 0)?)))
        });
        b.register("track", |call, cx| {
            call.expect_args(1, &[])?;
            Ok(cx.keep(call, Tracking::new(cx.upstream(call, 0)?)))
        });
        b.register("limit", |call, cx| {
            call.expect_args(2, &["bytes"])?;
            call.resource(0)?;
            let bytes = match (call.positional(1), call.keyed("bytes")) {
                (Some(_), Some(v)) => {
                    return Err(StackError::new(v.pos(), StackErrorKind::DuplicateKey("bytes".into())))
                }
                (Some(v), None) | (None, Some(v)) => v.size()?,
                (None, None) => return Err(call.error(StackErrorKind::MissingArg("the limit in bytes"))),
            };
            Ok(cx.keep(call, Limiting::new(cx.upstream(call, 0)?, bytes)))
        });
        b.register("align", |call, cx| {
            call.expect_args(1, &["alignment", "threshold"])?;
            let alignment = call.size_arg("alignment")?.unwrap_or(Aligned::<()>::DEFAULT_ALIGNMENT);
            let threshold = call.size_arg("threshold")?.unwrap_or(Aligned::<()>::DEFAULT_THRESHOLD);
            let upstream = cx.upstream(call, 0)?;
            let aligned = Aligned::new(upstream, alignment, threshold).map_err(|e| {
                let pos = call.keyed("alignment").map_or(call.pos, |v| v.pos());
                StackError::new(pos, StackErrorKind::Resource(e))
            })?;
            Ok(cx.keep(call, aligned))
        });
        b.register("log", |call, cx| {
            call.expect_args(1, &["file"])?;
            let file = call.keyed("file").ok_or_else(|| call.error(StackErrorKind::MissingArg("file=")))?;
            let upstream = cx.upstream(call, 0)?;
            let log = Logging::to_file(upstream, file.text()?).map_err(|e| {
                StackError::new(
                    file.pos(),
                    StackErrorKind::Io(format!("cannot log to `{}`: {e}", file.text().unwrap_or(""))),
                )
            })?;
            Ok(cx.keep(call, log))
        });
        b
    }

    /// Registers `stream(UP)`: RMM's stream-ordered layer
    /// ([`StreamOrdered`]) over the stack `UP`, which it reaches on the
    /// stream the stack is built on (see [`OnStream`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::{MemoryResource, Request};
    /// use memres_sim::{SimWorld, StackBuilder};
    /// let world = SimWorld::new();
    /// let (s1, s2) = (world.stream(), world.stream());
    /// let mut b = StackBuilder::new();
    /// b.register_stream_layer();
    /// let stack = b.build("stream(pool(sim))", &world.default_stream())?;
    /// let x = stack.allocate(Request::new(1000)?, &s1)?;
    /// stack.deallocate(x, &s1)?;
    /// let y = stack.allocate(Request::new(1000)?, &s2)?;
    /// stack.deallocate(y, &s2)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register_stream_layer(&mut self) -> &mut Self
    where
        S: Clone + Send + Sync,
        StreamOrdered<OnStream<S>, S>: Send,
    {
        self.register("stream", |call, cx| {
            call.expect_args(1, &[])?;
            let inner = OnStream { upstream: cx.upstream(call, 0)?, stream: cx.stream.clone() };
            Ok(cx.keep(call, Shared::new(StreamOrdered::new(inner))))
        })
    }

    /// Registers (or replaces) the constructor of `name`.
    pub fn register(
        &mut self,
        name: &str,
        constructor: impl Fn(&Call, &Context<'_, S>) -> Result<DynResource<S>, StackError> + Send + Sync + 'static,
    ) -> &mut Self {
        self.constructors.insert(name.to_string(), Arc::new(constructor));
        self
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.constructors.keys().map(String::as_str)
    }

    /// Parses `text` and builds the stack; `stream` is the stream of
    /// allocations made while building (a pool's initial size).
    ///
    /// # Errors
    ///
    /// A [`StackError`] that names the byte position: a parse error, an
    /// unknown name, a bad argument, or a resource that could not be made.
    pub fn build(&self, text: &str, stream: &S) -> Result<DynResource<S>, StackError> {
        self.build_call(&parse(text)?, stream)
    }

    /// Builds a parsed stack.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), less the parse errors.
    pub fn build_call(&self, call: &Call, stream: &S) -> Result<DynResource<S>, StackError> {
        Ok(self.build_call_with_handles(call, stream)?.resource)
    }

    /// Parses `text` and builds the stack, with the typed handles of its
    /// resources.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build).
    pub fn build_with_handles(&self, text: &str, stream: &S) -> Result<Built<S>, StackError> {
        self.build_call_with_handles(&parse(text)?, stream)
    }

    /// Builds a parsed stack, with the typed handles of its resources.
    ///
    /// # Errors
    ///
    /// As [`build_call`](Self::build_call).
    pub fn build_call_with_handles(&self, call: &Call, stream: &S) -> Result<Built<S>, StackError> {
        let cx = Context { builder: self, stream, handles: RefCell::new(Vec::new()) };
        let resource = self.build_in(call, &cx)?;
        let mut handles = cx.handles.into_inner();
        // A call's upstreams are written after its name: by position is
        // outermost first.
        handles.sort_by_key(|h| h.pos);
        Ok(Built { resource, handles })
    }

    fn build_in(&self, call: &Call, cx: &Context<'_, S>) -> Result<DynResource<S>, StackError> {
        let constructor = self
            .constructors
            .get(&call.name)
            .ok_or_else(|| call.error(StackErrorKind::UnknownName(call.name.clone())))?;
        constructor(call, cx)
    }
}

/// A resource of stream `S` reached on one fixed stream: the stream-agnostic
/// inner algorithm that [`StreamOrdered`] expects.
pub struct OnStream<S: ?Sized> {
    upstream: DynResource<S>,
    stream: S,
}

impl<S: fmt::Debug> fmt::Debug for OnStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnStream").field("stream", &self.stream).finish_non_exhaustive()
    }
}

impl<S: Stream> MemoryResourceMut for OnStream<S> {
    fn allocate(&mut self, request: Request, _: &()) -> memres_core::Result<Block> {
        self.upstream.allocate(request, &self.stream)
    }

    fn deallocate(&mut self, block: Block, _: &()) -> memres_core::Result<()> {
        self.upstream.deallocate(block, &self.stream)
    }
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
    let maker =
        PoolMaker::new(upstream.clone(), config.initial_size(0)).map_err(|e| resource_error(call, e))?;
    let mut pools = PerStreamPool::new(maker);
    if initial > 0 {
        let first =
            CoalescingPool::with_config(upstream, config, cx.stream).map_err(|e| resource_error(call, e))?;
        pools.insert(cx.stream, first).map_err(|e| resource_error(call, e))?;
    }
    Ok(cx.keep(call, Shared::new(pools)))
}

/// The chunk or page granule given as `granule=`, else `default`.
///
/// # Errors
///
/// A bad size, or one that is not a power of two of at least 256, at the
/// value.
fn granule_arg(call: &Call, default: u64) -> Result<u64, StackError> {
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

/// A small whole number (a count or an exponent).
fn number(v: &memres_core::stack::Value) -> Result<u32, StackError> {
    let text = v.text()?;
    text.parse::<u32>()
        .map_err(|_| StackError::new(v.pos(), StackErrorKind::BadValue(format!("`{text}`: a whole number"))))
}

#[cfg(test)]
mod tests;
