//! The builder: a registry of constructors by name, which turns a parsed
//! stack into resources.

use super::release::{Layer, Release, ReleaseLayers};
use super::{parse, Call, StackError, StackErrorKind};
use crate::copy::{AssumeMemoryOf, MemoryOf};
use crate::{Block, DynResource, MemoryResource, MemoryResourceMut, Request, Shared, Stream, StreamOrdered};
use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::any::Any;
use core::cell::{Cell, RefCell};
use core::fmt;

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
    /// The layers kept so far that keep freed memory, with their call's
    /// name and position (see [`Context::keep_releasing`]).
    releasing: RefCell<Vec<Layer<S>>>,
    /// Whether a layer that keeps freed memory was kept while the upstream
    /// of the call being built (its first positional argument, built
    /// through [`Context::upstream`]) was built: what the call takes from
    /// its upstream reaches that layer first. Its other resources (a
    /// binning resource's counted bins) are not under it: what it gives
    /// back to its upstream does not go there.
    layer_under: Cell<bool>,
    /// The build this one is nested in ([`build_with`](Self::build_with)),
    /// which takes its handles when it ends.
    outer: Option<&'a Context<'a, S>>,
    /// What is done once the whole stack is built, in order: a `log`
    /// layer's file is made then, so that a stack refused leaves it as it
    /// was ([`when_built`](Self::when_built)).
    when_built: RefCell<Vec<WhenBuilt>>,
}

/// A step of [`Context::when_built`]: it readies what it changes (opens
/// a `log` layer's file and tries its first write, cutting nothing), and
/// gives what changes it.
type WhenBuilt = alloc::boxed::Box<dyn FnOnce() -> Result<Ready, StackError>>;

/// A step readied, done once every step is: dropped undone, it leaves
/// things as they were.
type Ready = alloc::boxed::Box<dyn FnOnce() -> Result<(), StackError>>;

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

impl<'a, S: ?Sized> Context<'a, S> {
    fn new(builder: &'a StackBuilder<S>, stream: &'a S, outer: Option<&'a Context<'a, S>>) -> Self {
        Context {
            builder,
            stream,
            handles: RefCell::new(Vec::new()),
            releasing: RefCell::new(Vec::new()),
            layer_under: Cell::new(false),
            outer,
            when_built: RefCell::new(Vec::new()),
        }
    }

    /// Runs what waited for the whole stack to be built, in order.
    fn finish(self) -> Result<(Vec<Handle>, Vec<Layer<S>>), StackError> {
        // Every step readied before any is done: one refused (a second log
        // file that cannot be opened, or written) leaves what the others
        // would change (the first log's file) as it was.
        let steps = self.when_built.take();
        let done =
            steps.into_iter().map(|step| step()).collect::<Result<Vec<Ready>, _>>().and_then(|ready| {
                for done in ready {
                    done()?;
                }
                Ok(())
            });
        if let Err(e) = done {
            self.let_go_layers(0);
            return Err(e);
        }
        Ok((self.handles.into_inner(), self.releasing.into_inner()))
    }

    /// Lets go of the layers kept since the first `from`, those it made
    /// over an upstream given back what they keep free on the build stream
    /// first, outermost first: a build that failed leaves nothing taken
    /// from an upstream shared beyond it (a pool's initial size), whatever
    /// its stream's drop does (a stream with no [`Stream::at_drop`] stream:
    /// a dropped pool keeps its chunks). What a layer cannot give back
    /// stays with it. Another stack's layers and the driver's leaves are
    /// not released (`Layer::let_go`).
    fn let_go_layers(&self, from: usize) {
        let gone: Vec<Layer<S>> = self.releasing.borrow_mut().drain(from..).collect();
        for layer in gone.iter().rev().filter(|l| l.let_go) {
            let _ = layer.layer.release(self.stream);
        }
    }
}

