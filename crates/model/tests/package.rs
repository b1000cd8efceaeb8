//! ZIP packages built in the test with the zip crate's writer: every hardening refusal names
//! its limit and entry; a good ZIP opens like the folder it was made from.

use std::io::{Cursor, Write};
use std::path::Path;

use skilleval_model::package::{EvalFormat, Package, PackageError, PackageLimits};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

const SKILL: &str = "---\nname: demo-skill\ndescription: Does demo things.\n---\n# Demo\n";
const TESTS: &str = r#"{"version": "2.0", "testCases": [{"id": "a", "input": {"prompt": "hi"}, "expected": {"output": "hello"}}]}"#;

fn deflated() -> SimpleFileOptions {
    SimpleFileOptions::default().compression_method(CompressionMethod::Deflated)
}

/// A ZIP of `(name, bytes)` entries, in order.
fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut writer = ZipWriter::new(Cursor::new(Vec::new()));
    for (name, bytes) in entries {
        if name.ends_with('/') {
            writer.add_directory(*name, deflated()).expect("dir");
        } else {
            writer.start_file(*name, deflated()).expect("start");
            writer.write_all(bytes).expect("write");
        }
    }
    writer.finish().expect("finish").into_inner()
}

fn good_entries() -> Vec<(&'static str, &'static [u8])> {
    vec![
        ("SKILL.md", SKILL.as_bytes()),
        ("eval/tests.json", TESTS.as_bytes()),
    ]
}

fn refusal(bytes: &[u8], limits: &PackageLimits) -> (String, Option<String>, String) {
    match Package::from_zip_bytes(bytes, limits, None) {
        Err(PackageError::Refused {
            limit,
            entry,
            message,
        }) => (limit.to_string(), entry, message),
        Err(other) => panic!("expected a refusal, got {other}"),
        Ok(_) => panic!("expected a refusal, the package opened"),
    }
}

fn assert_refused(
    bytes: &[u8],
    limits: &PackageLimits,
    limit: &str,
    entry: Option<&str>,
) -> String {
    let (got_limit, got_entry, message) = refusal(bytes, limits);
    assert_eq!(got_limit, limit, "{message}");
    assert_eq!(got_entry.as_deref(), entry, "{message}");
    message
}

/// Replaces every occurrence of `from` by `to` (same length) in the raw archive.
fn patch(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let mut i = 0;
    let mut hits = 0;
    while i + from.len() <= bytes.len() {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(to);
            hits += 1;
        }
        i += 1;
    }
    assert!(hits > 0, "nothing patched");
}

/// Offsets of the central directory headers.
fn central_headers(bytes: &[u8]) -> Vec<usize> {
    (0..bytes.len().saturating_sub(4))
        .filter(|&i| bytes[i..i + 4] == [0x50, 0x4b, 0x01, 0x02])
        .collect()
}

/// Named so `cargo test package` selects these too.
mod zip_package {
    use super::*;

    #[test]
    fn good_zip_opens() {
        let pkg =
            Package::from_zip_bytes(&zip_of(&good_entries()), &PackageLimits::default(), None)
                .expect("opens");
        assert_eq!(pkg.format, Some(EvalFormat::V2));
        assert_eq!(pkg.name(), Some("demo-skill"));
        assert_eq!(pkg.config.test_cases.len(), 1);
        assert!(pkg.problems.is_empty(), "{:?}", pkg.problems);
        assert_eq!(pkg.content_hash.len(), 64);
    }

    #[test]
    fn zip_and_folder_hash_the_same_and_extraction_is_world_readable() {
        let folder = tempfile::tempdir().expect("tempdir");
        for (name, bytes) in good_entries() {
            let path = folder.path().join(name);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, bytes).expect("write");
        }
        std::fs::create_dir_all(folder.path().join("eval/fixtures")).expect("mkdir");
        std::fs::write(folder.path().join("eval/fixtures/data.csv"), "a,b\n").expect("write");
        // Our own outputs in the folder do not count.
        std::fs::create_dir_all(folder.path().join("eval/runs/r1")).expect("mkdir");
        std::fs::write(folder.path().join("eval/runs/r1/x.json"), "{}").expect("write");
        let from_folder =
            Package::open(folder.path(), &PackageLimits::default()).expect("folder opens");

