//! The CUDA backend of memres.
