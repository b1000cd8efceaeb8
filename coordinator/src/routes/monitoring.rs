//! Production monitoring over HTTP: a skill's monitor (`PUT`/`GET /v1/skills/{name}/monitor`),
//! sample ingest (`POST /v1/skills/{name}/samples`), quality over time
//! (`GET /v1/skills/{name}/quality`, JSON, Markdown or HTML) and alert transitions
//! (`GET /v1/skills/{name}/alerts`).
//!
//! **Ingest.** One batch is one transaction under the skill's ingest lock: duplicates (ids the
//! skill has, or repeated in the batch) are counted and never stored twice; each new item's
//! disposition is decided (filters, the deterministic hash of (monitor id, sample id), the
//! hourly cap, the daily cost cap); the sampled items become the plan of one `samples` run,
//! inserted with them and published on the samples lane after the commit by the same
//! pipeline as any run. Why one run per batch: the run and its samples commit together (a
//! crash leaves both or neither), a run's plan never grows after creation (the lifecycle's
//! watermark and write-off assume a fixed plan), and concurrent batches never contend on a
//! shared run row. A batch is at most `max_batch_samples` items, so the cost is one `runs`
//! row per thousand samples.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Duration, Utc};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use skilleval_analysis::quality::CriterionGrade;
use skilleval_analysis::quality::{render, BucketSize, GradedSample, QualityQuery, SampleStatus};
use skilleval_execution::monitor::{
    is_sampled, parse, parse_batch, BatchError, BatchLimits, CriteriaSelection, Monitor,
    MonitorSource, Sample, SampleError,
};
use skilleval_infra::store::samples::{
    AlertRow, Disposition, NewRevision, NewSamples, RevisionSource, SampleResultRow, StoredMonitor,
};
use skilleval_model::problem::Problem;
use uuid::Uuid;

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery};
use crate::routes::fields::check_callback_url;
use crate::runs::samples::SamplesRun;
use crate::state::AppState;

/// The configuration keys named in 413 responses.
pub const BATCH_BYTES_KEY: &str = "coordinator.sampling.max_batch_bytes";
pub const BATCH_SAMPLES_KEY: &str = "coordinator.sampling.max_batch_samples";

/// A monitor as the API shows it.
#[derive(Debug, Serialize)]
pub struct MonitorView {
    pub skill: String,
    pub monitor_id: Uuid,
    /// The current revision (1 for the first); results record the one they were graded with.
    pub revision: i32,
    pub source: RevisionSource,
    /// The document as it was given.
    pub document: Value,
    /// The validated monitor, defaults applied.
    pub monitor: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    pub updated_at: DateTime<Utc>,
    /// `PUT` only: whether this request made a new revision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed: Option<bool>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Problem>,
}

