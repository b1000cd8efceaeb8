//! Skill packages for the tests, built in memory: good ones, and hostile or broken ones.

use std::io::{Cursor, Write as _};

use serde_json::{json, Value};
use zip::write::SimpleFileOptions;

/// A ZIP of `(path, contents)` entries, deflated.
pub fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    for (path, bytes) in entries {
        w.start_file(*path, options).expect("start entry");
        w.write_all(bytes).expect("write entry");
    }
    w.finish().expect("finish zip").into_inner()
}

pub fn skill_md(name: &str) -> String {
    format!("---\nname: {name}\ndescription: A test skill that answers with recorded outputs.\n---\n\nAnswer briefly.\n")
}

/// A v2 definition whose cases carry recorded outputs (`given` runner): runs anywhere, no
/// model, no sandbox. `outputs[i]` is case i's output; every case expects `"ok"`.
pub fn given_tests(outputs: &[&str], settings: Value) -> Value {
    let cases: Vec<Value> = outputs
        .iter()
        .enumerate()
        .map(|(i, out)| {
            json!({
                "id": format!("case-{i:03}"),
                "name": format!("Case {i}"),
                "input": { "prompt": format!("Say ok ({i})") },
                "expected": { "output": "ok" },
                "evaluation": { "strategy": "exact_match" },
                "given": { "output": out },
            })
        })
        .collect();
    let mut settings = settings;
    if let Value::Object(map) = &mut settings {
        map.entry("runner").or_insert(json!("given"));
    }
    json!({ "version": "2.0", "profile": "deterministic", "settings": settings, "testCases": cases })
}

/// A valid `given` package named `name`.
pub fn given_package(name: &str, outputs: &[&str], settings: Value) -> Vec<u8> {
    let tests = serde_json::to_vec_pretty(&given_tests(outputs, settings)).expect("json");
    zip_of(&[
        ("SKILL.md", skill_md(name).as_bytes()),
        ("eval/tests.json", &tests),
    ])
}

/// A file of zeros that compresses far past the ratio limit.
pub fn zip_bomb() -> Vec<u8> {
    let zeros = vec![0u8; 8 * 1024 * 1024];
    zip_of(&[
        ("SKILL.md", skill_md("bomb").as_bytes()),
        ("eval/fixtures/zeros.bin", &zeros),
    ])
}

/// An entry whose path climbs out of the package.
pub fn zip_slip() -> Vec<u8> {
    zip_of(&[
        ("SKILL.md", skill_md("slip").as_bytes()),
        ("../../etc/evil.txt", b"pwned"),
    ])
}

/// An entry that is a symbolic link.
pub fn zip_symlink() -> Vec<u8> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default();
    w.start_file("SKILL.md", options).expect("entry");
    w.write_all(skill_md("links").as_bytes()).expect("write");
    w.add_symlink("eval/tests.json", "/etc/passwd", options)
        .expect("symlink entry");
    w.finish().expect("finish").into_inner()
}

/// A definition with several independent errors: a duplicate id, a bad regex, a missing
/// expected output.
pub fn invalid_tests_package() -> Vec<u8> {
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "testCases": [
            { "id": "a", "name": "A", "input": {"prompt": "x"}, "expected": {"output": "y"} },
            { "id": "a", "name": "A again", "input": {"prompt": "x"}, "expected": {"output": "y"} },
            { "id": "b", "name": "B", "input": {"prompt": "x"},
              "expected": {"patterns": ["([unclosed"]}, "evaluation": {"strategy": "regex_match"} },
            { "id": "c", "name": "C", "input": {"prompt": "x"}, "evaluation": {"strategy": "exact_match"} }
        ]
    });
    let tests = serde_json::to_vec_pretty(&tests).expect("json");
    zip_of(&[
        ("SKILL.md", skill_md("broken").as_bytes()),
        ("eval/tests.json", &tests),
    ])
}
