//! What travels over the broker, and its schema version.
//!
//! A job message is `{"schema": 1, "job": <shared::plan::Job>}` (JSON). The version lets a
//! future format be rolled out while old workers still run: a worker that meets a schema it does
//! not know treats the message as unparseable and parks it (it is never dropped). An event is
//! `{"run_id", "test_case_id", "status"}`, published on the events exchange when a worker moved
//! a case out of `queued`.

use serde::{Deserialize, Serialize};
use skilleval::executor::CaseStatus;
use skilleval::plan::Job;
use uuid::Uuid;

/// The job format this build writes and reads.
pub const JOB_SCHEMA_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("not a job message: {0}")]
    Json(#[from] serde_json::Error),
    #[error("job schema version {found} is not supported (this worker reads version {JOB_SCHEMA_VERSION})")]
    Schema { found: u32 },
}

#[derive(Debug, Serialize)]
struct JobOut<'a> {
    schema: u32,
    job: &'a Job,
}

#[derive(Debug, Deserialize)]
struct JobIn {
    schema: u32,
    job: serde_json::Value,
}

/// The body of a job message.
pub fn encode_job(job: &Job) -> Result<Vec<u8>, MessageError> {
    Ok(serde_json::to_vec(&JobOut {
        schema: JOB_SCHEMA_VERSION,
        job,
    })?)
}

/// Parses a job message body.
pub fn decode_job(body: &[u8]) -> Result<Job, MessageError> {
    let envelope: JobIn = serde_json::from_slice(body)?;
    if envelope.schema != JOB_SCHEMA_VERSION {
        return Err(MessageError::Schema {
            found: envelope.schema,
        });
    }
    Ok(serde_json::from_value(envelope.job)?)
}

/// A case left `queued`: what workers announce on the events exchange.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaseFinished {
    pub run_id: Uuid,
    pub test_case_id: String,
    pub status: CaseStatus,
}

impl CaseFinished {
    pub fn encode(&self) -> Result<Vec<u8>, MessageError> {
        Ok(serde_json::to_vec(self)?)
    }

    pub fn decode(body: &[u8]) -> Result<CaseFinished, MessageError> {
        Ok(serde_json::from_slice(body)?)
    }
}

/// A W3C `traceparent` whose trace id is the run id, so every job of one upload shares one
/// trace across the coordinator and the workers (the span id is random per message).
pub fn traceparent_for_run(run_id: Uuid) -> String {
    format!(
        "00-{}-{:016x}-01",
        run_id.simple(),
        rand::random::<u64>() | 1
    )
}

/// The trace id of a `traceparent` header, when it is well formed.
pub fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (_version, trace, span) = (parts.next()?, parts.next()?, parts.next()?);
    (trace.len() == 32 && span.len() == 16 && trace.bytes().all(|b| b.is_ascii_hexdigit()))
        .then_some(trace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use skilleval::model::{Profile, RunnerConfig, TestCase};

    fn job() -> Job {
        Job {
            run_id: Uuid::now_v7(),
            case: TestCase {
                id: "c1".into(),
                name: "one".into(),
                weight: 1.0,
                ..TestCase::default()
            },
            case_index: 3,
            profile: Profile::Deterministic,
            runner: RunnerConfig {
                kind: "given".into(),
                ..RunnerConfig::default()
            },
            timeout_ms: 1_000,
            retry_count: 0,
            package_hash: "abc".into(),
            environment: Default::default(),
            given: None,
            suites: vec![],
            attempt: 2,
        }
    }

    #[test]
    fn job_round_trips_with_its_schema_version() {
        let j = job();
        let body = encode_job(&j).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["schema"], 1);
        assert_eq!(decode_job(&body).unwrap(), j);
    }

    #[test]
    fn unknown_schema_and_garbage_are_errors() {
        assert!(matches!(
            decode_job(br#"{"schema": 9, "job": {}}"#),
            Err(MessageError::Schema { found: 9 })
        ));
        assert!(decode_job(b"not json").is_err());
        assert!(decode_job(br#"{"schema": 1, "job": {"run_id": 5}}"#).is_err());
    }

    #[test]
    fn event_shape() {
        let e = CaseFinished {
            run_id: Uuid::nil(),
            test_case_id: "c".into(),
            status: CaseStatus::Passed,
        };
        let v: serde_json::Value = serde_json::from_slice(&e.encode().unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"run_id": Uuid::nil(), "test_case_id": "c", "status": "passed"})
        );
        assert_eq!(CaseFinished::decode(&e.encode().unwrap()).unwrap(), e);
    }

    #[test]
    fn traceparent_carries_the_run_id() {
        let run = Uuid::now_v7();
        let tp = traceparent_for_run(run);
        assert_eq!(trace_id(&tp), Some(run.simple().to_string().as_str()));
        assert_eq!(trace_id("garbage"), None);
    }
}
