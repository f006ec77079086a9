//! Stream-ordered RAII containers.
