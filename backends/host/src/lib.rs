//! Host memory and the simulated device.
