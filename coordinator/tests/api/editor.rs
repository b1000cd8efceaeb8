//! The test-case editor's endpoints against a real coordinator: the stored definition as
//! JSON, the package rebuilt around an edited definition (validated by the upload's code, every
//! problem listed with file and pointer), a case previewed with an edited definition, and a
//! JSON Schema compiled as typed.

use std::io::{Cursor, Read as _};

use serde_json::{json, Value};
use skilleval_grading::StrategyRegistry;
use skilleval_model::package::{Package, PackageLimits};

use crate::helpers::{spawn_app, TestApp};
use crate::openapi::{check, doc};
use crate::packages::given_package;

/// Stores `name` (two `exact_match` cases expecting "ok") without running it; its version label.
async fn stored(app: &TestApp, name: &str) -> String {
    let r = app
        .upload_zip(given_package(name, &["ok", "no"], json!({})), "?run=false")
        .await;
    assert_eq!(r.status().as_u16(), 201);
    let body: Value = r.json().await.unwrap();
    body["version"].as_str().unwrap().to_string()
}

fn entry(zip: &[u8], name: &str) -> Option<Vec<u8>> {
    let mut archive = zip::ZipArchive::new(Cursor::new(zip)).unwrap();
    let mut file = archive.by_name(name).ok()?;
    let mut out = Vec::new();
    file.read_to_end(&mut out).unwrap();
    Some(out)
}

#[tokio::test]
async fn the_edited_definition_comes_back_as_a_valid_package() {
    let app = spawn_app().await;
    let doc = doc();
    let version = stored(&app, "editable").await;
    let (status, body) = app
        .get_json(&format!(
            "/v1/skills/editable/versions/{version}/definition"
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    check(
        &doc,
        "get",
        "/v1/skills/{name}/versions/{version}/definition",
        200,
        &body,
    );
    assert_eq!(body["eval_file"], "eval/tests.json");
    assert_eq!(body["converted"], false);
    // As written: the recorded outputs the canonical model also keeps, and the runner.
    assert_eq!(body["definition"]["settings"]["runner"], "given");
    let mut definition = body["definition"].clone();
    assert_eq!(definition["testCases"].as_array().unwrap().len(), 2);

    definition["testCases"][1]["expected"]["output"] = json!("no");
    definition["testCases"][1]["name"] = json!("Edited <case>");
    let r = app
        .post_json(
            &format!("/v1/skills/editable/versions/{version}/package"),
            &json!({ "definition": definition }),
        )
        .await;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "application/zip");
    assert!(r.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment; filename=\"editable-"));
    let zip = r.bytes().await.unwrap().to_vec();
    // The skill's own files are kept; the definition is the edited one.
    assert!(entry(&zip, "SKILL.md").is_some());
    let tests: Value = serde_json::from_slice(&entry(&zip, "eval/tests.json").unwrap()).unwrap();
    assert_eq!(tests["testCases"][1]["expected"]["output"], "no");
    assert_eq!(tests["testCases"][1]["name"], "Edited <case>");
    // And it validates as a package.
    let package = Package::from_zip_bytes(&zip, &PackageLimits::default(), None).unwrap();
    let validation =
        skilleval_execution::validate::validate(&package, &StrategyRegistry::builtin().build());
    assert!(validation.is_ok(), "{:?}", validation.problems);
    assert_eq!(package.config.test_cases.len(), 2);
    // Nothing was stored: still one version.
    assert_eq!(app.count("skill_versions").await, 1);
    app.cleanup().await;
}

