//! The sandbox against real processes: each test runs a hostile (or ordinary) script and
//! checks the property from outside the sandbox. The `command` runner's tests, which go through
//! the sandbox too, are in the execution crate (`crates/execution/tests/sandbox.rs`).
//!
//! These need bubblewrap (`apt-get install bubblewrap`), python3 and node; a host without
//! bubblewrap fails them loudly rather than skipping, since a skipped isolation test proves
//! nothing.

mod cleanup;
mod helpers;
mod isolation;
mod limits;
mod modes;
