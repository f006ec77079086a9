//! The leaves of this crate as names of a [`StackBuilder`]: `sim`, `host`
//! and `vpool`.
//!
//! | name | arguments | resource (typed handle) |
//! | --- | --- | --- |
//! | `sim` | `[capacity]` (or `capacity=`; default 80 GiB, at most 64 TiB: [`SimDevice::MAX_CAPACITY`]); each `sim` of a stack is a device with addresses of its own ([`sim`]) | [`SimDevice`] |
//! | `host` | none | [`HostMemory`], a leaf of [`HostCopy`]'s memory ([`StackBuilder::is_leaf_of`]) |
//! | `vpool` | `sim` or `sim(physical)` (or `sim(capacity=)`, as `sim` takes it; each `vpool` of a stack has addresses of its own: [`keep_vpool`]), `reserve=` (64 GiB), `release_threshold=` (all), `slack=` (40 permille), `trim_on_commit=` (true), `granule=` (2 MiB), `handle_granules=` (none: any granule goes back alone; `N`: memory held in pieces of up to N granules given back whole, as `vmm`'s handles, [`SimAddressSpace::with_pieces`]), `per_stream=` (false) | [`VirtualPool`] over a [`SimAddressSpace`], behind [`Shared`] (`Shared<VirtualPool<SimAddressSpace>>`); with `per_stream=true` a [`PerStreamPool`] of them over one space, each stream's pool with a reservation of its own, stream-ordered (`Shared<PerStreamPool<VirtualMaker<Arc<SimAddressSpace>>, S>>`) |
//!
//! # Examples
//!
//! ```
//! use memres_core::{MemoryResource, Request};
//! let stack = memres_sim::builder::<()>().build("limit(stats(pool(sim, initial=1MiB)), 2MiB)", &())?;
//! let b = stack.allocate(Request::new(1 << 20)?, &())?;
//! assert!(stack.allocate(Request::new(2 << 20)?, &()).is_err());
//! stack.deallocate(b, &())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::{HostCopy, HostMemory, SimAddressSpace, SimDevice};
use memres_core::per_stream::{PerStreamPool, VirtualMaker};
use memres_core::stack::{
    granule_arg, one_of, Call, Context, StackBuilder, StackError, StackErrorKind, Value,
};
use memres_core::vpool::{VirtualConfig, VirtualPool};
use memres_core::{DynResource, Shared, Stream};
use std::sync::Arc;

/// The capacity of `sim` when none is given: an 80 GiB device, as an H100.
pub const DEFAULT_SIM_CAPACITY: u64 = 80 << 30;

/// Registers `sim`, `host` and `vpool` in `builder`.
///
/// ```
/// use memres_core::stack::StackBuilder;
/// let mut b = StackBuilder::<()>::new();
/// assert!(b.build("pool(sim)", &()).is_err());
/// memres_sim::register(&mut b);
/// assert!(b.build("pool(sim)", &()).is_ok());
/// ```
pub fn register<S: Stream + ?Sized + 'static>(builder: &mut StackBuilder<S>) -> &mut StackBuilder<S>
where
    S::Event: Send,
{
    builder.register("sim", |call, cx| Ok(cx.keep(call, sim(call, cx)?)));
    builder.register_leaf_of::<HostCopy>("host", |call, cx| {
        call.expect_args(0, &[])?;
        Ok(cx.keep_leaf_of(call, HostMemory::new()))
    });
    builder.register("vpool", |call, cx| keep_vpool(call, cx, cx.kept_count(&call.name) as u64))
}

/// The capacity `value` of a `sim`: a size its space can hold, at most
/// [`SimDevice::MAX_CAPACITY`] (a `vpool`'s space spans as much). For a
/// builder that registers a `sim` of its own (one counted in a gauge).
///
/// # Errors
///
/// [`StackErrorKind::BadValue`] at the value, for a capacity above that or
/// a value that is no size.
pub fn sim_capacity(value: &Value) -> Result<u64, StackError> {
    const _: () = assert!(SimDevice::MAX_CAPACITY == SimAddressSpace::DEFAULT_SPAN);
    let bytes = value.size()?;
    if bytes > SimDevice::MAX_CAPACITY {
        return Err(StackError::new(
            value.pos(),
            StackErrorKind::BadValue(format!(
                "capacity `{}`: the simulated device's space holds at most 64 TiB ({} bytes)",
                value.text()?,
                SimDevice::MAX_CAPACITY
            )),
        ));
    }
    Ok(bytes)
}

