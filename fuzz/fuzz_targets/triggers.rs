//! A trigger file (`evals/triggers.json`) on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skilleval_model::package::formats;

fuzz_target!(|data: &[u8]| {
    let _ = formats::convert_triggers("evals/triggers.json", data);
});