impl<S: Stream + ?Sized + 'static> Context<'_, S> {
    /// Builds the `i`th positional argument of `call` as a resource.
    ///
    /// The first (`i == 0`) is the upstream of the call being built: a
    /// layer that keeps freed memory kept while it is built is under that
    /// call (see [`keep_releasing`](Self::keep_releasing)). Build any other
    /// resource, a sub-call's included, from a later position.
    ///
    /// # Errors
    ///
    /// A missing or malformed argument (calls nested more than
    /// [`MAX_DEPTH`](super::MAX_DEPTH) deep in one made by hand:
    /// [`StackErrorKind::TooDeep`]), or the upstream's own error; what
    /// its build kept is let go, so that a constructor that goes on (to
    /// another resource) builds as if it had not tried.
    pub fn upstream(&self, call: &Call, i: usize) -> Result<DynResource<S>, StackError> {
        let mark = self.mark();
        let built = self.builder.build_in(call.resource(i)?, self);
        match &built {
            Err(_) => self.undo(mark),
            Ok(_) if i == 0 && self.layers_kept() > mark.1 => self.layer_under.set(true),
            Ok(_) => {}
        }
        built
    }

    /// How many handles, layers and steps this build has kept so far.
    fn mark(&self) -> (usize, usize, usize) {
        (self.handles.borrow().len(), self.layers_kept(), self.when_built.borrow().len())
    }

    /// Lets go of what this build kept since `mark`: the handles (and with
    /// them the resources only they hold), layers and steps of a build
    /// that failed.
    fn undo(&self, (handles, layers, steps): (usize, usize, usize)) {
        self.let_go_layers(layers);
        self.handles.borrow_mut().truncate(handles);
        self.when_built.borrow_mut().truncate(steps);
    }

