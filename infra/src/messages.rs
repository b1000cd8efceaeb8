//! What travels over the broker, and its schema version.
//!
//! A job message is `{"schema": 1, "job": <shared::plan::Job>}` (JSON). The version lets a
//! future format be rolled out while old workers still run: a worker that meets a schema it does
//! not know treats the message as unparseable and parks it (it is never dropped). An event is
//! `{"run_id", "cases": [{"test_case_id", "status"}, ...]}`: the cases of one run a worker moved
//! out of `queued` in one committed batch (one message per run per batch, not per case, so the
//! coordinator's work per event is shared by up to a batch of cases). The single-case shape of
//! earlier builds, `{"run_id", "test_case_id", "status"}`, is still read.

use serde::{Deserialize, Serialize};
use skilleval_execution::plan::Job;
use skilleval_execution::result::CaseStatus;
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
struct JobIn<'a> {
    schema: u32,
    /// Kept as text until the schema version is known to be ours (then parsed once, straight
    /// into [`Job`]: no intermediate `Value` per delivery).
    #[serde(borrow)]
    job: &'a serde_json::value::RawValue,
}

/// The body of a job message.
pub fn encode_job(job: &Job) -> Result<Vec<u8>, MessageError> {
    Ok(serde_json::to_vec(&JobOut {
        schema: JOB_SCHEMA_VERSION,
        job,
    })?)
}

/// A job message ready to publish: its body and what its headers need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedJob {
    pub run_id: Uuid,
    pub test_case_id: String,
    /// The job's attempt (1 for a first publish).
    pub attempt: u32,
    pub body: Vec<u8>,
}

impl EncodedJob {
    pub fn from_job(job: &Job) -> Result<EncodedJob, MessageError> {
        Ok(EncodedJob {
            run_id: job.run_id,
            test_case_id: job.case.id.clone(),
            attempt: job.attempt,
            body: encode_job(job)?,
        })
    }

    /// The message's AMQP `message-id`: `<run id>/<test case id>/<attempt>` (a redelivery
    /// or a second publish of the same attempt has the same id).
    pub fn message_id(&self) -> String {
        format!("{}/{}/{}", self.run_id, self.test_case_id, self.attempt)
    }

    /// The message of a job stored as JSON text (a run's row): wrapped in the envelope as it
    /// is, without parsing and re-serialising it. `job_json` must be a JSON object (the
    /// database's `jsonb` output is); a worker that cannot read it parks the message.
    pub fn from_stored(
        run_id: Uuid,
        test_case_id: String,
        attempt: u32,
        job_json: &str,
    ) -> EncodedJob {
        let mut body = Vec::with_capacity(job_json.len() + 24);
        body.extend_from_slice(b"{\"schema\":");
        body.extend_from_slice(JOB_SCHEMA_VERSION.to_string().as_bytes());
        body.extend_from_slice(b",\"job\":");
        body.extend_from_slice(job_json.as_bytes());
        body.push(b'}');
        EncodedJob {
            run_id,
            test_case_id,
            attempt,
            body,
        }
    }
}

/// Parses a job message body.
pub fn decode_job(body: &[u8]) -> Result<Job, MessageError> {
    let envelope: JobIn = serde_json::from_slice(body)?;
    if envelope.schema != JOB_SCHEMA_VERSION {
        return Err(MessageError::Schema {
            found: envelope.schema,
        });
    }
    Ok(serde_json::from_str(envelope.job.get())?)
}

/// A case left `queued`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaseFinished {
    pub run_id: Uuid,
    pub test_case_id: String,
    pub status: CaseStatus,
}

/// One case of a [`CasesFinished`] event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishedCase {
    pub test_case_id: String,
    pub status: CaseStatus,
}

/// What workers announce on the events exchange: cases of one run that left `queued`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CasesFinished {
    pub run_id: Uuid,
    pub cases: Vec<FinishedCase>,
}

/// Either shape on the wire (the single-case one comes from earlier builds).
#[derive(Deserialize)]
#[serde(untagged)]
enum EventIn {
    Batch(CasesFinished),
    Single(CaseFinished),
}

impl CasesFinished {
    /// Groups cases by run, keeping the order of first appearance: one event per run.
    pub fn group(cases: impl IntoIterator<Item = CaseFinished>) -> Vec<CasesFinished> {
        let mut events: Vec<CasesFinished> = Vec::new();
        for c in cases {
            let case = FinishedCase {
                test_case_id: c.test_case_id,
                status: c.status,
            };
            match events.iter_mut().find(|e| e.run_id == c.run_id) {
                Some(e) => e.cases.push(case),
                None => events.push(CasesFinished {
                    run_id: c.run_id,
                    cases: vec![case],
                }),
            }
        }
        events
    }