#[tokio::test]
async fn an_invalid_edit_lists_every_problem_with_file_and_pointer() {
    let app = spawn_app().await;
    let doc = doc();
    let version = stored(&app, "breakable").await;
    let (_, body) = app
        .get_json(&format!(
            "/v1/skills/breakable/versions/{version}/definition"
        ))
        .await;
    let mut definition = body["definition"].clone();
    definition["testCases"][0]["evaluation"] = json!({ "strategy": "llm_judge" });
    definition["testCases"][0]["expected"]["rubric"] = json!({
        "criteria": [
            { "name": "accuracy", "description": "Right", "weight": 0.5, "scale": "likert5" },
            { "name": "tone", "description": "Polite", "weight": 0.4, "scale": "likert5" }
        ]
    });
    definition["testCases"][1]["evaluation"] = json!({ "strategy": "regex_match" });
    definition["testCases"][1]["expected"]["patterns"] = json!(["(unclosed"]);
    let r = app
        .post_json(
            &format!("/v1/skills/breakable/versions/{version}/package"),
            &json!({ "definition": definition }),
        )
        .await;
    assert_eq!(r.status().as_u16(), 422);
    let body: Value = r.json().await.unwrap();
    check(
        &doc,
        "post",
        "/v1/skills/{name}/versions/{version}/package",
        422,
        &body,
    );
    assert_eq!(body["error"]["code"], "package_invalid", "{body}");
    let problems = body["error"]["details"]["problems"].as_array().unwrap();
    let at = |prefix: &str| {
        problems.iter().any(|p| {
            p["file"] == "eval/tests.json"
                && p["severity"] == "error"
                && p["pointer"].as_str().unwrap().starts_with(prefix)
        })
    };
    assert!(at("/testCases/0/expected/rubric"), "{body}");
    assert!(at("/testCases/1/expected/patterns/0"), "{body}");
    assert!(body.to_string().contains("sum to 1.0"), "{body}");

    // Not an object: the field and the rule.
    let r = app
        .post_json(
            &format!("/v1/skills/breakable/versions/{version}/package"),
            &json!({ "definition": [1] }),
        )
        .await;
    assert_eq!(r.status().as_u16(), 422);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["details"]["field"], "/definition");
    // Unknown version or skill: 404.
    for path in [
        "/v1/skills/breakable/versions/nope/package",
        "/v1/skills/nobody/versions/1/package",
    ] {
        let r = app
            .post_json(path, &json!({ "definition": definition }))
            .await;
        assert_eq!(r.status().as_u16(), 404, "{path}");
    }
    let (status, _) = app
        .get_json("/v1/skills/breakable/versions/nope/definition")
        .await;
    assert_eq!(status, 404);
    app.cleanup().await;
}