/// The device of a `sim` call of the stack `cx` builds. Each `sim` of one
/// stack is a device of its own, as two devices or two allocators are:
/// the `k`th built (from 0) has its addresses from
/// [`SimDevice::BASE`] + `k` × 2^46, so no two hand out one address (nor
/// one that a `vpool` reserves: [`keep_vpool`]). For a builder that
/// registers a `sim` of its own (one counted in a gauge).
///
/// # Errors
///
/// A bad capacity ([`sim_capacity`]) or an unknown key, at its position;
/// at the call, a `sim` whose addresses would meet the `vpool`s' (one of
/// more than [`SIM_DEVICES`] in one stack).
///
/// ```
/// use memres_core::{MemoryResource, Request};
/// use memres_sim::SimDevice;
/// let built = memres_sim::builder::<()>().build_with_handles("binning(sim, bin(4096, sim(1GiB)))", &())?;
/// let (outer, bin) = (built.get::<SimDevice>("sim").unwrap(), built.all::<SimDevice>("sim")[1].clone());
/// // The upstream is built first.
/// assert_eq!((outer.addresses().start(), bin.addresses().start()), (SimDevice::BASE, SimDevice::BASE + (1 << 46)));
/// let (small, large) = (built.resource.allocate(Request::new(4000)?, &())?, built.resource.allocate(Request::new(8000)?, &())?);
/// assert!(bin.addresses().contains(small.addr()) && outer.addresses().contains(large.addr()));
/// # built.resource.deallocate(small, &())?;
/// # built.resource.deallocate(large, &())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn sim<S: Stream + ?Sized + 'static>(call: &Call, cx: &Context<'_, S>) -> Result<SimDevice, StackError> {
    sim_device(call, cx.kept_count(&call.name) as u64)
}

/// How many simulated devices have addresses of their own, below those of
/// every `vpool` but a stack's first: [`sim_device`]'s numbers. 64, the
/// Python package's devices, each a default `sim` of its own.
pub const SIM_DEVICES: u64 = 64;

/// The device of a `sim` call, the `nth` of the [`SIM_DEVICES`] with
/// addresses of their own: from [`SimDevice::BASE`] + `nth` × 2^46. For a
/// builder whose `sim`s must differ beyond one stack (the Python
/// package's, where each resource is a stack of its own).
///
/// # Errors
///
/// As [`sim`]; at the call, an `nth` of [`SIM_DEVICES`] or more.
///
/// ```
/// use memres_core::stack::parse;
/// use memres_sim::{sim_device, SimDevice, SIM_DEVICES};
/// let call = parse("sim(1GiB)")?;
/// assert_eq!(sim_device(&call, 2)?.addresses().start(), SimDevice::BASE + (2 << 46));
/// assert!(sim_device(&call, SIM_DEVICES - 1)?.addresses().end() <= memres_sim::ADDRESSES_END);
/// assert!(sim_device(&call, SIM_DEVICES).is_err());
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn sim_device(call: &Call, nth: u64) -> Result<SimDevice, StackError> {
    call.expect_args(1, &["capacity"])?;
    let capacity = one_of(call, 0, "capacity")?.map(sim_capacity).transpose()?;
    nth_sim_device(capacity.unwrap_or(DEFAULT_SIM_CAPACITY), nth).map_err(|e| call.resource_error(e))
}