impl MonitorView {
    fn of(skill: &str, m: StoredMonitor) -> Self {
        MonitorView {
            skill: skill.to_string(),
            monitor_id: m.id,
            revision: m.revision,
            source: m.source,
            document: m.document,
            monitor: m.monitor,
            callback_url: m.callback_url,
            updated_at: m.updated_at,
            changed: None,
            warnings: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorQuery {
    /// Where alert transitions are posted (signed like run webhooks).
    #[serde(default)]
    pub callback_url: Option<String>,
}

pub(crate) async fn skill_id(state: &AppState, name: &str) -> Result<Uuid, ApiError> {
    state
        .store
        .skill_id(name)
        .await?
        .ok_or_else(|| ApiError::not_found("skill", name))
}

async fn current_monitor(
    state: &AppState,
    name: &str,
    skill_id: Uuid,
) -> Result<StoredMonitor, ApiError> {
    state.store.current_monitor(skill_id).await?.ok_or_else(|| {
        ApiError::conflict(
            "no_monitor",
            format!(
                "skill `{name}` has no monitor: set one with PUT /v1/skills/{name}/monitor, \
                 or upload a package whose eval definition has a `monitoring` section"
            ),
        )
        .with_details(json!({ "field": "monitor", "rule": "samples are graded by the skill's monitor, which must exist" }))
    })
}

/// `GET /v1/skills/{name}/monitor`.
pub async fn get_monitor(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<MonitorView>, ApiError> {
    let skill_id = skill_id(&state, &name).await?;
    let monitor = state
        .store
        .current_monitor(skill_id)
        .await?
        .ok_or_else(|| ApiError::not_found("monitor of skill", &name))?;
    Ok(Json(MonitorView::of(&name, monitor)))
}

/// `PUT /v1/skills/{name}/monitor`: validates the document (every problem with its JSON
/// pointer, 422) and stores it as a new revision when it differs from the current one.
#[tracing::instrument(skip_all, fields(skill = %name))]
pub async fn put_monitor(
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<MonitorQuery>,
    ApiJson(document): ApiJson<Value>,
) -> Result<Json<MonitorView>, ApiError> {
    if let Some(url) = &query.callback_url {
        check_callback_url("callback_url", url)?;
    }
    let skill_id = skill_id(&state, &name).await?;
    let (monitor, warnings) = validate_monitor(&state, skill_id, document.clone()).await?;
    let monitor_json =
        serde_json::to_value(&monitor).map_err(|e| ApiError::internal(anyhow::Error::from(e)))?;
    let mut tx = state.store.pool().begin().await?;
    let put = state
        .store
        .put_monitor(
            &mut tx,
            &NewRevision {
                skill_id,
                document: &document,
                monitor: &monitor_json,
                source: RevisionSource::Api,
                callback_url: query.callback_url.as_deref(),
            },
        )
        .await?;
    tx.commit().await?;
    let stored = state
        .store
        .current_monitor(skill_id)
        .await?
        .ok_or_else(|| ApiError::internal(anyhow::anyhow!("the monitor just stored is gone")))?;
    let mut view = MonitorView::of(&name, stored);
    view.changed = Some(put.changed);
    view.warnings = warnings;
    Ok(Json(view))
}

/// Validates a monitor document against the skill's newest package (custom graders are
/// looked up in it), on the blocking pool.
async fn validate_monitor(
    state: &AppState,
    skill_id: Uuid,
    document: Value,
) -> Result<(Monitor, Vec<Problem>), ApiError> {
    let mut conn = state.store.pool().acquire().await?;
    let package_hash = state
        .store
        .latest_version(&mut conn, skill_id)
        .await?
        .map(|(_, hash)| hash);
    drop(conn);
    let zip = match package_hash {
        Some(hash) => state.store.package_bytes(&hash).await?,
        None => None,
    };
    let limits = state.limits.clone();
    let strategies = state.strategies.clone();
    let parsed = tokio::task::spawn_blocking(move || {
        let package = zip.and_then(|zip| {
            skilleval_model::package::Package::from_zip_bytes(&zip, &limits, None).ok()
        });
        // Every skill has a version (skills are created by uploads); without a package, a
        // custom grader's file is simply not found.
        let root = package
            .as_ref()
            .map(|p| p.root().to_path_buf())
            .unwrap_or_default();
        let source = MonitorSource {
            file: "monitor",
            pointer: "",
            package_root: &root,
        };
        parse(&document, &source, &strategies)
    })
    .await
    .map_err(|e| ApiError::internal(anyhow::anyhow!("monitor validation task failed: {e}")))?;
    parsed.map_err(|problems| {
        let first = problems.iter().find(|p| p.is_error());
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "monitor_invalid",
            format!(
                "the monitor is invalid: {}",
                first.map_or_else(String::new, |p| format!("{}: {}", p.pointer, p.message))
            ),
        )
        .with_details(json!({
            "field": first.map(|p| p.pointer.clone()).unwrap_or_default(),
            "rule": first.map(|p| p.message.clone()).unwrap_or_default(),
            "problems": problems,
        }))
    })
}

/// What an ingest answers.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct IngestResponse {
    /// New samples stored (every disposition), duplicates and errors excluded.
    pub accepted: u64,
    /// Of those, taken for grading (jobs of `run_id`).
    pub sampled: u64,
    /// Sample ids the skill had already (or repeated in this batch): not stored again.
    pub duplicates: u64,
    /// Not taken: the hash fell outside `sample_rate`.
    pub dropped_unsampled: u64,
    /// Not taken: the metadata did not pass the monitor's filters.
    pub dropped_filtered: u64,
    /// Would have been taken, but `max_samples_per_hour` was reached this hour.
    pub dropped_over_hourly_cap: u64,
    /// Would have been taken, but `max_cost_usd_per_day` is spent and every criterion
    /// needs a model.
    pub dropped_over_daily_cost: u64,
    /// Criteria left out of this batch's jobs because `max_cost_usd_per_day` is spent
    /// (empty: every criterion grades).
    pub skipped_criteria: Vec<String>,
    pub errors: Vec<SampleError>,
    /// The samples run grading this batch (none when nothing was sampled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<Uuid>,
    pub monitor_revision: i32,
}

/// `POST /v1/skills/{name}/samples`.
#[tracing::instrument(skip_all, fields(skill = %name))]
pub async fn ingest(
    State(state): State<AppState>,
    Path(name): Path<String>,
    request: Request,
) -> Result<Json<IngestResponse>, ApiError> {
    let skill_id = skill_id(&state, &name).await?;
    let stored = current_monitor(&state, &name, skill_id).await?;
    let limits = BatchLimits {
        max_samples: state.sampling.max_batch_samples,
        max_bytes: state.sampling.max_batch_bytes,
    };
    let headers = request.headers().clone();
    let bytes = read_limited(request.into_body(), &headers, limits.max_bytes).await?;
    let items = batch_items(&bytes)?;
    limits
        .check_count(items.len())
        .map_err(|e| batch_error(&e))?;
    let parsed = parse_batch(&items);
    drop(items);
    let samples = parsed.samples.into_iter().map(|(_, s)| s).collect();
    Ok(Json(
        ingest_samples(&state, skill_id, &stored, samples, parsed.errors).await?,
    ))
}

/// One batch of checked samples of a skill through its monitor: duplicates, dispositions, the
/// batch's samples run (what `POST /v1/skills/{name}/samples` and trace ingest share, so a
/// sample is sampled, capped, graded and alerted on the same way whichever way it came).
pub(crate) async fn ingest_samples(
    state: &AppState,
    skill_id: Uuid,
    stored: &StoredMonitor,
    samples: Vec<Sample>,
    errors: Vec<SampleError>,
) -> Result<IngestResponse, ApiError> {
    let monitor: Monitor = serde_json::from_value(stored.monitor.clone())
        .map_err(|e| ApiError::internal(anyhow::anyhow!("stored monitor does not parse: {e}")))?;
    let monitor = Arc::new(monitor);
    let identity = stored.id.to_string();
    let revision = u32::try_from(stored.revision).unwrap_or(0);

    let mut out = IngestResponse {
        accepted: 0,
        sampled: 0,
        duplicates: 0,
        dropped_unsampled: 0,
        dropped_filtered: 0,
        dropped_over_hourly_cap: 0,
        dropped_over_daily_cost: 0,
        skipped_criteria: Vec::new(),
        errors,
        run_id: None,
        monitor_revision: stored.revision,
    };
    // Repeated within the batch: the first occurrence counts.
    let mut seen = HashSet::new();
    let mut fresh = Vec::with_capacity(samples.len());
    for sample in samples {
        if seen.insert(sample.sample_id.clone()) {
            fresh.push(sample);
        } else {
            out.duplicates += 1;
        }
    }

    let mut tx = state.store.pool().begin().await?;
    state.store.lock_ingest(&mut tx, skill_id).await?;
    let ids: Vec<&str> = fresh.iter().map(|s| s.sample_id.as_str()).collect();
    let existing: HashSet<String> = state
        .store
        .existing_samples(&mut tx, skill_id, &ids)
        .await?
        .into_iter()
        .collect();
    drop(ids);
    let taken_this_hour = state.store.sampled_this_hour(&mut tx, skill_id).await?;
    let mut hour_room = monitor
        .max_samples_per_hour
        .map(|cap| cap.saturating_sub(u64::try_from(taken_this_hour).unwrap_or(0)));
    let selection = match monitor.max_cost_usd_per_day {
        Some(cap) if state.store.samples_cost_today(&mut tx, skill_id).await? >= cap => {
            CriteriaSelection::WithoutModel
        }
        _ => CriteriaSelection::All,
    };
    if selection == CriteriaSelection::WithoutModel {
        out.skipped_criteria = monitor
            .criteria
            .iter()
            .filter(|c| c.needs_model())
            .map(|c| c.name.clone())
            .collect();
    }
    let gradable = monitor
        .criteria
        .iter()
        .any(|c| selection == CriteriaSelection::All || !c.needs_model());
    let now = Utc::now();
    let mut rows = NewSamples::default();
    let mut position = 0i32;
    for sample in fresh {
        if existing.contains(&sample.sample_id) {
            out.duplicates += 1;
            continue;
        }
        let disposition = if !monitor.accepts_metadata(sample.metadata.as_ref()) {
            Disposition::Filtered
        } else if !is_sampled(&identity, &sample.sample_id, monitor.sample_rate) {
            Disposition::Unsampled
        } else if hour_room == Some(0) {
            Disposition::OverHourlyCap
        } else if !gradable {
            Disposition::OverDailyCost
        } else {
            Disposition::Sampled
        };
        out.accepted += 1;
        match disposition {
            Disposition::Sampled => out.sampled += 1,
            Disposition::Unsampled => out.dropped_unsampled += 1,
            Disposition::Filtered => out.dropped_filtered += 1,
            Disposition::OverHourlyCap => out.dropped_over_hourly_cap += 1,
            Disposition::OverDailyCost => out.dropped_over_daily_cost += 1,
        }
        let sampled = disposition == Disposition::Sampled;
        if sampled {
            if let Some(room) = hour_room.as_mut() {
                *room -= 1;
            }
        }
        rows.sample_ids.push(sample.sample_id.clone());
        rows.dispositions.push(disposition.as_str());
        rows.positions.push(sampled.then_some(position));
        rows.versions.push(sample.version.clone());
        rows.observed_at.push(sample.observed_at.unwrap_or(now));
        rows.bodies.push(if sampled {
            Some(
                serde_json::to_string(&sample)
                    .map_err(|e| ApiError::internal(anyhow::Error::from(e)))?,
            )
        } else {
            None
        });
        if sampled {
            position += 1;
        }
    }

    let mut started = None;
    if out.sampled > 0 {
        let (version_id, package_hash) = state
            .store
            .latest_version(&mut tx, skill_id)
            .await?
            .ok_or_else(|| ApiError::internal(anyhow::anyhow!("skill has no version")))?;
        let prepared = state.planner.prepare_samples(SamplesRun {
            skill_id,
            version_id,
            package_hash,
            monitor: Arc::clone(&monitor),
            monitor_revision: revision,
            selection,
            total: usize::try_from(out.sampled).unwrap_or(usize::MAX),
        });
        let inserted = state.planner.insert(&mut tx, &prepared).await?;
        out.run_id = Some(prepared.run_id);
        state
            .store
            .insert_samples(
                &mut tx,
                skill_id,
                Some(prepared.run_id),
                stored.revision,
                &rows,
            )
            .await?;
        started = Some((prepared, inserted));
    } else if !rows.is_empty() {
        state
            .store
            .insert_samples(&mut tx, skill_id, None, stored.revision, &rows)
            .await?;
    }
    tx.commit().await?;
    if let Some((prepared, inserted)) = started {
        // Published in the background on the samples lane: the batch is answered now.
        drop(state.publisher.start(prepared, inserted));
    }
    Ok(out)
}

/// The batch's items: a JSON array, or `{"samples": [...]}`.
fn batch_items(bytes: &[u8]) -> Result<Vec<Value>, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::invalid_field("invalid_body", "", format!("the body is not JSON: {e}"))
    })?;
    match value {
        Value::Array(items) => Ok(items),
        Value::Object(mut obj) => match obj.remove("samples") {
            Some(Value::Array(items)) => Ok(items),
            _ => Err(ApiError::invalid_field(
                "invalid_body",
                "/samples",
                "must be a list of samples",
            )),
        },
        _ => Err(ApiError::invalid_field(
            "invalid_body",
            "",
            "the body must be a list of samples or {\"samples\": [...]}",
        )),
    }
}

