//! The worker (being written).