        // The ZIP has everything inside one top-level folder (stripped), plus junk that is skipped.
        let zipped = zip_of(&[
            ("my-skill/", b""),
            ("my-skill/SKILL.md", SKILL.as_bytes()),
            ("my-skill/eval/tests.json", TESTS.as_bytes()),
            ("my-skill/eval/fixtures/data.csv", b"a,b\n"),
            ("my-skill/.git/HEAD", b"ref: refs/heads/main"),
            ("__MACOSX/my-skill/._SKILL.md", b"\0\x05\x16\x07"),
            (".DS_Store", b"junk"),
        ]);
        let from_zip =
            Package::from_zip_bytes(&zipped, &PackageLimits::default(), None).expect("zip opens");
        assert_eq!(from_zip.content_hash, from_folder.content_hash);
        let paths: Vec<&str> = from_zip.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            ["SKILL.md", "eval/fixtures/data.csv", "eval/tests.json"]
        );
        assert!(!from_zip.root().join("__MACOSX").exists());

        // A file written to a ZIP file on disk opens the same through `open`.
        let zip_file = tempfile::NamedTempFile::new().expect("tempfile");
        std::fs::write(zip_file.path(), &zipped).expect("write");
        let via_open = Package::open(zip_file.path(), &PackageLimits::default()).expect("opens");
        assert_eq!(via_open.content_hash, from_folder.content_hash);

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode =
                |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
            assert_eq!(mode(from_zip.root()), 0o755);
            assert_eq!(mode(&from_zip.root().join("eval")), 0o755);
            assert_eq!(mode(&from_zip.root().join("eval/fixtures")), 0o755);
            assert_eq!(mode(&from_zip.root().join("SKILL.md")), 0o644);
            assert_eq!(mode(&from_zip.root().join("eval/tests.json")), 0o644);
        }

        // The temporary extraction folder goes away with the package.
        let root = from_zip.root().to_path_buf();
        drop(from_zip);
        assert!(!root.exists());
    }

    #[test]
    fn extracts_into_a_given_destination() {
        let parent = tempfile::tempdir().expect("tempdir");
        let dest = parent.path().join("pkg");
        let pkg = Package::from_zip_bytes(
            &zip_of(&good_entries()),
            &PackageLimits::default(),
            Some(&dest),
        )
        .expect("opens");
        assert_eq!(pkg.root(), dest);
        drop(pkg);
        assert!(
            dest.join("SKILL.md").is_file(),
            "a given destination is kept"
        );
        // A destination that is not empty is not extracted into.
        let err = Package::from_zip_bytes(
            &zip_of(&good_entries()),
            &PackageLimits::default(),
            Some(&dest),
        )
        .expect_err("not empty");
        assert!(matches!(err, PackageError::Io { .. }), "{err}");
        assert!(err.to_string().contains("not empty"));

        // A refused archive leaves its destination empty.
        let dest = parent.path().join("refused");
        let mut entries = good_entries();
        entries.push(("../evil", b"x"));
        let err =
            Package::from_zip_bytes(&zip_of(&entries), &PackageLimits::default(), Some(&dest))
                .expect_err("refused");
        assert_eq!(err.limit(), Some("zip_slip"));
        assert!(
            !dest.exists() || std::fs::read_dir(&dest).expect("dest").count() == 0,
            "a refused zip_slip archive left files in its destination"
        );
        let mut entries = good_entries();
        // This one fails while decompressing, after other files were written.
        let zeros = vec![0u8; 4 * 1024 * 1024];
        entries.push(("zzz/zeros.bin", &zeros));
        let mut bytes = zip_of(&entries);
        let real = u32::try_from(zeros.len()).expect("fits").to_le_bytes();
        patch(&mut bytes, &real, &1000u32.to_le_bytes());
        let limits = PackageLimits {
            max_compression_ratio: 1e9,
            ..PackageLimits::default()
        };
        let err = Package::from_zip_bytes(&bytes, &limits, Some(&dest)).expect_err("refused");
        assert_eq!(err.entry(), Some("zzz/zeros.bin"), "{err}");
        assert_eq!(std::fs::read_dir(&dest).expect("dest").count(), 0);
    }

    #[test]
    fn zip_bomb_is_refused_by_ratio() {
        let zeros = vec![0u8; 12 * 1024 * 1024];
        let mut entries = good_entries();
        entries.push(("eval/fixtures/zeros.bin", &zeros));
        let bytes = zip_of(&entries);
        let message = assert_refused(
            &bytes,
            &PackageLimits::default(),
            "compression_ratio",
            Some("eval/fixtures/zeros.bin"),
        );
        assert!(message.contains("zip bomb"), "{message}");
    }

    #[test]
    fn zip_bomb_is_refused_by_total_size() {
        let zeros = vec![0u8; 12 * 1024 * 1024];
        let mut entries = good_entries();
        entries.push(("eval/fixtures/zeros.bin", &zeros));
        let bytes = zip_of(&entries);
        let limits = PackageLimits {
            max_compression_ratio: 1_000_000.0,
            max_uncompressed_bytes: 10 * 1024 * 1024,
            ..PackageLimits::default()
        };
        assert_refused(
            &bytes,
            &limits,
            "max_uncompressed_bytes",
            Some("eval/fixtures/zeros.bin"),
        );
    }

    #[test]
    fn lying_declared_size_does_not_get_past_the_counting() {
        // Declare 1,000 bytes for an entry that inflates to 12 MiB: the central-directory checks
        // pass, and the bytes actually decompressed are what is limited.
        let zeros = vec![0u8; 12 * 1024 * 1024];
        let mut entries = good_entries();
        entries.push(("zeros.bin", &zeros));
        let mut bytes = zip_of(&entries);
        let real = u32::try_from(zeros.len()).expect("fits").to_le_bytes();
        patch(&mut bytes, &real, &1000u32.to_le_bytes());
        let limits = PackageLimits {
            max_compression_ratio: 1_000_000.0,
            max_uncompressed_bytes: 4 * 1024 * 1024,
            ..PackageLimits::default()
        };
        let (limit, entry, message) = refusal(&bytes, &limits);
        assert_eq!(entry.as_deref(), Some("zeros.bin"), "{message}");
        // Either our counting stops it, or the reader stops at the declared size and the CRC fails;
        // it is never extracted whole.
        assert!(
            limit == "max_uncompressed_bytes" || limit == "corrupt_entry",
            "{limit}: {message}"
        );
    }

    #[test]
    fn per_file_size_is_limited() {
        let big = vec![7u8; 4096];
        let mut entries = good_entries();
        entries.push(("big.bin", &big));
        let limits = PackageLimits {
            max_file_bytes: 1000,
            ..PackageLimits::default()
        };
        assert_refused(
            &zip_of(&entries),
            &limits,
            "max_file_bytes",
            Some("big.bin"),
        );
    }

    #[test]
    fn zip_slip_is_refused() {
        for name in ["../evil", "a/../../evil", "..\\evil"] {
            let mut entries = good_entries();
            entries.push((name, b"x"));
            assert_refused(
                &zip_of(&entries),
                &PackageLimits::default(),
                "zip_slip",
                Some(name),
            );
        }
    }

    #[test]
    fn absolute_paths_are_refused() {
        for name in ["/etc/x", "C:\\Windows\\x", "c:/x", "\\\\server\\share\\x"] {
            let mut entries = good_entries();
            entries.push((name, b"x"));
            assert_refused(
                &zip_of(&entries),
                &PackageLimits::default(),
                "absolute_path",
                Some(name),
            );
        }
    }

    #[test]
    fn symlink_entries_are_refused() {
        let mut writer = ZipWriter::new(Cursor::new(Vec::new()));
        writer.start_file("SKILL.md", deflated()).expect("start");
        writer.write_all(SKILL.as_bytes()).expect("write");
        writer
            .add_symlink(
                "eval/tests.json",
                "/etc/passwd",
                SimpleFileOptions::default(),
            )
            .expect("symlink");
        let bytes = writer.finish().expect("finish").into_inner();
        assert_refused(
            &bytes,
            &PackageLimits::default(),
            "symlink",
            Some("eval/tests.json"),
        );
    }

    #[test]
    fn duplicate_names_are_refused() {
        // The writer refuses duplicates, so write two names and make them equal afterwards.
        let mut bytes = zip_of(&[
            ("SKILL.md", SKILL.as_bytes()),
            ("dupA.txt", b"1"),
            ("dupB.txt", b"2"),
        ]);
        patch(&mut bytes, b"dupB.txt", b"dupA.txt");
        assert_refused(
            &bytes,
            &PackageLimits::default(),
            "duplicate_name",
            Some("dupA.txt"),
        );
    }

    #[test]
    fn names_normalising_to_the_same_path_are_duplicates() {
        let mut entries = good_entries();
        entries.push(("eval//tests.json", b"{}"));
        let message = assert_refused(
            &zip_of(&entries),
            &PackageLimits::default(),
            "duplicate_name",
            Some("eval//tests.json"),
        );
        assert!(message.contains("same path `eval/tests.json`"), "{message}");
        let mut entries = good_entries();
        entries.push(("SKILL.md/inner", b"x"));
        assert_refused(
            &zip_of(&entries),
            &PackageLimits::default(),
            "duplicate_name",
            Some("SKILL.md/inner"),
        );
    }

    #[test]
    fn too_many_files_are_refused() {
        let entries: Vec<(String, Vec<u8>)> =
            (0..5).map(|i| (format!("f{i}.txt"), vec![b'x'])).collect();
        let refs: Vec<(&str, &[u8])> = entries
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_slice()))
            .collect();
        let limits = PackageLimits {
            max_files: 3,
            ..PackageLimits::default()
        };
        assert_refused(&zip_of(&refs), &limits, "max_files", Some("f3.txt"));
    }

    #[test]
    fn oversize_archive_is_refused() {
        let limits = PackageLimits {
            max_compressed_bytes: 100,
            ..PackageLimits::default()
        };
        let message = assert_refused(
            &zip_of(&good_entries()),
            &limits,
            "max_compressed_bytes",
            None,
        );
        assert!(
            message.contains("limit max_compressed_bytes = 100 bytes"),
            "{message}"
        );
        // Through `open`, the file's size is checked before it is read.
        let file = tempfile::NamedTempFile::new().expect("tempfile");
        std::fs::write(file.path(), zip_of(&good_entries())).expect("write");
        let err = Package::open(file.path(), &limits).expect_err("refused");
        assert_eq!(err.limit(), Some("max_compressed_bytes"));
    }

    #[test]
    fn not_a_zip_is_refused() {
        assert_refused(
            b"this is not a zip file at all",
            &PackageLimits::default(),
            "not_a_zip",
            None,
        );
        assert_refused(b"", &PackageLimits::default(), "not_a_zip", None);
    }

    #[test]
    fn encrypted_entries_are_refused() {
        let mut bytes = zip_of(&good_entries());
        // Set bit 0 (encrypted) of the general-purpose flags of the second central header.
        let at = central_headers(&bytes)[1] + 8;
        bytes[at] |= 1;
        assert_refused(
            &bytes,
            &PackageLimits::default(),
            "encrypted",
            Some("eval/tests.json"),
        );
    }

    #[test]
    fn non_utf8_names_are_refused() {
        let mut bytes = zip_of(&[("SKILL.md", SKILL.as_bytes()), ("caf#.txt", b"x")]);
        patch(&mut bytes, b"caf#.txt", b"caf\xe9.txt");
        let (limit, entry, _) = refusal(&bytes, &PackageLimits::default());
        assert_eq!(limit, "non_utf8_name");
        assert_eq!(entry.as_deref(), Some("caf\u{fffd}.txt"));
    }

    #[test]
    fn deep_paths_are_refused() {
        let mut entries = good_entries();
        entries.push(("a/b/c/d/e.txt", b"x"));
        let limits = PackageLimits {
            max_path_depth: 4,
            ..PackageLimits::default()
        };
        assert_refused(
            &zip_of(&entries),
            &limits,
            "max_path_depth",
            Some("a/b/c/d/e.txt"),
        );
    }

    #[test]
    fn refusal_messages_read_well() {
        let mut entries = good_entries();
        entries.push(("../evil", b"x"));
        let err = Package::from_zip_bytes(&zip_of(&entries), &PackageLimits::default(), None)
            .expect_err("refused");
        assert_eq!(
            err.to_string(),
            "package refused (zip_slip): `../evil`: the path has a `..` segment and would leave the package"
        );
        assert!(err.is_client_error());
    }
}