pub(crate) fn batch_error(e: &BatchError) -> ApiError {
    let (key, limit) = match *e {
        BatchError::TooLarge { limit, .. } => (BATCH_BYTES_KEY, limit),
        BatchError::TooMany { limit, .. } => (BATCH_SAMPLES_KEY, limit),
    };
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "batch_too_large",
        e.to_string(),
    )
    .with_details(json!({ "field": "", "rule": e.to_string(), "limit": key, "limit_value": limit }))
}

/// Reads the body, refusing (413, naming the limit) as soon as it is over `limit` bytes.
pub(crate) async fn read_limited(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let too_large = || {
        batch_error(&BatchError::TooLarge {
            bytes: limit + 1,
            limit,
        })
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::invalid_field("invalid_body", "", format!("reading the body failed: {e}"))
        })?;
        if buf.len() + chunk.len() > limit {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

/// `GET /v1/skills/{name}/quality` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityParams {
    #[serde(default)]
    pub from: Option<DateTime<Utc>>,
    #[serde(default)]
    pub to: Option<DateTime<Utc>>,
    #[serde(default)]
    pub bucket: Option<BucketSize>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub criterion: Option<String>,
    /// `json`, `markdown` or `html` (default: from `Accept`, else JSON).
    #[serde(default)]
    pub format: Option<ReportFormat>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportFormat {
    Json,
    Markdown,
    Html,
}

/// The default range when `from` is not given: 30 days of day buckets, 48 h of hour buckets.
fn default_span(bucket: BucketSize) -> Duration {
    match bucket {
        BucketSize::Hour => Duration::hours(48),
        BucketSize::Day => Duration::days(30),
    }
}

/// `GET /v1/skills/{name}/quality`.
pub async fn quality(
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiQuery(params): ApiQuery<QualityParams>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let skill_id = skill_id(&state, &name).await?;
    let bucket = params.bucket.unwrap_or_default();
    let to = params
        .to
        .unwrap_or_else(|| bucket.floor(Utc::now()) + bucket.duration());
    let from = params.from.unwrap_or(to - default_span(bucket));
    if from >= to {
        return Err(ApiError::invalid_field(
            "invalid_query",
            "from",
            "must be before `to`",
        ));
    }
    let rows = state
        .store
        .sample_results(skill_id, from, to, params.version.as_deref())
        .await?;
    let monitors = revision_monitors(&state, skill_id).await?;
    if let Some(criterion) = &params.criterion {
        let mut known: Vec<&str> = monitors
            .values()
            .flat_map(|m| m.criteria.iter().map(|c| c.name.as_str()))
            .collect();
        known.sort_unstable();
        known.dedup();
        if !known.contains(&criterion.as_str()) {
            return Err(ApiError::invalid_field(
                "invalid_query",
                "criterion",
                format!(
                    "`{criterion}` is no criterion of the skill's monitor (any revision); known: {}",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ),
            ));
        }
    }
    let samples: Vec<GradedSample> = rows.iter().map(|r| graded_of(r, &monitors)).collect();
    let query = QualityQuery {
        from: Some(from),
        to: Some(to),
        bucket,
        version: params.version.clone(),
        criterion: params.criterion.clone(),
    };
    let report = skilleval_analysis::quality::quality(&name, &samples, &query).map_err(|e| {
        let field = match e {
            skilleval_analysis::quality::QualityError::EmptyRange => "from",
            skilleval_analysis::quality::QualityError::TooManyBuckets(_) => "bucket",
        };
        ApiError::invalid_field("invalid_query", field, e.to_string())
    })?;
    let format = params.format.unwrap_or_else(|| from_accept(&headers));
    Ok(match format {
        ReportFormat::Json => Json(report).into_response(),
        ReportFormat::Markdown => (
            [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
            render::markdown(&report),
        )
            .into_response(),
        ReportFormat::Html => (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            render::html(&report),
        )
            .into_response(),
    })
}

fn from_accept(headers: &HeaderMap) -> ReportFormat {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if accept.contains("text/html") {
        ReportFormat::Html
    } else if accept.contains("text/markdown") {
        ReportFormat::Markdown
    } else {
        ReportFormat::Json
    }
}

/// Every revision of the skill's monitor, parsed (to name a result's criteria).
pub(crate) async fn revision_monitors(
    state: &AppState,
    skill_id: Uuid,
) -> Result<HashMap<i32, Monitor>, ApiError> {
    let Some(current) = state.store.current_monitor(skill_id).await? else {
        return Ok(HashMap::new());
    };
    Ok(state
        .store
        .monitor_revisions(current.id)
        .await?
        .into_iter()
        .filter_map(|(rev, m)| serde_json::from_value(m).ok().map(|m| (rev, m)))
        .collect())
}

/// A stored result as the quality report reads it: the criteria are the hybrid's
/// components, named by the revision the sample was graded with.
pub(crate) fn graded_of(row: &SampleResultRow, monitors: &HashMap<i32, Monitor>) -> GradedSample {
    let status = match row.status.as_str() {
        "passed" => SampleStatus::Passed,
        "failed" => SampleStatus::Failed,
        _ => SampleStatus::Errored,
    };
    let mut criteria = BTreeMap::new();
    if status != SampleStatus::Errored {
        if let (Some(monitor), Some(Value::Array(components))) = (
            monitors.get(&row.monitor_revision),
            row.details.as_ref().and_then(|d| d.get("components")),
        ) {
            for c in components {
                let name = c
                    .get("strategy")
                    .and_then(Value::as_str)
                    .and_then(|s| monitor.criterion_of_strategy(s))
                    .map(|c| c.name.clone());
                let score = c.get("score").and_then(Value::as_f64);
                let passed = c.get("passed").and_then(Value::as_bool);
                if let (Some(name), Some(score), Some(passed)) = (name, score, passed) {
                    criteria.insert(name, CriterionGrade { score, passed });
                }
            }
        }
    }
    GradedSample {
        sample_id: row.sample_id.clone(),
        observed_at: row.observed_at,
        version: row.version.clone(),
        monitor_revision: u32::try_from(row.monitor_revision).unwrap_or(0),
        status,
        score: row.score.filter(|_| status != SampleStatus::Errored),
        criteria,
    }
}

/// `GET /v1/skills/{name}/alerts`: each rule's state and the transitions, newest first.
#[derive(Debug, Serialize)]
pub struct AlertList {
    pub skill: String,
    pub rules: Vec<RuleState>,
    pub alerts: Vec<AlertRow>,
}

#[derive(Debug, Serialize)]
pub struct RuleState {
    pub rule: String,
    pub state: String,
    pub evaluated_at: DateTime<Utc>,
}

/// `GET /v1/skills/{name}/alerts`.
pub async fn alerts(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<AlertList>, ApiError> {
    let skill_id = skill_id(&state, &name).await?;
    let (alerts, states) = state.store.alerts_of(skill_id, 500).await?;
    Ok(Json(AlertList {
        skill: name,
        rules: states
            .into_iter()
            .map(|(rule, state, evaluated_at)| RuleState {
                rule,
                state,
                evaluated_at,
            })
            .collect(),
        alerts,
    }))
}
