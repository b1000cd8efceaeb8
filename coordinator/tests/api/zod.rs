//! `expected.zodSchema` at upload: converted once by the coordinator (the pinned Zod of
//! `tools/zod` under bubblewrap), stored and published as a plain JSON Schema that a worker's
//! executor (which has no Zod converter) grades exactly like the equivalent hand-written
//! schema; a source that is not a schema is a 422 naming its pointer with Node's message, and a
//! service without its converter answers 503 (its configuration, never the package's fault).

#![allow(clippy::needless_pass_by_value)]

use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_configured, AppOptions};
use crate::packages::{skill_md, zip_of};
use skilleval_execution::executor::ExecutorBuilder;
use skilleval_execution::result::CaseStatus;

const ZOD: &str = "z.object({ name: z.string().min(1), age: z.number().int().nonnegative() })";

fn schema_case(id: &str, expected: Value, output: &str) -> Value {
    json!({
        "id": id,
        "expected": expected,
        "evaluation": {"strategy": "json_schema"},
        "given": {"output": output}
    })
}

fn package(name: &str, cases: Vec<Value>) -> Vec<u8> {
    let tests = json!({
        "version": "2.0",
        "profile": "structured",
        "settings": {"runner": "given"},
        "testCases": cases
    });
    zip_of(&[
        ("SKILL.md", skill_md(name).as_bytes()),
        ("eval/tests.json", &serde_json::to_vec(&tests).unwrap()),
    ])
}

#[tokio::test]
async fn a_zod_schema_is_converted_at_upload_and_graded_like_its_json_schema() {
    let app = spawn_app().await;
    let written = json!({"jsonSchema": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "age": {"type": "integer", "minimum": 0}
        },
        "required": ["name", "age"]
    }});
    let outputs = [
        r#"{"name": "Ada", "age": 36}"#,
        r#"{"name": "", "age": -1}"#,
        r#"{"age": 1.5}"#,
    ];
    let mut cases = Vec::new();
    for (i, output) in outputs.iter().enumerate() {
        cases.push(schema_case(
            &format!("zod-{i}"),
            json!({"zodSchema": ZOD}),
            output,
        ));
        cases.push(schema_case(&format!("json-{i}"), written.clone(), output));
    }
    let response = app.upload_zip(package("zod-skill", cases), "").await;
    assert_eq!(
        response.status().as_u16(),
        201,
        "{}",
        response.text().await.unwrap()
    );

    assert_eq!(app.wait_for_jobs(6).await, 6);
    let jobs = app.drain_jobs().await;
    // What workers get: the converted schema, the source kept beside it, no Zod to run.
    for job in jobs.iter().filter(|j| j.case.id.starts_with("zod-")) {
        let expected = &job.case.expected;
        assert_eq!(expected.zod_schema, None);
        assert_eq!(expected.extra["zodSource"], ZOD);
        let schema = expected.json_schema.as_ref().unwrap();
        assert_eq!(schema["properties"]["age"]["type"], "integer");
        assert_eq!(schema["required"], json!(["name", "age"]));
    }
    // A worker's executor (built without a Zod converter) grades both alike.
    let executor = ExecutorBuilder::new().build();
    let root = tempfile::tempdir().unwrap();
    let mut grades = std::collections::BTreeMap::new();
    for job in &jobs {
        let result = executor.execute(job, root.path()).await;
        assert_ne!(result.status, CaseStatus::Errored, "{:?}", result.error);
        let errors = result.schema_errors.clone().unwrap_or_default().len();
        grades.insert(job.case.id.clone(), (result.status, result.score, errors));
    }
    for i in 0..outputs.len() {
        assert_eq!(
            grades[&format!("zod-{i}")],
            grades[&format!("json-{i}")],
            "output {i}: {}",
            outputs[i]
        );
    }
    assert_eq!(grades["zod-0"].0, CaseStatus::Passed);
    assert_eq!(grades["zod-1"].2, 2, "minLength and minimum");
    assert_eq!(grades["zod-2"].2, 2, "name missing, age not an integer");
    app.cleanup().await;
}

#[tokio::test]
async fn a_source_that_is_not_a_schema_is_a_422_at_its_pointer_with_nodes_message() {
    let app = spawn_app().await;
    let cases = vec![
        schema_case("fine", json!({"zodSchema": ZOD}), "{}"),
        schema_case(
            "typo",
            json!({"zodSchema": "z.object({ name: z.strng() })"}),
            "{}",
        ),
    ];
    let response = app.upload_zip(package("bad-zod", cases), "").await;
    assert_eq!(response.status().as_u16(), 422);
    let body: Value = response.json().await.unwrap();
    let problems: Vec<&Value> = body["error"]["details"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["severity"] == "error")
        .collect();
    assert_eq!(problems.len(), 1, "{body}");
    assert_eq!(problems[0]["pointer"], "/testCases/1/expected/zodSchema");
    assert!(
        problems[0]["message"]
            .as_str()
            .unwrap()
            .contains("z.strng is not a function"),
        "{body}"
    );
    assert_eq!(app.count("skill_versions").await, 0);
    app.cleanup().await;
}

#[tokio::test]
async fn a_service_without_its_zod_converter_answers_503_naming_it_and_stores_nothing() {
    // A converter folder where `npm ci` never ran: the service's configuration, not the package.
    let empty = tempfile::tempdir().unwrap();
    let dir = empty.path().to_path_buf();
    let app = spawn_app_configured(AppOptions::default(), move |settings| {
        settings.coordinator.zod_dir = dir;
    })
    .await;
    let cases = vec![schema_case("fine", json!({"zodSchema": ZOD}), "{}")];
    let response = app.upload_zip(package("no-converter", cases), "").await;
    assert_eq!(response.status().as_u16(), 503);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("configuration"), "{body}");
    assert!(
        message.contains("the Zod converter is not installed"),
        "{body}"
    );
    let problems = body["error"]["details"]["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{body}");
    assert_eq!(problems[0]["severity"], "host");
    assert_eq!(problems[0]["pointer"], "/testCases/0/expected/zodSchema");
    assert_eq!(app.count("skill_versions").await, 0);
    app.cleanup().await;
}
