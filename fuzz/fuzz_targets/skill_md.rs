//! `SKILL.md` front matter on arbitrary text, and the risk rules over the same text (as
//! `SKILL.md` and as a script).
#![no_main]

use libfuzzer_sys::fuzz_target;
use skilleval_model::package::{risk, skill_md};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (manifest, _problems) = skill_md::parse(text);
    if let Some(manifest) = manifest {
        let _ = manifest.description_hash();
    }
    let mut findings = Vec::new();
    risk::scan_file("SKILL.md", data.len() as u64, data, &mut findings);
    risk::scan_file("scripts/run.py", data.len() as u64, data, &mut findings);
});
