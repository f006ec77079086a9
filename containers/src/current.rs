//! The resource of the containers made without one: the current resource
//! of the stream's device, promised as memory of the engine.

use crate::Result;
use memres_core::device::{get_per_device_resource_of, CurrentResource, DeviceStream};

/// The resource of a container made without one (`DeviceUVector::new(n,
/// stream)`): the current resource of the stream's device in the
/// process-wide registry, promised as memory of engines of type `E`
/// (see [`memres_core::device::set_per_device_resource_of`]).
pub type Current<S, E> = CurrentResource<<S as DeviceStream>::Key, E>;

/// The current resource of `stream`'s device and the engine promised with
/// it.
///
/// # Errors
///
/// The registry's: `InvalidConfig` when the device has no resource and no
/// default, or one not promised as memory of `E`.
pub(crate) fn current<S, E>(stream: &S) -> Result<(Current<S, E>, E)>
where
    S: DeviceStream,
    E: Clone + Send + Sync + 'static,
{
    Ok(get_per_device_resource_of::<S::Key, E>(stream.device())?)
}