#[tokio::test]
async fn preview_grades_with_the_edited_definition() {
    let app = spawn_app().await;
    let version = stored(&app, "previewed").await;
    let (_, body) = app
        .get_json(&format!(
            "/v1/skills/previewed/versions/{version}/definition"
        ))
        .await;
    let mut definition = body["definition"].clone();
    definition["testCases"][0]["expected"]["output"] = json!("changed");
    let grade = |definition: Option<&Value>| {
        let mut body =
            json!({ "version": version, "test_case_id": "case-000", "output": "changed" });
        if let Some(d) = definition {
            body["definition"] = d.clone();
        }
        body
    };
    // The stored case expects "ok"; the edited one "changed".
    let r = app
        .post_json("/v1/skills/previewed/preview", &grade(None))
        .await;
    let stored_grade: Value = r.json().await.unwrap();
    assert_eq!(stored_grade["status"], "failed", "{stored_grade}");
    let r = app
        .post_json("/v1/skills/previewed/preview", &grade(Some(&definition)))
        .await;
    assert_eq!(r.status().as_u16(), 200);
    let edited: Value = r.json().await.unwrap();
    assert_eq!(edited["status"], "passed", "{edited}");

    // An edited definition that does not validate: its problems, named against eval_config.
    definition["testCases"][0]["evaluation"] = json!({ "strategy": "no_such_strategy" });
    let r = app
        .post_json("/v1/skills/previewed/preview", &grade(Some(&definition)))
        .await;
    assert_eq!(r.status().as_u16(), 422);
    let body: Value = r.json().await.unwrap();
    check(&doc(), "post", "/v1/skills/{name}/preview", 422, &body);
    assert_eq!(body["error"]["code"], "package_invalid", "{body}");
    let problems = body["error"]["details"]["problems"].as_array().unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p["file"] == "eval_config"
                && p["pointer"] == "/testCases/0/evaluation/strategy"),
        "{body}"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn a_schema_is_compiled_or_refused_with_the_rule() {
    let app = spawn_app().await;
    let doc = doc();
    let r = app
        .post_json(
            "/v1/schemas/check",
            &json!({ "schema": { "type": "object", "required": ["total"] } }),
        )
        .await;
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    check(&doc, "post", "/v1/schemas/check", 200, &body);
    assert_eq!(body["valid"], true);
    assert_eq!(body["draft"], "2020-12");

    let r = app
        .post_json(
            "/v1/schemas/check",
            &json!({ "schema": { "$schema": "http://json-schema.org/draft-07/schema#", "type": 5 } }),
        )
        .await;
    let body: Value = r.json().await.unwrap();
    check(&doc, "post", "/v1/schemas/check", 200, &body);
    assert_eq!(body["valid"], false, "{body}");
    let errors = body["errors"].as_array().unwrap();
    assert!(
        errors
            .iter()
            .any(|e| e.as_str().unwrap().contains("draft 7")
                && e.as_str().unwrap().contains("/type")),
        "{body}"
    );

    let r = app.post_json("/v1/schemas/check", &json!({})).await;
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    check(&doc, "post", "/v1/schemas/check", 400, &body);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("schema"),
        "{body}"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn the_editor_page_is_served_for_a_stored_version_only() {
    let app = spawn_app().await;
    let version = stored(&app, "paged").await;
    let r = app
        .get(&format!("/ui/skills/paged/versions/{version}/edit"))
        .await;
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("script-src 'self'"));
    let html = r.text().await.unwrap();
    assert!(html.contains("/ui/static/editor.js"));
    assert!(html.contains("data-strategies=\""));
    assert!(html.contains("llm_judge"));
    let r = app.get("/ui/skills/paged/versions/nope/edit").await;
    assert_eq!(r.status().as_u16(), 404);
    let r = app.get("/ui/static/editor.js").await;
    assert_eq!(r.status().as_u16(), 200);
    // The skill page links each version to its editor.
    let html = app.get("/ui/skills/paged").await.text().await.unwrap();
    assert!(html.contains(&format!("/ui/skills/paged/versions/{version}/edit")));
    app.cleanup().await;
}

/// A package whose `eval/tests.json` names no profile: one case with no strategy, which both
/// `exact_match` (deterministic) and `json_schema` (structured) can grade.
fn open_profile_files() -> Vec<(&'static str, Vec<u8>)> {
    let tests = json!({
        "version": "2.0",
        "settings": { "runner": "given" },
        "testCases": [{
            "id": "tc-1",
            "input": { "prompt": "Give the total" },
            "expected": { "output": "{\"total\": 4}", "jsonSchema": { "type": "object", "required": ["total"] } },
            "given": { "output": "{\"total\": 4}" }
        }]
    });
    vec![
        (
            "open/SKILL.md",
            crate::packages::skill_md("open-profile").into_bytes(),
        ),
        ("open/eval/tests.json", serde_json::to_vec(&tests).unwrap()),
    ]
}

