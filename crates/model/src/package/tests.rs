//! Package loading from folders: which eval file wins, what is refused, the package root and
//! its content hash.

use serde_json::json;

use super::fixtures::{open, package, SKILL};
use super::*;
use crate::problem::Problem;

#[test]
fn first_eval_file_wins_and_others_are_flagged() {
    let v2 = json!({"version": "2.0", "testCases": [{"id": "a", "expected": {"output": "x"}}]});
    let dir = package(&[
        ("SKILL.md", SKILL),
        ("eval/tests.json", &v2.to_string()),
        ("evals/evals.json", r#"{"evals": []}"#),
    ]);
    let pkg = open(dir.path());
    assert_eq!(pkg.eval_file, "eval/tests.json");
    assert_eq!(pointers(&pkg.problems), [("evals/evals.json", "", false)]);
}

#[test]
fn non_utf8_json_is_refused_naming_the_file() {
    let dir = package(&[("SKILL.md", SKILL)]);
    std::fs::create_dir_all(dir.path().join("eval")).expect("mkdir");
    std::fs::write(
        dir.path().join("eval/tests.json"),
        b"{\"version\": \"2.0\xff\"}",
    )
    .expect("write");
    let err = Package::open(dir.path(), &PackageLimits::default()).expect_err("refused");
    assert_eq!(err.limit(), Some("non_utf8_json"));
    assert_eq!(err.entry(), Some("eval/tests.json"));
}

#[test]
fn folder_with_a_single_skill_subfolder_opens_it() {
    let dir = package(&[("my-skill/SKILL.md", SKILL), ("my-skill/tests.json", "[]")]);
    let pkg = open(dir.path());
    assert!(pkg.root().ends_with("my-skill"));
    assert!(pkg.has_file("SKILL.md"));
    assert_eq!(pkg.eval_file, "tests.json");
}

#[test]
fn own_outputs_do_not_change_the_hash() {
    let dir = package(&[("SKILL.md", SKILL), ("tests.json", "[]")]);
    let before = open(dir.path()).content_hash;
    std::fs::create_dir_all(dir.path().join("eval/runs/r1/grading")).expect("mkdir");
    std::fs::write(dir.path().join("eval/runs/r1/grading/a.json"), "{}").expect("write");
    std::fs::write(dir.path().join("eval/benchmark.json"), "{}").expect("write");
    std::fs::create_dir_all(dir.path().join(".git")).expect("mkdir");
    std::fs::write(dir.path().join(".git/HEAD"), "ref").expect("write");
    assert_eq!(open(dir.path()).content_hash, before);
    std::fs::write(dir.path().join("tests.json"), "[ ]").expect("write");
    assert_ne!(open(dir.path()).content_hash, before);
}

fn pointers(problems: &[Problem]) -> Vec<(&str, &str, bool)> {
    problems
        .iter()
        .map(|p| (p.file.as_str(), p.pointer.as_str(), p.is_error()))
        .collect()
}

#[test]
fn declared_dependencies_are_read_when_the_package_opens_and_bad_ones_are_problems() {
    let v2 = json!({"version": "2.0", "setup": {"dependencies": ["pypdf<5", "npm:left-pad@1.3.0"]},
                    "testCases": [{"id": "a", "expected": {"output": "x"}}]});
    let dir = package(&[
        ("SKILL.md", SKILL),
        ("eval/tests.json", &v2.to_string()),
        (
            "scripts/run.py",
            "#!/usr/bin/env python3\n# /// script\n# dependencies = [\"openpyxl>=3.1\", \"pandas>>2\"]\n# ///\n",
        ),
    ]);
    let pkg = open(dir.path());
    assert_eq!(pkg.dependencies.python, ["openpyxl>=3.1", "pypdf<5"]);
    assert_eq!(
        pkg.dependencies.node.get("left-pad").map(String::as_str),
        Some("1.3.0")
    );
    let bad: Vec<&Problem> = pkg.problems.iter().filter(|p| p.is_error()).collect();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].file, "scripts/run.py");
    assert_eq!(bad[0].pointer, "/dependencies/1");
    assert!(bad[0].message.contains("`pandas>>2`"), "{}", bad[0].message);
    assert!(bad[0].message.contains("line 2"), "{}", bad[0].message);
}

#[test]
fn the_nul_escape_is_found_in_a_file_read_a_block_at_a_time_even_across_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.json");
    // Every offset of the escape around the 64 KiB block boundary, and none at all.
    for at in (64 * 1024 - 6)..=(64 * 1024 + 1) {
        let mut bytes = vec![b' '; 70 * 1024];
        bytes[at..at + 6].copy_from_slice(b"\\u0000");
        fs::write(&path, &bytes).unwrap();
        assert!(holds_nul_escape_in(&path).unwrap(), "escape at {at}");
    }
    fs::write(&path, vec![b' '; 200 * 1024]).unwrap();
    assert!(!holds_nul_escape_in(&path).unwrap());
}
