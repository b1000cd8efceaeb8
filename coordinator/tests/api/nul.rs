//! The NUL character (U+0000), which PostgreSQL's `text` and `jsonb` refuse, wherever a request
//! can carry it toward the store: a JSON body, a query parameter, a path, an uploaded
//! package's `SKILL.md` and definition. Each is a 4xx naming where it is, never a server error,
//! and nothing is stored.

use serde_json::{json, Value};
use skilleval_model::text::NUL_RULE;

use crate::helpers::spawn_app;
use crate::packages::{given_tests, skill_md, zip_of};

#[tokio::test]
async fn a_nul_character_is_refused_naming_where_it_is_and_stores_nothing() {
    let app = spawn_app().await;
    let before = app.all_counts().await;

    // A JSON body (schemathesis found this one as a 500).
    let r = app
        .post_json(
            "/v1/reports",
            &json!({ "skill": "a\u{0}b", "format": "json" }),
        )
        .await;
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_body", "{body}");
    assert_eq!(body["error"]["details"]["field"], "/skill", "{body}");
    assert_eq!(body["error"]["details"]["rule"], NUL_RULE, "{body}");

    // A query parameter.
    let (status, body) = app.get_json("/v1/runs?skill=x%00y").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_query", "{body}");
    assert_eq!(body["error"]["details"]["field"], "skill", "{body}");
    assert_eq!(body["error"]["details"]["rule"], NUL_RULE, "{body}");

    // Paths: the route's parameter is named (the first one holding it).
    for (path, field) in [
        ("/v1/skills/x%00y", "name"),
        ("/v1/skills/x%00y/history", "name"),
        ("/v1/skills/ok/versions/1.0%00/definition", "version"),
        ("/v1/skills/x%00y/versions/1.0%00/definition", "name"),
    ] {
        let (status, body) = app.get_json(path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"]["code"], "invalid_path", "{path}: {body}");
        assert_eq!(body["error"]["details"]["field"], field, "{path}: {body}");
        assert_eq!(body["error"]["details"]["rule"], NUL_RULE, "{path}: {body}");
    }

    // An upload whose SKILL.md, definition or trigger file holds it: 422 naming the file and
    // the pointer. (A raw NUL in the front matter is refused by YAML itself; the escape `\0`
    // in a double-quoted string is not.)
    let tests = serde_json::to_vec(&given_tests(&["ok"], json!({}))).unwrap();
    let escaped = "---\nname: nul-desc\ndescription: \"A test\\0 skill\"\n---\n\nAnswer.\n";
    let mut case_id = given_tests(&["ok"], json!({}));
    case_id["testCases"][0]["id"] = json!("case\u{0}one");
    let case_id = serde_json::to_vec(&case_id).unwrap();
    let triggers = serde_json::to_vec(&json!([
        {"query": "fine", "should_trigger": true},
        {"query": "not\u{0}fine", "should_trigger": false}
    ]))
    .unwrap();
    let cases = [
        (
            zip_of(&[
                ("SKILL.md", escaped.as_bytes()),
                ("eval/tests.json", &tests),
            ]),
            ("SKILL.md", "/description"),
        ),
        (
            zip_of(&[
                ("SKILL.md", skill_md("nul-case").as_bytes()),
                ("eval/tests.json", &case_id),
            ]),
            ("eval/tests.json", "/testCases/0/id"),
        ),
        (
            zip_of(&[
                ("SKILL.md", skill_md("nul-trigger").as_bytes()),
                ("eval/tests.json", &tests),
                ("eval/triggers.json", &triggers),
            ]),
            ("eval/triggers.json", "/1/query"),
        ),
    ];
    for (zip, (file, pointer)) in cases {
        let r = app.upload_zip(zip, "").await;
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 422, "{file}: {body}");
        assert_eq!(body["error"]["code"], "package_invalid", "{body}");
        let problems = body["error"]["details"]["problems"].as_array().unwrap();
        assert!(
            problems
                .iter()
                .any(|p| p["file"] == file && p["pointer"] == pointer && p["message"] == NUL_RULE),
            "{file}{pointer}: {body}"
        );
    }

    assert_eq!(app.all_counts().await, before, "nothing was stored");
    app.cleanup().await;
}
