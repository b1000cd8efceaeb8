//! The ZIP loader on arbitrary bytes: refuse or open, never panic; an opened package is also
//! scanned for risks (every file it extracted is read).
#![no_main]

use libfuzzer_sys::fuzz_target;
use skilleval_model::package::{Package, PackageLimits};

fuzz_target!(|data: &[u8]| {
    // Small limits: the fuzzer explores the checks, not the disk.
    let limits = PackageLimits {
        max_compressed_bytes: 1 << 20,
        max_uncompressed_bytes: 4 << 20,
        max_files: 64,
        max_file_bytes: 1 << 20,
        max_path_depth: 8,
        ..PackageLimits::default()
    };
    if let Ok(package) = Package::from_zip_bytes(data, &limits, None) {
        let _ = package.risk_report();
    }
});