/// The `nth` of the [`SIM_DEVICES`] simulated devices with addresses of
/// their own, of `capacity` bytes: its addresses from [`SimDevice::BASE`] +
/// `nth` × 2^46, which no other of them hands out. [`sim_device`]'s device,
/// and `memres`'s default of device `nth`.
///
/// # Errors
///
/// [`Error::InvalidConfig`](memres_core::Error::InvalidConfig) for an `nth`
/// of [`SIM_DEVICES`] or more.
///
/// ```
/// use memres_core::{Error, MemoryResource, Request};
/// use memres_sim::{nth_sim_device, SimDevice, SIM_DEVICES};
/// let (zero, one) = (nth_sim_device(1 << 30, 0)?, nth_sim_device(1 << 30, 1)?);
/// assert_eq!(zero.addresses().start(), SimDevice::BASE);
/// let block = one.allocate(Request::new(1000)?, &())?;
/// assert!(zero.deallocate(block, &()).is_err(), "a block of another device");
/// assert!(matches!(nth_sim_device(1 << 30, SIM_DEVICES), Err(Error::InvalidConfig { .. })));
/// # one.deallocate(block, &())?;
/// # Ok::<(), Error>(())
/// ```
pub fn nth_sim_device(capacity: u64, nth: u64) -> memres_core::Result<SimDevice> {
    // The message is a `&'static str`: it names the number itself.
    const _: () = assert!(SIM_DEVICES == 64);
    if nth >= SIM_DEVICES {
        return Err(memres_core::Error::InvalidConfig {
            what: "too many simulated devices: at most 64 (devices 0 to 63); the addresses of more would run into the vpools'",
        });
    }
    SimDevice::with_base(capacity, SimDevice::BASE + nth * SimDevice::MAX_CAPACITY)
}

/// Where the addresses of the second and later `vpool`s of one stack
/// start, above every `sim`'s (2^52 + 127 TiB).
const VPOOLS_FROM: u64 = SimDevice::BASE + SIM_DEVICES * SimDevice::MAX_CAPACITY;

/// Where the addresses of every `sim` and `vpool` this crate builds end:
/// 2^53, the integers a JavaScript number holds exactly. PyTorch's memory
/// viewer reads a snapshot's addresses as such numbers (one of 2^63 or
/// more it cannot load at all), so a snapshot of these stacks opens there.
pub const ADDRESSES_END: u64 = 1 << 53;

/// How many simulated address spaces have addresses of their own:
/// [`keep_vpool`]'s numbers.
pub const VPOOL_SPACES: u64 = 1 + (ADDRESSES_END - VPOOLS_FROM) / SimAddressSpace::DEFAULT_SPAN;