    /// Keeps `resource` as the typed handle of `call` and returns it as a
    /// [`DynResource`], so that [`Built::get`] can hand it back.
    pub fn keep<T: MemoryResource<S> + Send + Sync + 'static>(
        &self,
        call: &Call,
        resource: T,
    ) -> DynResource<S> {
        self.kept(call, resource)
    }

    /// [`keep`](Self::keep), for a leaf whose type is [`MemoryOf<E>`]: the
    /// promise goes with it, for [`StackBuilder::register_leaf_of`].
    pub fn keep_leaf_of<E, T>(&self, call: &Call, resource: T) -> LeafOf<S, E>
    where
        T: MemoryResource<S> + MemoryOf<E> + Send + Sync + 'static,
    {
        leaf_of(self.kept(call, resource))
    }

    /// [`keep`](Self::keep), for a layer that keeps memory freed through
    /// it (a pool): [`Built::release_layers`] hands it out, so that what it
    /// keeps free can be given back later.
    ///
    /// The layer is one of the stack's innermost (what it gives back leaves
    /// the stack, and [`ReleaseLayers::held`] counts what it holds) unless
    /// such a layer was kept while its upstream was built: `call`'s first
    /// positional argument, built through [`upstream`](Self::upstream). Its [`Release::held`] is what it holds from
    /// that upstream; resources it builds from other arguments (a binning
    /// resource's counted bins) are layers of their own.
    pub fn keep_releasing<T>(&self, call: &Call, resource: T) -> DynResource<S>
    where
        T: MemoryResource<S> + Release<S> + 'static,
    {
        self.kept_releasing(call, resource)
    }

    /// Registers `layer` as what `call` keeps freed, for a resource that
    /// `call`'s constructor did not make: another built stack's
    /// [`ReleaseLayers`], so that a release of this stack goes on into that
    /// one's.
    pub fn keep_releasing_of(&self, call: &Call, layer: Arc<dyn Release<S>>) {
        self.push_releasing(call, layer, false);
    }

    /// [`keep_leaf_of`](Self::keep_leaf_of) and
    /// [`keep_releasing`](Self::keep_releasing) at once: a leaf of `E`'s
    /// memory that keeps freed memory (a virtual pool, a driver's pool).
    pub fn keep_leaf_of_releasing<E, T>(&self, call: &Call, resource: T) -> LeafOf<S, E>
    where
        T: MemoryResource<S> + MemoryOf<E> + Release<S> + 'static,
    {
        let resource = self.kept(call, resource);
        self.push_releasing(call, resource.clone(), false);
        leaf_of(resource)
    }

    /// How many resources this build has kept under `name` so far: for a
    /// leaf that gives each of its kind in one stack something of its own
    /// (a simulated device its own addresses).
    ///
    /// ```
    /// use memres_core::stack::StackBuilder;
    /// use memres_core::testing::BumpUpstream;
    /// use std::sync::{Arc, Mutex};
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let mut b = StackBuilder::<()>::new();
    /// let log = seen.clone();
    /// b.register("bump", move |call, cx| {
    ///     log.lock().unwrap().push(cx.kept_count("bump"));
    ///     Ok(cx.keep(call, BumpUpstream::new(1 << 20)))
    /// });
    /// b.build("binning(bump, bin(4096, bump))", &())?;
    /// assert_eq!(*seen.lock().unwrap(), [0, 1]);
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn kept_count(&self, name: &str) -> usize {
        let here = self.handles.borrow().iter().filter(|h| h.name == name).count();
        here + self.outer.map_or(0, |outer| outer.kept_count(name))
    }

    /// Builds `call` with the constructors of `builder` (a layer of this
    /// build that wraps another builder's resource: a snapshot's tap),
    /// keeping its handles and layers in this build. What it builds is
    /// under the call being built, as its upstream is
    /// ([`upstream`](Self::upstream)): a layer that keeps freed memory
    /// kept while it is built is under that call's.
    ///
    /// # Errors
    ///
    /// As [`StackBuilder::build_call`]; what the build kept is let go, as
    /// for [`upstream`](Self::upstream).
    pub fn build_with(&self, builder: &StackBuilder<S>, call: &Call) -> Result<DynResource<S>, StackError> {
        self.nested(builder, |cx| builder.build_in(call, cx))
    }

    /// [`build_with`](Self::build_with) for a leaf that `builder`
    /// registered by [`register_leaf_of::<E>`](StackBuilder::register_leaf_of),
    /// with the promise: for a layer that keeps it (a snapshot's tap).
    ///
    /// # Errors
    ///
    /// [`StackErrorKind::WrongKind`] at the call if its name is not such a
    /// leaf of `E`; else as [`build_with`](Self::build_with).
    pub fn build_leaf_of_with<E: 'static>(
        &self,
        builder: &StackBuilder<S>,
        call: &Call,
    ) -> Result<LeafOf<S, E>, StackError> {
        let typed = builder
            .leaf_constructor::<E>(&call.name)
            .ok_or_else(|| call.error(StackErrorKind::WrongKind("a leaf whose memory the engine reaches")))?;
        call.check_depth()?;
        self.nested(builder, |cx| typed(call, cx))
    }

    /// Runs `f` in a context of `builder` whose handles and layers join
    /// this one's if it succeeds.
    fn nested<T>(
        &self,
        builder: &StackBuilder<S>,
        f: impl FnOnce(&Context<'_, S>) -> Result<T, StackError>,
    ) -> Result<T, StackError> {
        let cx = Context::new(builder, self.stream, Some(self));
        // On error what it kept goes with `cx`, as an upstream's that failed.
        let built = f(&cx).inspect_err(|_| cx.let_go_layers(0))?;
        self.handles.borrow_mut().append(&mut cx.handles.into_inner());
        let mut layers = cx.releasing.into_inner();
        if !layers.is_empty() {
            // What the call being built wraps: its upstream.
            self.layer_under.set(true);
        }
        self.releasing.borrow_mut().append(&mut layers);
        self.when_built.borrow_mut().append(&mut cx.when_built.into_inner());
        Ok(built)
    }

    /// Has `ready` run once the whole stack is built, and what it gives
    /// done once every such step is ready; the build fails with the
    /// error of either: for what a stack refused must leave as it was (a
    /// `log` layer's file, opened and its first write tried by `ready`,
    /// cut by what it gives). Not
    /// run if the build fails; what `ready` gives is dropped undone if
    /// another step's `ready` fails.
    // Only `log` (feature `std`) waits so far.
    #[cfg_attr(not(feature = "std"), allow(dead_code))]
    pub(super) fn when_built<D: FnOnce() -> Result<(), StackError> + 'static>(
        &self,
        ready: impl FnOnce() -> Result<D, StackError> + 'static,
    ) {
        let step = move || ready().map(|done| alloc::boxed::Box::new(done) as Ready);
        self.when_built.borrow_mut().push(alloc::boxed::Box::new(step));
    }

    fn kept_releasing<T: Release<S> + 'static>(&self, call: &Call, resource: T) -> Arc<T> {
        let resource = self.kept(call, resource);
        self.push_releasing(call, resource.clone(), true);
        resource
    }

    /// [`keep`](Self::keep) of `resource`, with `layer(resource)` as
    /// what `call` keeps freed: for a layer whose figures as a layer are
    /// not the resource's own (`binning`, see [`BinningLayer`](super::release::BinningLayer)).
    pub(super) fn keep_releasing_as<T>(
        &self,
        call: &Call,
        resource: T,
        layer: impl FnOnce(Arc<T>) -> Arc<dyn Release<S>>,
    ) -> DynResource<S>
    where
        T: MemoryResource<S> + Send + Sync + 'static,
    {
        let resource = self.kept(call, resource);
        self.push_releasing(call, layer(resource.clone()), true);
        resource
    }

    /// How many layers that keep freed memory this build has kept so far:
    /// a constructor tells by it whether one was kept while it built a
    /// resource.
    pub(super) fn layers_kept(&self) -> usize {
        self.releasing.borrow().len()
    }

    fn push_releasing(&self, call: &Call, layer: Arc<dyn Release<S>>, let_go: bool) {
        let innermost = !self.layer_under.get();
        self.releasing.borrow_mut().push(Layer {
            name: call.name.clone(),
            pos: call.pos,
            innermost,
            let_go,
            layer,
        });
    }

    pub(super) fn kept<T: Send + Sync + 'static>(&self, call: &Call, resource: T) -> Arc<T> {
        let resource = Arc::new(resource);
        self.handles.borrow_mut().push(Handle {
            name: call.name.clone(),
            pos: call.pos,
            resource: resource.clone(),
        });
        resource
    }
}

