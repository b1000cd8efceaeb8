//! skill-creator's `evals/evals.json` on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skilleval_model::package::formats;

fuzz_target!(|data: &[u8]| {
    let _ = formats::convert("evals/evals.json", data);
});
