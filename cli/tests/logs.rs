//! Logs written to a pipe or a file are plain text: no ANSI colour codes.

use std::process::Command;

#[test]
fn logs_carry_no_colour_codes_off_a_terminal() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/skills/slugify");
    let out = Command::new(env!("CARGO_BIN_EXE_skilleval"))
        .args(["-vv", "run", "--no-write", "--quiet"])
        .arg(&example)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("DEBUG") || stderr.contains("INFO"),
        "-vv logs something: {stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes in a pipe: {stderr:?}"
    );
}