/// A leaf kept as the `Arc` of its type `T`, with the promise of `E`'s
/// memory.
fn leaf_of<S: Stream + ?Sized + 'static, E, T>(resource: Arc<T>) -> LeafOf<S, E>
where
    T: MemoryResource<S> + MemoryOf<E> + Send + Sync + 'static,
{
    let resource: DynResource<S> = resource;
    // SAFETY: `resource` is the `Arc` of a `T`, and `T: MemoryOf<E>`:
    // every block it hands out meets the contract that
    // `AssumeMemoryOf::new` asks for, and so does every block of a clone,
    // which shares that one `T`.
    unsafe { AssumeMemoryOf::new(resource) }
}

/// A built stack and the typed handles of its resources.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Statistics;
/// use memres_core::stack::{StackBuilder, Unbacked};
/// use memres_core::{DynResource, MemoryResource, Request};
/// let mut builder = StackBuilder::<()>::new();
/// builder.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
/// let built = builder.build_with_handles("stats(pool(leaf))", &())?;
/// let b = built.resource.allocate(Request::new(1000)?, &())?;
/// let stats = built.get::<Statistics<DynResource>>("stats").unwrap();
/// assert_eq!(stats.get_bytes_counter().value, 1000);
/// assert!(built.get::<Unbacked>("leaf").is_some());
/// # built.resource.deallocate(b, &())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Built<S: ?Sized> {
    /// The stack.
    pub resource: DynResource<S>,
    /// Sorted by position in the text: outermost first.
    handles: Vec<Handle>,
    /// The layers that keep freed memory, outermost first.
    releasing: ReleaseLayers<S>,
}

impl<S: ?Sized> fmt::Debug for Built<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<(&str, usize)> = self.names().collect();
        f.debug_struct("Built").field("handles", &names).finish_non_exhaustive()
    }
}

