//! `skilleval submit` against a real coordinator, through the CLI's library crate.

use serde_json::json;
use skilleval_cli::submit as cli_submit;

use crate::helpers::spawn_app;
use crate::packages::{given_tests, invalid_tests_package, skill_md};

fn args(path: std::path::PathBuf, server: &str) -> cli_submit::SubmitArgs {
    cli_submit::SubmitArgs {
        path,
        server: server.to_string(),
        wait: false,
        token: None,
        timeout_secs: 60,
        poll_secs: 0.1,
        quiet: true,
    }
}

#[tokio::test]
async fn submit_zips_a_folder_uploads_it_and_exits_2_on_a_bad_package() {
    let app = spawn_app().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("SKILL.md"), skill_md("from-folder")).unwrap();
    std::fs::create_dir_all(dir.path().join("eval")).unwrap();
    std::fs::write(
        dir.path().join("eval/tests.json"),
        serde_json::to_vec(&given_tests(&["ok", "ok"], json!({}))).unwrap(),
    )
    .unwrap();
    assert_eq!(
        cli_submit::submit(&args(dir.path().to_path_buf(), &app.address)).await,
        0
    );
    assert_eq!(app.count("runs").await, 1);
    assert_eq!(app.wait_for_jobs(2).await, 2, "one job per case");

    let bad = dir.path().join("bad.zip");
    std::fs::write(&bad, invalid_tests_package()).unwrap();
    assert_eq!(cli_submit::submit(&args(bad, &app.address)).await, 2);
    assert_eq!(
        app.count("runs").await,
        1,
        "nothing stored for the bad package"
    );
    assert_eq!(
        cli_submit::submit(&args(dir.path().to_path_buf(), "http://127.0.0.1:1")).await,
        2
    );
    app.cleanup().await;
}