    /// The most serious status among the cases (errored, failed, skipped, passed): the
    /// event's routing key, so a binding on `case.failed` sees every batch with a failure.
    pub fn worst_status(&self) -> CaseStatus {
        let rank = |s: CaseStatus| match s {
            CaseStatus::Errored => 4,
            CaseStatus::Failed => 3,
            CaseStatus::Skipped => 2,
            CaseStatus::Passed => 1,
            CaseStatus::Queued => 0,
        };
        self.cases
            .iter()
            .map(|c| c.status)
            .max_by_key(|s| rank(*s))
            .unwrap_or(CaseStatus::Passed)
    }

    /// The first case that failed or errored, if any (what failFast reports).
    pub fn first_failure(&self) -> Option<&FinishedCase> {
        self.cases
            .iter()
            .find(|c| matches!(c.status, CaseStatus::Failed | CaseStatus::Errored))
    }

    pub fn encode(&self) -> Result<Vec<u8>, MessageError> {
        Ok(serde_json::to_vec(self)?)
    }

    /// Reads either shape; a single-case event becomes a batch of one.
    pub fn decode(body: &[u8]) -> Result<CasesFinished, MessageError> {
        Ok(match serde_json::from_slice(body)? {
            EventIn::Batch(b) => b,
            EventIn::Single(c) => c.into(),
        })
    }
}

impl From<CaseFinished> for CasesFinished {
    fn from(c: CaseFinished) -> Self {
        CasesFinished {
            run_id: c.run_id,
            cases: vec![FinishedCase {
                test_case_id: c.test_case_id,
                status: c.status,
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skilleval_model::definition::{Profile, RunnerConfig, TestCase};

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
            scripts: Default::default(),
            dependencies: Vec::new(),
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
    fn a_stored_job_is_wrapped_as_it_is_and_reads_back() {
        let j = job();
        let stored = serde_json::to_string(&serde_json::to_value(&j).unwrap()).unwrap();
        let e = EncodedJob::from_stored(j.run_id, j.case.id.clone(), j.attempt, &stored);
        assert_eq!(decode_job(&e.body).unwrap(), j);
        assert_eq!((e.run_id, e.test_case_id.as_str()), (j.run_id, "c1"));
        let v: serde_json::Value = serde_json::from_slice(&e.body).unwrap();
        assert_eq!(v["schema"], JOB_SCHEMA_VERSION);
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

    fn case(run_id: Uuid, id: &str, status: CaseStatus) -> CaseFinished {
        CaseFinished {
            run_id,
            test_case_id: id.into(),
            status,
        }
    }

    #[test]
    fn events_group_cases_by_run_in_first_seen_order() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let events = CasesFinished::group([
            case(a, "a1", CaseStatus::Passed),
            case(b, "b1", CaseStatus::Failed),
            case(a, "a2", CaseStatus::Errored),
        ]);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].run_id, a);
        let ids: Vec<&str> = events[0]
            .cases
            .iter()
            .map(|c| c.test_case_id.as_str())
            .collect();
        assert_eq!(ids, ["a1", "a2"]);
        assert_eq!(events[0].worst_status(), CaseStatus::Errored);
        assert_eq!(events[0].first_failure().unwrap().test_case_id, "a2");
        assert_eq!(events[1].worst_status(), CaseStatus::Failed);
        let passing = CasesFinished::group([case(a, "x", CaseStatus::Passed)]);
        assert_eq!(passing[0].worst_status(), CaseStatus::Passed);
        assert!(passing[0].first_failure().is_none());
    }

    #[test]
    fn event_shape_and_the_single_case_shape_of_earlier_builds() {
        let e = CasesFinished {
            run_id: Uuid::nil(),
            cases: vec![FinishedCase {
                test_case_id: "c".into(),
                status: CaseStatus::Passed,
            }],
        };
        let v: serde_json::Value = serde_json::from_slice(&e.encode().unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"run_id": Uuid::nil(), "cases": [{"test_case_id": "c", "status": "passed"}]})
        );
        assert_eq!(CasesFinished::decode(&e.encode().unwrap()).unwrap(), e);
        let old =
            serde_json::json!({"run_id": Uuid::nil(), "test_case_id": "c", "status": "passed"});
        assert_eq!(
            CasesFinished::decode(old.to_string().as_bytes()).unwrap(),
            e
        );
        assert!(CasesFinished::decode(br#"{"run_id": 1}"#).is_err());
    }
}
