//! Size and shape limits applied to every package, ZIP or folder, before anything in it is
//! parsed. Each limit has a name (the field name) that refusals quote, so an uploader is told
//! exactly which one they hit and can ask for it to be raised.

use serde::{Deserialize, Serialize};

const MIB: u64 = 1024 * 1024;

/// Configurable package limits; every field has a default, so a config may set only some.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PackageLimits {
    /// Size of the ZIP as uploaded. Default 50 MiB.
    pub max_compressed_bytes: u64,
    /// Sum of the bytes actually decompressed (declared sizes are not trusted). Default 200 MiB.
    pub max_uncompressed_bytes: u64,
    /// Number of files (directories do not count). Default 2,000.
    pub max_files: usize,
    /// Size of any one file once decompressed. Default 50 MiB.
    pub max_file_bytes: u64,
    /// Per-file decompressed:compressed ratio above which an entry is taken for a zip bomb.
    /// Default 100 (100:1).
    pub max_compression_ratio: f64,
    /// The ratio is only checked once an entry has decompressed more than this many bytes:
    /// small, highly repetitive files (a JSON of zeros, an empty-ish CSV) compress far better
    /// than 100:1 and are harmless. Default 1 MiB.
    pub compression_ratio_min_bytes: u64,
    /// Number of path segments of a file below the package root. Default 32.
    pub max_path_depth: usize,
}

impl Default for PackageLimits {
    fn default() -> Self {
        PackageLimits {
            max_compressed_bytes: 50 * MIB,
            max_uncompressed_bytes: 200 * MIB,
            max_files: 2_000,
            max_file_bytes: 50 * MIB,
            max_compression_ratio: 100.0,
            compression_ratio_min_bytes: MIB,
            max_path_depth: 32,
        }
    }
}

/// Formats a byte count for messages (`52428800` -> `50.0 MiB`).
pub(crate) fn human_bytes(n: u64) -> String {
    const KIB: f64 = 1024.0;
    // Precision loss above 2^53 bytes is irrelevant for a message.
    #[allow(clippy::cast_precision_loss)]
    let f = n as f64;
    if f >= KIB * KIB * KIB {
        format!("{:.1} GiB", f / (KIB * KIB * KIB))
    } else if f >= KIB * KIB {
        format!("{:.1} MiB", f / (KIB * KIB))
    } else if f >= KIB {
        format!("{:.1} KiB", f / KIB)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_config_keeps_other_defaults() {
        let limits: PackageLimits =
            serde_json::from_str(r#"{"max_files": 10}"#).expect("valid limits");
        assert_eq!(limits.max_files, 10);
        assert_eq!(limits.max_compressed_bytes, 50 * MIB);
        assert!((limits.max_compression_ratio - 100.0).abs() < f64::EPSILON);
    }

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(12), "12 bytes");
        assert_eq!(human_bytes(50 * MIB), "50.0 MiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }
}