/// Builds the `vpool` call into `cx` over the `nth` of the
/// [`VPOOL_SPACES`] simulated address spaces with addresses of their own:
/// the first (`nth` 0) has [`SimAddressSpace::BASE`] (below the first
/// `sim`'s), the `nth` after it 2^52 + 127 TiB + (`nth` - 1) × 2^46 (above every
/// `sim`'s, below [`ADDRESSES_END`]). The registered `vpool` numbers the `vpool`s of one stack so,
/// and no two of them nor a `sim` of that stack hand out one address; a
/// builder whose `vpool`s must differ beyond one stack (the Python
/// package's, where each resource is a stack of its own) numbers them
/// itself.
///
/// # Errors
///
/// A bad key or value at its position; at the call, an `nth` of
/// [`VPOOL_SPACES`] or more, or the pool's own refusal.
///
/// ```
/// use memres_core::vpool::VirtualPool;
/// use memres_core::{MemoryResource, Request, Shared};
/// use memres_sim::{SimAddressSpace, SimDevice};
/// let text = "binning(vpool(sim), bin(4096, vpool(sim)), bin(8192, sim))";
/// let built = memres_sim::builder::<()>().build_with_handles(text, &())?;
/// let pools = built.all::<Shared<VirtualPool<SimAddressSpace>>>("vpool");
/// let starts: Vec<u64> = pools.iter().map(|p| p.with(|p| p.space().addresses().start())).collect();
/// let above_the_sims = SimDevice::BASE + memres_sim::SIM_DEVICES * SimDevice::MAX_CAPACITY;
/// assert_eq!(starts, [SimAddressSpace::BASE, above_the_sims]); // the upstream first
/// assert_eq!(built.get::<SimDevice>("sim").unwrap().addresses().start(), SimDevice::BASE);
/// let (a, b) = (built.resource.allocate(Request::new(4000)?, &())?, built.resource.allocate(Request::new(1 << 20)?, &())?);
/// assert!(a.addr() >= above_the_sims && b.addr() < SimDevice::BASE);
/// # built.resource.deallocate(a, &())?;
/// # built.resource.deallocate(b, &())?;
/// // The last space ends within a span of 2^53; there is none after it.
/// let mut b = memres_core::stack::StackBuilder::<()>::new();
/// let last = memres_sim::VPOOL_SPACES - 1;
/// b.register("vpool", move |call, cx| memres_sim::keep_vpool(call, cx, last));
/// let built = b.build_with_handles("vpool(sim)", &())?;
/// let pool = built.get::<Shared<VirtualPool<SimAddressSpace>>>("vpool").unwrap();
/// let end = pool.with(|p| p.space().addresses().end());
/// assert!(end <= memres_sim::ADDRESSES_END && end + SimAddressSpace::DEFAULT_SPAN > memres_sim::ADDRESSES_END);
/// b.register("vpool", move |call, cx| memres_sim::keep_vpool(call, cx, last + 1));
/// assert!(b.build("vpool(sim)", &()).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn keep_vpool<S: Stream + ?Sized + 'static>(
    call: &Call,
    cx: &Context<'_, S>,
    nth: u64,
) -> Result<DynResource<S>, StackError>
where
    S::Event: Send,
{
    let (space, config) = vpool_parts(call)?;
    let space = vpool_space(call, space, nth)?;
    if call.bool_arg("per_stream")? == Some(true) {
        // `vpool_parts` checked the configuration, naming where it fails.
        let maker = VirtualMaker::new(Arc::new(space), config)
            .map_err(|e| call.error(StackErrorKind::Resource(e)))?;
        let pools = PerStreamPool::<_, S>::new(maker);
        return Ok(cx.keep_releasing(call, Shared::new(pools)));
    }
    let pool = VirtualPool::with_config(space, config).map_err(|e| call.resource_error(e))?;
    Ok(cx.keep_releasing(call, Shared::new(pool)))
}

/// `space` moved to the `nth` place of [`keep_vpool`].
fn vpool_space(call: &Call, space: SimAddressSpace, nth: u64) -> Result<SimAddressSpace, StackError> {
    if nth == 0 {
        return Ok(space);
    }
    if nth >= VPOOL_SPACES {
        let what = "too many simulated address spaces: their addresses run past 2^53";
        return Err(call.resource_error(memres_core::Error::InvalidConfig { what }));
    }
    let base = VPOOLS_FROM + (nth - 1) * SimAddressSpace::DEFAULT_SPAN;
    space.at(base).map_err(|e| call.resource_error(e))
}

/// A builder with the core's names and this crate's leaves.
///
/// ```
/// let names: Vec<String> = memres_sim::builder::<()>().names().map(String::from).collect();
/// assert!(["sim", "host", "vpool", "pool", "stats"].iter().all(|n| names.iter().any(|m| m == n)));
/// // Host memory is bytes `HostCopy` reaches; the simulated device's addresses are made up.
/// let b = memres_sim::builder::<()>();
/// assert!(b.is_leaf_of::<memres_sim::HostCopy>("host") && !b.is_leaf_of::<memres_sim::HostCopy>("sim"));
/// ```
pub fn builder<S: Stream + ?Sized + 'static>() -> StackBuilder<S>
where
    S::Event: Send,
{
    let mut b = StackBuilder::new();
    register(&mut b);
    b
}

