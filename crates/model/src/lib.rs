//! skilleval's model: what a skill and its evaluation are, and the vocabulary every layer above
//! speaks. It reads a package's files (hardened against hostile archives) but never runs them,
//! does no network I/O and needs no async runtime; it knows strategies and runners only by
//! name.
//!
//! - [`package`] opens a skill folder or ZIP (hardened against hostile archives), reads
//!   `SKILL.md` and converts any accepted eval format into the one [`definition`], reporting
//!   every [`problem`] with a JSON pointer;
//! - [`grade`] is what every layer above speaks: a grade, a fault (and whether retrying helps),
//!   usage; [`output`] is what a runner produced; [`gate`] the regression gate a run asks for.

pub mod definition;
pub mod gate;
pub mod grade;
pub mod json_stream;
pub mod output;
pub mod package;
pub mod problem;
pub mod text;
