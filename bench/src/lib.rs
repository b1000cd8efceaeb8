//! skilleval's benchmarks: the programs in `src/bin/` measure the pipeline end to end
//! (`pipeline_bench`), the strategies' grading cost (`grading_bench`) and model-backed cases
//! against a slow provider (`llm_bench`). Their commands and latest figures are in
//! `docs/performance.md`.
//!
//! This library holds what more than one of them uses: [`mock_provider`], the 50 ms
//! OpenAI-compatible model server the model-backed measurements run against; [`cluster`],
//! the coordinator and workers as child processes, and the broker and database faults a soak
//! injects; [`soak`], the fault soak (`src/bin/soak.rs`, and scaled down in `tests/soak.rs`).

pub mod cluster;
pub mod mock_provider;
pub mod soak;