/// `POST /v1/skills/validate{query}` with a folder's files.
async fn validate_folder(
    app: &TestApp,
    files: &[(&'static str, Vec<u8>)],
    query: &str,
) -> reqwest::Response {
    app.client
        .post(format!("{}/v1/skills/validate{query}", app.address))
        .multipart(folder_form(files))
        .send()
        .await
        .unwrap()
}

fn folder_form(files: &[(&'static str, Vec<u8>)]) -> reqwest::multipart::Form {
    files
        .iter()
        .fold(reqwest::multipart::Form::new(), |form, (path, bytes)| {
            form.part(
                "files",
                reqwest::multipart::Part::bytes(bytes.clone()).file_name(*path),
            )
        })
}

#[tokio::test]
async fn a_folder_is_zipped_and_its_open_profile_can_be_chosen() {
    let app = spawn_app().await;
    let doc = doc();
    // A folder, as the upload page sends it: validated like the ZIP of it.
    let r = validate_folder(&app, &open_profile_files(), "").await;
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    check(&doc, "post", "/v1/skills/validate", 200, &body);
    assert_eq!(body["valid"], true, "{body}");
    assert_eq!(body["name"], "open-profile");
    assert_eq!(body["profile"], "deterministic");
    assert_eq!(body["profile_open"], true);

    // The profile chosen: written into the package, so it is no longer open.
    let r = validate_folder(&app, &open_profile_files(), "?profile=structured").await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["valid"], true, "{body}");
    assert_eq!(body["profile"], "structured");
    assert_eq!(body["profile_open"], false);
    let r = app
        .client
        .post(format!(
            "{}/v1/skills?profile=structured&run=false",
            app.address
        ))
        .multipart(folder_form(&open_profile_files()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let version = r.json::<Value>().await.unwrap()["version"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, body) = app
        .get_json(&format!(
            "/v1/skills/open-profile/versions/{version}/definition"
        ))
        .await;
    assert_eq!(body["definition"]["profile"], "structured", "{body}");
    assert_eq!(body["definition"]["testCases"][0]["id"], "tc-1");

    // A package that names its profile leaves nothing to choose: the field and the rule.
    let r = app
        .client
        .post(format!(
            "{}/v1/skills/validate?profile=creative",
            app.address
        ))
        .header("Content-Type", "application/zip")
        .body(given_package("named", &["ok"], json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    check(&doc, "post", "/v1/skills/validate", 400, &body);
    assert_eq!(body["error"]["details"]["field"], "profile");
    // A folder's paths meet the package hardening like a ZIP's entries.
    let mut climbing = open_profile_files();
    climbing.push(("open/../../escape.txt", b"out".to_vec()));
    let r = validate_folder(&app, &climbing, "").await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["valid"], false, "{body}");
    assert_eq!(body["code"], "package_refused", "{body}");
    assert!(body.to_string().contains("zip_slip"), "{body}");
    // A path given twice is the client's mistake, named.
    let mut twice = open_profile_files();
    twice.push(twice[0].clone());
    let r = validate_folder(&app, &twice, "").await;
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    check(&doc, "post", "/v1/skills/validate", 400, &body);
    assert_eq!(body["error"]["details"]["field"], "files", "{body}");
    assert!(body.to_string().contains(twice[0].0), "{body}");
    // An unknown profile names the parameter too.
    let r = validate_folder(&app, &open_profile_files(), "?profile=fancy").await;
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("profile"),
        "{body}"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn another_format_is_edited_as_its_v2_conversion() {
    let app = spawn_app().await;
    let v1 = json!([{ "name": "Slug", "input": "Hello World", "expectedOutput": "hello-world" }]);
    let zip = crate::packages::zip_of(&[
        ("SKILL.md", crate::packages::skill_md("legacy").as_bytes()),
        ("tests.json", &serde_json::to_vec(&v1).unwrap()),
    ]);
    let r = app.upload_zip(zip, "?run=false").await;
    assert_eq!(r.status().as_u16(), 201);
    let version = r.json::<Value>().await.unwrap()["version"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, body) = app
        .get_json(&format!("/v1/skills/legacy/versions/{version}/definition"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["eval_file"], "tests.json");
    assert_eq!(body["converted"], true);
    let case = &body["definition"]["testCases"][0];
    assert_eq!(case["id"], "v1-001");
    assert_eq!(case["expected"]["output"], "hello-world");
    assert_eq!(case["evaluation"]["strategy"], "exact_match");
    let r = app
        .post_json(
            &format!("/v1/skills/legacy/versions/{version}/package"),
            &json!({ "definition": body["definition"] }),
        )
        .await;
    assert_eq!(r.status().as_u16(), 200);
    let zip = r.bytes().await.unwrap().to_vec();
    // The conversion replaces the v1 file.
    assert!(entry(&zip, "tests.json").is_none());
    let tests: Value = serde_json::from_slice(&entry(&zip, "eval/tests.json").unwrap()).unwrap();
    assert_eq!(tests["testCases"][0]["id"], "v1-001");
    app.cleanup().await;
}