impl<S: ?Sized> Built<S> {
    /// The first resource in the text named `name` among those of type `T`:
    /// the outermost along one chain of layers, the leftmost between
    /// siblings (the bins of a `binning`); `None` if none is. A resource
    /// named `name` of another type is passed over, not an answer: in
    /// `pool(pool(leaf), per_stream=true)` the `Shared<CoalescingPool<D>>`
    /// asked for is the inner pool. Only resources kept by their
    /// constructor ([`Context::keep`] and the like, those of a nested
    /// builder's included) are found, and the `Arc` is the stack's own
    /// resource, shared. The core's names keep these types (`D` is
    /// [`DynResource<S>`]): `pool` `Shared<CoalescingPool<D>>` (with `per_stream=true`:
    /// `Shared<PerStreamPool<PoolMaker<D>, S>>`), `stats` `Statistics<D>`,
    /// `track` `Tracking<D>`, `limit` `Limiting<D>`, `planned` `Planned<D>`,
    /// `align` `Aligned<D>`,
    /// `log` `Logging<D>`, `fixed` `Shared<FixedSizeResource<D>>`, `binning`
    /// `BinningResource<'static, D, S>`, `arena` `ArenaResource<D>`,
    /// `stream` (with [`register_stream_layer`](StackBuilder::register_stream_layer))
    /// `Shared<StreamOrdered<OnStream<S>, S>>`; a backend's leaves say theirs.
    pub fn get<T: Any + Send + Sync>(&self, name: &str) -> Option<Arc<T>> {
        self.all(name).into_iter().next()
    }

    /// The layers that keep memory freed through them ([`Release`] lists
    /// them), outermost first, to give that memory back
    /// ([`ReleaseLayers::release`], PyTorch's `empty_cache`).
    pub fn release_layers(&self) -> ReleaseLayers<S> {
        self.releasing.clone()
    }