/// The pool of a `vpool` call, typed (the replay tool builds it so).
///
/// # Errors
///
/// An upstream other than `sim`, an unknown key, a bad size, granule,
/// slack or handle size, `per_stream=true` (a pool per stream: build that with the
/// builder), at its position; the pool's own refusal at the call.
///
/// ```
/// use memres_core::stack::parse;
/// let pool = memres_sim::vpool(&parse("vpool(sim(8GiB), reserve=1GiB, granule=64KiB)")?)?;
/// assert_eq!((pool.reserved_bytes(), pool.granule()), (1 << 30, 64 << 10));
/// assert!(memres_sim::vpool(&parse("vpool(sim, handle_granules=32)")?).is_ok());
/// assert!(memres_sim::vpool(&parse("vpool(sim, handle_granules=0)")?).is_err());
/// // Above the largest granule the simulated space reserves (it panicked).
/// assert!(memres_sim::vpool(&parse("vpool(sim, granule=4611686018427387904)")?).is_err());
/// assert!(memres_sim::vpool(&parse("vpool(sim, granule=2199023255552)")?).is_err()); // 2^41
/// assert!(!memres_sim::vpool(&parse("vpool(sim, trim_on_commit=false)")?)?.config().trims_on_commit());
/// assert!(memres_sim::vpool(&parse("vpool(pool(sim))")?).is_err());
/// assert!(memres_sim::vpool(&parse("vpool(sim, per_stream=true)")?).is_err());
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn vpool(call: &Call) -> Result<VirtualPool<SimAddressSpace>, StackError> {
    let (space, config) = vpool_parts(call)?;
    if call.bool_arg("per_stream")? == Some(true) {
        let at = call.keyed("per_stream").map_or(call.pos, |v| v.pos());
        return Err(StackError::new(
            at,
            StackErrorKind::BadValue("per_stream=true makes a pool per stream, not one typed pool".into()),
        ));
    }
    VirtualPool::with_config(space, config).map_err(|e| call.resource_error(e))
}

/// The space and configuration of a `vpool` call.
fn vpool_parts(call: &Call) -> Result<(SimAddressSpace, VirtualConfig), StackError> {
    call.expect_args(
        1,
        &[
            "reserve",
            "release_threshold",
            "granule",
            "slack",
            "trim_on_commit",
            "handle_granules",
            "per_stream",
        ],
    )?;
    let space = call.resource(0)?;
    if space.name != "sim" {
        return Err(space.error(StackErrorKind::BadValue(format!(
            "vpool maps granules of a simulated address space: its upstream is `sim`, not `{}`",
            space.name
        ))));
    }
    space.expect_args(1, &["capacity"])?;
    let physical =
        one_of(space, 0, "capacity")?.map(sim_capacity).transpose()?.unwrap_or(DEFAULT_SIM_CAPACITY);
    let granule = granule_arg(call, SimAddressSpace::DEFAULT_GRANULE)?;
    let at = call.keyed("granule").map_or(call.pos, |v| v.pos());
    let mut sim = SimAddressSpace::new(physical, granule)
        .map_err(|e| StackError::new(at, StackErrorKind::BadValue(format!("granule `{granule}`: {e}"))))?;
    let reserve = call.size_arg("reserve")?.unwrap_or(VirtualConfig::DEFAULT_RESERVE);
    // Keep free memory mapped under a 4 % slack above the peak in use:
    // steady-state replays of the PyTorch traces then map nothing.
    let threshold = call.size_arg("release_threshold")?.unwrap_or(u64::MAX);
    let slack = call.u32_arg("slack", "a whole number of permille")?.unwrap_or(40);
    let trim_on_commit = call.bool_arg("trim_on_commit")?.unwrap_or(true);
    if let Some(n) = call.u32_arg("handle_granules", "a number of granules, at least 1")? {
        let at = call.keyed("handle_granules").map_or(call.pos, |v| v.pos());
        sim = sim.with_pieces(n.into()).map_err(|e| {
            StackError::new(at, StackErrorKind::BadValue(format!("handle_granules `{n}`: {e}")))
        })?;
    }
    let config = VirtualConfig::new(reserve)
        .release_threshold(threshold)
        .slack_permille(slack)
        .trim_on_commit(trim_on_commit);
    // Checked here to name the value: with `per_stream=true` each pool is
    // made at its stream's first allocation.
    config.check(granule).map_err(|e| {
        let at = call.keyed("reserve").map_or(call.pos, |v| v.pos());
        StackError::new(at, StackErrorKind::Resource(e))
    })?;
    Ok((sim, config))
}
