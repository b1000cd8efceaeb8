//! `tests.json` (v2, and v1 lists), through both readers: whole ([`formats::convert`]) and
//! streamed ([`formats::v2_header`] then [`formats::v2_case_chunks`]). Both must agree on the
//! cases they read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skilleval_model::package::formats;

fuzz_target!(|data: &[u8]| {
    let file = "eval/tests.json";
    let whole = formats::convert(file, data);
    if let Some(_header) = formats::v2_header(file, data) {
        let mut streamed = 0usize;
        let chunks = formats::v2_case_chunks(file, data, 3, |list| {
            let (cases, _, _) = list.into_parts();
            streamed += cases.len();
        });
        if let (Ok(whole), Ok(())) = (&whole, chunks) {
            assert_eq!(
                whole.config.test_cases.len(),
                streamed,
                "the streamed reader read another number of cases than the whole one"
            );
        }
    }
});