    /// The name and the position in the text of every resource kept,
    /// outermost first: what [`all`](Self::all) finds them by.
    ///
    /// ```
    /// use memres_core::stack::{StackBuilder, Unbacked};
    /// let mut b = StackBuilder::<()>::new();
    /// b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    /// let built = b.build_with_handles("stats(pool(leaf))", &())?;
    /// assert_eq!(built.names().collect::<Vec<_>>(), [("stats", 0), ("pool", 6), ("leaf", 11)]);
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn names(&self) -> impl Iterator<Item = (&str, usize)> {
        self.handles.iter().map(|h| (h.name.as_str(), h.pos))
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

/// A leaf of a built stack that is memory of `E`: the resource of a type
/// that is [`MemoryOf<E>`] ([`Context::keep_leaf_of`]), or one promised so
/// by hand.
pub type LeafOf<S, E> = AssumeMemoryOf<DynResource<S>, E>;

/// Makes one leaf that is memory of `E` from its call.
type LeafConstructor<S, E> =
    Arc<dyn Fn(&Call, &Context<'_, S>) -> Result<LeafOf<S, E>, StackError> + Send + Sync>;

/// A registry of constructors by name, which builds stacks for streams of
/// type `S`.
///
/// [`new`](Self::new) registers the core's names (see the
/// [module](super)); backends register their leaves (`memres-sim`: `sim`,
/// `host`, `vpool`; `memres-cuda`: `cuda`, `async`, `managed`, `pinned`,
/// `vmm`, and the layer `prefetch`), and any other resource joins with one [`register`](Self::register)
/// call. [`build_with_handles`](Self::build_with_handles) also hands back
/// the typed resources (to read a `stats` adaptor's figures, a device's
/// peak...).
///
/// # Examples
///
/// ```
/// use memres_core::stack::{StackBuilder, StackErrorKind, Unbacked};
/// use memres_core::{MemoryResource, Request};
/// let mut b = StackBuilder::<()>::new();
/// let e = b.build("limit(stats(pool(leaf)), 2MiB)", &()).err().unwrap();
/// assert_eq!((e.pos, e.kind), (17, StackErrorKind::UnknownName("leaf".into())));
/// // One line adds a resource:
/// b.register("leaf", |call, cx| {
///     call.expect_args(0, &[])?;
///     Ok(cx.keep(call, Unbacked::new()))
/// });
/// let stack = b.build("limit(stats(pool(leaf, initial=1MiB)), 2MiB)", &())?;
/// let x = stack.allocate(Request::new(1 << 20)?, &())?;
/// assert!(stack.allocate(Request::new(2 << 20)?, &()).is_err());
/// stack.deallocate(x, &())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct StackBuilder<S: ?Sized> {
    constructors: BTreeMap<String, Constructor<S>>,
    /// The names registered by [`register_leaf_of`](Self::register_leaf_of)
    /// and not replaced since, with their typed constructors (each a
    /// `LeafConstructor<S, E>` of its engine `E`), which build what the
    /// names' entries in `constructors` build.
    leaves_of: BTreeMap<String, Arc<dyn Any + Send + Sync>>,
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

impl<S: Stream + ?Sized + 'static> StackBuilder<S> {
    /// A builder with no names.
    pub fn empty() -> Self {
        StackBuilder { constructors: BTreeMap::new(), leaves_of: BTreeMap::new() }
    }

    /// A builder with the core's names (see the [module](super)).
    pub fn new() -> Self
    where
        S::Event: Send,
    {
        let mut b = Self::empty();
        super::names::register(&mut b);
        b
    }

    /// Registers `stream(UP)`: RMM's stream-ordered layer
    /// ([`StreamOrdered`]) over the stack `UP`, which it reaches on the
    /// stream the stack is built on (see [`OnStream`]); for stream types
    /// that clone.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::stack::{StackBuilder, Unbacked};
    /// use memres_core::testing::IdStream;
    /// use memres_core::{MemoryResource, Request};
    /// let mut b = StackBuilder::<IdStream>::new();
    /// b.register("leaf", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    /// assert!(b.build("stream(pool(leaf))", &IdStream(0)).is_err());
    /// b.register_stream_layer();
    /// let stack = b.build("stream(pool(leaf))", &IdStream(0))?;
    /// let x = stack.allocate(Request::new(1000)?, &IdStream(1))?;
    /// stack.deallocate(x, &IdStream(1))?;
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
            Ok(cx.keep_releasing(call, Shared::new(StreamOrdered::new(inner))))
        })
    }

    /// Registers (or replaces) the constructor of `name`.
    pub fn register(
        &mut self,
        name: &str,
        constructor: impl Fn(&Call, &Context<'_, S>) -> Result<DynResource<S>, StackError> + Send + Sync + 'static,
    ) -> &mut Self {
        self.leaves_of.remove(name);
        self.constructors.insert(name.to_string(), Arc::new(constructor));
        self
    }

    /// Registers (or replaces) `name` as a leaf whose every resource is
    /// memory of `E` ([`MemoryOf<E>`]): the constructor makes it with
    /// [`Context::keep_leaf_of`], which asks that of its type (or promises
    /// it by hand, with the `unsafe` [`AssumeMemoryOf::new`]).
    /// [`is_leaf_of`](Self::is_leaf_of) then says so until `name` is
    /// registered again, and [`build_leaf_of`](Self::build_leaf_of) builds
    /// it with the promise.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::copy::MemoryOf;
    /// use memres_core::stack::{StackBuilder, Unbacked};
    /// use memres_core::testing::BumpUpstream;
    /// struct Engine;
    /// # struct Bytes(BumpUpstream);
    /// # impl memres_core::MemoryResource for Bytes {
    /// #     fn allocate(&self, r: memres_core::Request, s: &()) -> memres_core::Result<memres_core::Block> { self.0.allocate(r, s) }
    /// #     fn deallocate(&self, b: memres_core::Block, s: &()) -> memres_core::Result<()> { self.0.deallocate(b, s) }
    /// # }
    /// // SAFETY: (an example's engine, which touches nothing.)
    /// unsafe impl MemoryOf<Engine> for Bytes {}
    /// let mut b = StackBuilder::<()>::new();
    /// b.register_leaf_of::<Engine>("bytes", |call, cx| {
    ///     call.expect_args(0, &[])?;
    ///     Ok(cx.keep_leaf_of(call, Bytes(BumpUpstream::new(1 << 30))))
    /// });
    /// assert!(b.is_leaf_of::<Engine>("bytes") && !b.is_leaf_of::<()>("bytes"));
    /// assert!(b.build("stats(pool(bytes))", &()).is_ok());
    /// // Registered again without the promise, it has none.
    /// b.register("bytes", |call, cx| Ok(cx.keep(call, Unbacked::new())));
    /// assert!(!b.is_leaf_of::<Engine>("bytes"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register_leaf_of<E: 'static>(
        &mut self,
        name: &str,
        constructor: impl Fn(&Call, &Context<'_, S>) -> Result<LeafOf<S, E>, StackError> + Send + Sync + 'static,
    ) -> &mut Self {
        let typed: LeafConstructor<S, E> = Arc::new(constructor);
        let plain = typed.clone();
        self.register(name, move |call, cx| plain(call, cx).map(AssumeMemoryOf::into_inner));
        self.leaves_of.insert(name.to_string(), Arc::new(typed));
        self
    }

    /// Whether `name` was registered by
    /// [`register_leaf_of::<E>`](Self::register_leaf_of) and not replaced
    /// since: every resource it builds is memory of `E`.
    pub fn is_leaf_of<E: 'static>(&self, name: &str) -> bool {
        self.leaf_constructor::<E>(name).is_some()
    }

    /// The typed constructor of `name`, if it is a leaf of `E`.
    fn leaf_constructor<E: 'static>(&self, name: &str) -> Option<&LeafConstructor<S, E>> {
        self.leaves_of.get(name)?.downcast_ref()
    }

    /// Builds `call`, a leaf registered by
    /// [`register_leaf_of::<E>`](Self::register_leaf_of), with the promise.
    /// Its typed handles are dropped: a constructor that wraps the leaf of
    /// another builder (a snapshot's tap) calls
    /// [`Context::build_leaf_of_with`], which keeps them in its own build.
    ///
    /// # Errors
    ///
    /// [`StackErrorKind::WrongKind`] at the call if its name is not such a
    /// leaf of `E`; else as [`build_call`](Self::build_call).
    pub fn build_leaf_of<E: 'static>(&self, call: &Call, stream: &S) -> Result<LeafOf<S, E>, StackError> {
        let cx = Context::new(self, stream, None);
        let leaf = cx.build_leaf_of_with(self, call)?;
        cx.finish()?;
        Ok(leaf)
    }

    /// Registers (or replaces) `name` as a leaf that is `resource`, made by
    /// the program: every stack built with the name shares it. For what a
    /// string cannot describe, such as a
    /// [`CallbackResource`](crate::callback::CallbackResource) (its
    /// closures are code).
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::stack::{StackBuilder, Unbacked};
    /// use memres_core::{DynResource, MemoryResource, Request};
    /// use std::sync::Arc;
    /// let leaf: DynResource = Arc::new(Unbacked::new());
    /// let mut b = StackBuilder::<()>::new();
    /// b.register_resource("mine", leaf.clone());
    /// let stack = b.build("stats(pool(mine))", &())?;
    /// let x = stack.allocate(Request::new(1000)?, &())?;
    /// stack.deallocate(x, &())?;
    /// assert!(b.build("mine(1GiB)", &()).is_err(), "it takes no arguments");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn register_resource(&mut self, name: &str, resource: DynResource<S>) -> &mut Self {
        self.register(name, move |call, _| {
            call.expect_args(0, &[])?;
            Ok(resource.clone())
        })
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

    /// Builds a parsed stack (or one made by hand).
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), less the parse errors but
    /// [`StackErrorKind::TooDeep`]: a call made by hand nested more than
    /// [`MAX_DEPTH`](super::MAX_DEPTH) deep is refused before anything is
    /// built.
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
        let cx = Context::new(self, stream, None);
        let resource = self.build_in(call, &cx).inspect_err(|_| cx.let_go_layers(0))?;
        let (mut handles, releasing) = cx.finish()?;
        // A call's upstreams are written after its name: by position is
        // outermost first.
        handles.sort_by_key(|h| h.pos);
        Ok(Built { resource, handles, releasing: ReleaseLayers::new(releasing) })
    }

    fn build_in(&self, call: &Call, cx: &Context<'_, S>) -> Result<DynResource<S>, StackError> {
        // Every call a build recurses into: a constructor may hand
        // `Context::upstream` or `build_with` one made by hand.
        call.check_depth()?;
        let constructor = self
            .constructors
            .get(&call.name)
            .ok_or_else(|| call.error(StackErrorKind::UnknownName(call.name.clone())))?;
        // The call's own upstream decides what is under it; the caller's
        // is told after this returns, by `Context::upstream`.
        let outer = cx.layer_under.replace(false);
        let built = constructor(call, cx);
        cx.layer_under.set(outer);
        built
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
    fn allocate(&mut self, request: Request, _: &()) -> crate::Result<Block> {
        self.upstream.allocate(request, &self.stream)
    }

    fn deallocate(&mut self, block: Block, _: &()) -> crate::Result<()> {
        self.upstream.deallocate(block, &self.stream)
    }
}

#[cfg(test)]
mod tests;
