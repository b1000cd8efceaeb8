//! `POST /v1/skills` (upload a package, start a run) and `GET /v1/skills/{name}/versions`.
//!
//! An upload is read under `coordinator.max_upload_bytes` (413 past it, naming the limit),
//! opened with the package hardening (zip bombs, zip slip, links: refused), validated (every
//! problem listed with its file and JSON pointer), and only then stored: the skill, the
//! version, its eval config and the run commit in one transaction, so a refused or invalid
//! upload stores nothing.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::{Extension, Json};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use skilleval_execution::plan::CaseFilter;
use skilleval_infra::store::samples::{NewRevision, RevisionSource};
use skilleval_infra::store::versions::{NewVersion, VersionError};
use skilleval_model::definition::Profile;
use skilleval_model::gate::{GateRule, GateSpec};
use skilleval_model::package::{PackageError, PackageLimits, RiskReport};

use super::fields::{check_callback_url, check_repeats, check_trigger_runs, trigger_plan};
use super::package_files;
use super::validation::{open_package, package_error, Opening};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::runs::plan::{PlannedVersion, RunRequest};
use crate::state::AppState;
use crate::views::{UploadResponse, VersionList, VersionView};
use skilleval_infra::store::lifecycle::RunKind;

/// The upload's gate from its query parameters; thresholds without `gate` are refused (they
/// would silently do nothing).
fn upload_gate(query: &UploadQuery) -> Result<Option<GateSpec>, ApiError> {
    let Some(rule) = query.gate else {
        if query.gate_alpha.is_some() || query.gate_score_margin.is_some() {
            return Err(ApiError::invalid_field(
                "invalid_query",
                "gate",
                "is required with gate_alpha or gate_score_margin",
            ));
        }
        return Ok(None);
    };
    let spec = GateSpec::Detailed {
        rule,
        alpha: query.gate_alpha,
        score_margin: query.gate_score_margin,
    };
    if let Err(e) = spec.config() {
        return Err(ApiError::invalid_field(
            "invalid_query",
            &format!("gate_{}", e.field),
            e.rule,
        ));
    }
    Ok(Some(spec))
}

/// The configuration key named in 413 responses.
pub const UPLOAD_LIMIT_KEY: &str = "coordinator.max_upload_bytes";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadQuery {
    /// `false`: store the version without running it.
    #[serde(default = "yes")]
    pub run: bool,
    #[serde(default)]
    pub callback_url: Option<String>,
    /// The regression gate of the upload's run (`no_regression`, or `none` to override the
    /// definition's), with optional thresholds.
    #[serde(default)]
    pub gate: Option<GateRule>,
    #[serde(default)]
    pub gate_alpha: Option<f64>,
    #[serde(default)]
    pub gate_score_margin: Option<f64>,
    /// Also run each case without the skill (the uplift).
    #[serde(default)]
    pub baseline: bool,
    /// Attempts per case (pass@k, pass^k); 1 to 20.
    #[serde(default)]
    pub repeats: Option<i64>,
    /// Also run the package's trigger evals.
    #[serde(default)]
    pub triggers: bool,
    /// Runs per trigger query (1 to 10; default 3); implies `triggers`.
    #[serde(default)]
    pub trigger_runs: Option<i64>,
    /// The profile of a package that leaves it open ([`apply_profile`]).
    #[serde(default)]
    pub profile: Option<Profile>,
    /// Make this skill a catalogue neighbour for every publisher's collision evals, not only
    /// its own publisher's (docs/catalogue.md).
    #[serde(default)]
    pub public: bool,
}

/// `POST /v1/skills/validate`'s query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidateQuery {
    /// The profile of a package that leaves it open ([`apply_profile`]).
    #[serde(default)]
    pub profile: Option<Profile>,
}

fn yes() -> bool {
    true
}

/// `POST /v1/skills`.
#[tracing::instrument(skip_all)]
pub async fn upload(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiQuery(query): ApiQuery<UploadQuery>,
    request: Request,
) -> Result<(StatusCode, Json<UploadResponse>), ApiError> {
    if let Some(url) = &query.callback_url {
        check_callback_url("callback_url", url)?;
    }
    let gate = upload_gate(&query)?;
    let repeats = check_repeats("repeats", query.repeats)?;
    let trigger_runs = check_trigger_runs("trigger_runs", query.trigger_runs)?;
    let headers = request.headers().clone();
    let body = read_limited(request.into_body(), &headers, state.max_upload_bytes)
        .await
        .inspect_err(|e| {
            if e.status == StatusCode::PAYLOAD_TOO_LARGE {
                crate::metrics::Metrics::count(&state.metrics.uploads_refused, "too_large");
            }
        })?;
    let zip = zip_from_body(&headers, body, &state.limits).await?;
    let zip = match query.profile {
        Some(profile) => apply_profile(zip, profile, state.limits.clone()).await?,
        None => zip,
    };
    let started = std::time::Instant::now();
    let opened = open_package(zip.clone(), state.limits.clone(), state.strategies.clone()).await;
    let (mut package, definition, warnings, monitor, risk, models) = match opened {
        Ok(ok) => ok,
        Err(Opening::Package(e)) => {
            let reason = if matches!(e, PackageError::Refused { .. }) {
                "refused"
            } else {
                "invalid"
            };
            crate::metrics::Metrics::count(&state.metrics.uploads_refused, reason);
            return Err(package_error(e));
        }
        Err(Opening::Failed(e)) => return Err(e),
    };
    let validated = started.elapsed();
    let triggers = if query.triggers || query.trigger_runs.is_some() {
        Some(trigger_plan(
            "triggers",
            trigger_runs,
            package.triggers.clone(),
        )?)
    } else {
        None
    };
    // Counted once the package is valid and allowed: a refused package costs no upload.
    refuse_by_policy(&state, &risk)?;
    crate::access::reserve_upload(&state, &principal).await?;
    let manifest = &package.manifest;
    let version_label = manifest.metadata.get("version").and_then(|v| match v {
        serde_json::Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    });
    let manifest_json =
        serde_json::to_value(manifest).map_err(|e| ApiError::internal(anyhow::Error::from(e)))?;
    let test_cases = definition.cases();
    let new_version = NewVersion {
        skill_name: &manifest.name,
        description: &manifest.description,
        description_hash: &manifest.description_hash(),
        package_hash: &package.content_hash,
        package_bytes: &zip,
        manifest: manifest_json,
        version_label,
        eval_version: &package.config.version,
        profile: package.config.profile.as_str(),
        config_deflate: definition.deflated(),
        settings: serde_json::to_value(&package.config.settings)
            .map_err(|e| ApiError::internal(anyhow::Error::from(e)))?,
        test_cases: i32::try_from(test_cases).unwrap_or(i32::MAX),
        publisher_id: principal.publisher_id,
        any_owner: principal.is_admin(),
        risk_report: serde_json::to_value(&risk)
            .map_err(|e| ApiError::internal(anyhow::Error::from(e)))?,
        models,
    };
    // Held until the upload's run is committed.
    let run_slot = if query.run {
        Some(
            crate::access::reserve_run(
                &state,
                &principal,
                i64::try_from(test_cases).unwrap_or(i64::MAX),
            )
            .await?,
        )
    } else {
        None
    };

    let mut tx = state.store.pool().begin().await?;
    let stored = state.store.upsert_version(&mut tx, &new_version).await.map_err(|e| match e {
        VersionError::LabelTaken { .. } => ApiError::conflict("version_conflict", e.to_string())
            .with_details(json!({ "field": "SKILL.md#/metadata/version", "rule": "a version label names one package content" })),
        // Skill names are one marketplace-wide namespace: the name's existence is what an
        // upload of the same name must learn (documented); nothing else of the skill is.
        VersionError::NameTaken { .. } => ApiError::conflict("skill_name_taken", e.to_string())
            .with_details(json!({ "field": "SKILL.md#/name", "rule": "a skill name belongs to the publisher that first uploaded it" })),
        VersionError::Store(e) => ApiError::internal(e),
    })?;
    drop(new_version);
    if let Some(m) = &monitor {
        // The package's `monitoring` section seeds the skill's monitor (revision 1), and a
        // changed section makes a new revision.
        let validated = serde_json::to_value(&m.monitor)
            .map_err(|e| ApiError::internal(anyhow::Error::from(e)))?;
        state
            .store
            .put_monitor(
                &mut tx,
                &NewRevision {
                    skill_id: stored.skill_id,
                    document: &m.document,
                    monitor: &validated,
                    source: RevisionSource::Package,
                    callback_url: None,
                },
            )
            .await?;
    }
    let inserted = if query.run {
        let request = RunRequest {
            version_id: stored.version_id,
            runner: None,
            filter: CaseFilter::default(),
            callback_url: query.callback_url.clone(),
            idempotency_key: None,
            kind: RunKind::Upload,
            max_cost_usd: None,
            max_tokens: None,
            gate,
            rescore_of: None,
            baseline: query.baseline,
            repeats,
            triggers,
            definition: None,
            token_id: principal.token_id,
        };
        // Planned from the definition in hand (the one just stored, or the identical one of
        // the version with the same content), not read back from the database.
        let version = PlannedVersion {
            version_id: stored.version_id,
            package_hash: package.content_hash.clone(),
            definition: Arc::new(definition),
        };
        let prepared = state.planner.prepare(version, &request)?;
        let inserted = state.planner.insert(&mut tx, &prepared).await?;
        Some((prepared, inserted))
    } else {
        None
    };
    tx.commit().await?;
    drop(run_slot);
    let committed = started.elapsed();
    // Stored and planned: what remains to do needs only the definition's text. A large
    // upload's ZIP is freed before the rows are created.
    drop(zip);
    package.case_pointers = Vec::new();
    package.files = Vec::new();
    let run_id = inserted.as_ref().map(|(_, inserted)| inserted.run_id());
    if let Some((prepared, inserted)) = inserted {
        // Published in the background: the upload answers now.
        drop(state.publisher.start(prepared, inserted));
    }
    // The catalogue lane: the collision eval runs after the answer.
    crate::collisions::spawn(
        state.store.clone(),
        state.comparator.clone(),
        state.catalogue,
        crate::collisions::CollisionJob {
            version_id: stored.version_id,
            skill_id: stored.skill_id,
            publisher_id: principal.publisher_id,
            name: manifest.name.clone(),
            description: manifest.description.clone(),
            queries: package
                .triggers
                .iter()
                .filter(|t| t.should_trigger)
                .map(|t| t.query.clone())
                .collect(),
            public: query.public,
            gate: query.gate == Some(GateRule::NoCollision),
            agent: state.catalogue_agent.clone(),
        },
    );
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    tracing::info!(
        skill = %manifest.name,
        version = %stored.version,
        created = stored.created,
        test_cases,
        validate_ms = ms(validated),
        store_ms = ms(committed - validated),
        create_ms = ms(started.elapsed() - committed),
        "skill version stored"
    );
    Ok((
        StatusCode::CREATED,
        Json(UploadResponse {
            skill_id: stored.skill_id,
            version_id: stored.version_id,
            name: manifest.name.clone(),
            version: stored.version,
            test_cases,
            run_id,
            warnings,
            risk,
        }),
    ))
}

/// 422 `package_risk` when `coordinator.risk` refuses the package's findings, naming each.
fn refuse_by_policy(state: &AppState, risk: &RiskReport) -> Result<(), ApiError> {
    let refused = state.risk_policy.refusals(risk);
    let Some(threshold) = state.risk_policy.refuse_at.filter(|_| !refused.is_empty()) else {
        return Ok(());
    };
    crate::metrics::Metrics::count(&state.metrics.uploads_refused, "risk");
    let named: Vec<String> = refused.iter().map(ToString::to_string).collect();
    Err(ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "package_risk",
        format!(
            "the package has {} risk finding(s) at or above `{threshold}`, which \
             coordinator.risk.refuse_at refuses: {}",
            refused.len(),
            named.join("; ")
        ),
    )
    .with_details(json!({
        "policy": "coordinator.risk.refuse_at",
        "refuse_at": threshold,
        "findings": refused,
    })))
}

/// `GET /v1/skills/{name}/versions`.
pub async fn versions(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<VersionList>, ApiError> {
    let (skill_id, versions) = state
        .store
        .versions_of(&name)
        .await?
        .ok_or_else(|| ApiError::not_found("skill", &name))?;
    Ok(Json(VersionList {
        skill: name,
        skill_id,
        versions: versions.into_iter().map(VersionView::from_row).collect(),
    }))
}

/// Reads the body, refusing (413) as soon as it is known to be over `limit`.
async fn read_limited(body: Body, headers: &HeaderMap, limit: u64) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::payload_too_large(UPLOAD_LIMIT_KEY, limit));
    }
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                format!("reading the body failed: {e}"),
            )
        })?;
        if (buf.len() + chunk.len()) as u64 > limit {
            return Err(ApiError::payload_too_large(UPLOAD_LIMIT_KEY, limit));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

/// The ZIP: the raw body, the multipart field `file`, or a folder sent as multipart fields
/// `files` (each one file, its file name the path relative to the folder), zipped here.
async fn zip_from_body(
    headers: &HeaderMap,
    body: Bytes,
    limits: &PackageLimits,
) -> Result<Bytes, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/zip")
        .to_string();
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let zip = match mime.as_str() {
        "application/zip" | "application/x-zip-compressed" | "application/octet-stream" => body,
        "multipart/form-data" => multipart_file(&content_type, body, limits).await?,
        other => {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("`Content-Type: {other}` is not accepted: send the ZIP as application/zip, or as multipart/form-data field `file`"),
            )
            .with_details(json!({ "field": "Content-Type", "rule": "must be application/zip or multipart/form-data" })))
        }
    };
    if zip.is_empty() {
        return Err(ApiError::invalid_field(
            "invalid_body",
            "",
            "the body is empty: send the skill's ZIP",
        ));
    }
    Ok(zip)
}

async fn multipart_file(
    content_type: &str,
    body: Bytes,
    limits: &PackageLimits,
) -> Result<Bytes, ApiError> {
    let boundary = multer::parse_boundary(content_type).map_err(|e| {
        ApiError::invalid_field(
            "invalid_body",
            "Content-Type",
            format!("bad multipart boundary: {e}"),
        )
    })?;
    let stream = futures::stream::once(async move { Ok::<Bytes, std::convert::Infallible>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let bad = |e: multer::Error| {
        ApiError::invalid_field(
            "invalid_body",
            "file",
            format!("malformed multipart body: {e}"),
        )
    };
    let mut folder: Vec<(String, Bytes)> = Vec::new();
    while let Some(field) = multipart.next_field().await.map_err(bad)? {
        match field.name() {
            Some("file") => return field.bytes().await.map_err(bad),
            Some("files") => {
                let Some(path) = field.file_name().map(str::to_string) else {
                    return Err(ApiError::invalid_field(
                        "invalid_body",
                        "files",
                        "each `files` part needs a file name: its path in the folder",
                    ));
                };
                if folder.len() >= limits.max_files {
                    return Err(ApiError::invalid_field(
                        "invalid_body",
                        "files",
                        format!("at most {} files (max_files)", limits.max_files),
                    ));
                }
                if folder.iter().any(|(seen, _)| *seen == path) {
                    return Err(ApiError::invalid_field(
                        "invalid_body",
                        "files",
                        format!("two `files` parts are named `{path}`: each path once"),
                    ));
                }
                folder.push((path, field.bytes().await.map_err(bad)?));
            }
            _ => {}
        }
    }
    if !folder.is_empty() {
        // The paths are checked by the package's own hardening when the ZIP is opened
        // (`..`, absolute paths, case-folded duplicates): the same rules as for an uploaded
        // ZIP. Exact duplicates are refused above: the ZIP writer would fail on them.
        return tokio::task::spawn_blocking(move || zip_folder(&folder))
            .await
            .map_err(|e| ApiError::internal(anyhow::anyhow!("zipping the folder failed: {e}")))?
            .map(Bytes::from)
            .map_err(|e| ApiError::internal(anyhow::Error::from(e)));
    }
    Err(ApiError::invalid_field(
        "invalid_body",
        "file",
        "the multipart body has no field `file` (a ZIP) or `files` (a folder's files)",
    ))
}

/// A folder's files (relative path, bytes) as a ZIP.
fn zip_folder(files: &[(String, Bytes)]) -> zip::result::ZipResult<Vec<u8>> {
    use std::io::Write as _;
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for (path, bytes) in files {
        writer.start_file(path.as_str(), options)?;
        writer.write_all(bytes)?;
    }
    Ok(writer.finish()?.into_inner())
}

/// Writes `profile` into a package whose eval definition leaves it open: an
/// `eval/tests.json` v2 (an object with `testCases`) without a `profile` key. Every other
/// format fixes each case's strategy when converted, and a definition naming its profile has
/// chosen: both are a 422 naming `profile`. The ZIP is rebuilt with the key added, so the
/// stored package says what it runs as.
pub(crate) async fn apply_profile(
    zip: Bytes,
    profile: Profile,
    limits: Arc<PackageLimits>,
) -> Result<Bytes, ApiError> {
    let rebuilt = tokio::task::spawn_blocking(move || -> Result<Result<Vec<u8>, &'static str>, PackageError> {
        let package = package_files::extract(&zip, &limits)?;
        let target = package.root.join(package_files::DEFINITION);
        let io = |source| PackageError::Io {
            path: target.clone(),
            source,
        };
        if profile_open(&target) != Some(true) {
            return Ok(Err(
                "only a package whose eval/tests.json (v2) has no `profile` leaves the profile open: leave `profile` out",
            ));
        }
        let text = std::fs::read(&target).map_err(io)?;
        // The key is written in front of the others as text rather than by re-serialising
        // the document, which would hold a large definition whole in memory.
        let Some(brace) = text.iter().position(|b| *b == b'{') else {
            return Ok(Err("eval/tests.json is not a JSON object"));
        };
        let mut out = Vec::with_capacity(text.len() + 32);
        out.extend_from_slice(&text[..=brace]);
        out.extend_from_slice(format!("\"profile\":\"{}\",", profile.as_str()).as_bytes());
        out.extend_from_slice(&text[brace + 1..]);
        std::fs::write(&target, out).map_err(io)?;
        package_files::zip_tree(&package.root).map(Ok)
    })
    .await
    .map_err(|e| ApiError::internal(anyhow::anyhow!("applying the profile failed: {e}")))?;
    match rebuilt {
        Ok(Ok(bytes)) => Ok(Bytes::from(bytes)),
        Ok(Err(rule)) => Err(ApiError::invalid_field("invalid_query", "profile", rule)),
        Err(e) => Err(package_error(e)),
    }
}

/// Whether the eval file at `path` is a v2 definition (an object with `testCases`) without a
/// `profile`: `None` when it is missing or not such an object. Read as a stream, skipping
/// every value.
pub(crate) fn profile_open(path: &std::path::Path) -> Option<bool> {
    #[derive(Deserialize)]
    struct Top {
        profile: Option<serde::de::IgnoredAny>,
        #[serde(rename = "testCases")]
        test_cases: Option<serde::de::IgnoredAny>,
    }
    let file = std::fs::File::open(path).ok()?;
    let top: Top = serde_json::from_reader(std::io::BufReader::new(file)).ok()?;
    top.test_cases?;
    Some(top.profile.is_none())
}

/// `POST /v1/skills/validate`: the upload's reading, hardening and validation, storing
/// nothing. **200** `{valid, name?, test_cases?, profile?, risk?, code?, message?, problems}`: an
/// invalid or refused package is a successful validation that lists every problem (file and
/// JSON pointer); 413 and 415 are as for the upload.
#[tracing::instrument(skip_all)]
pub async fn validate(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ValidateQuery>,
    request: Request,
) -> Result<Json<serde_json::Value>, ApiError> {
    let headers = request.headers().clone();
    let body = read_limited(request.into_body(), &headers, state.max_upload_bytes).await?;
    let zip = zip_from_body(&headers, body, &state.limits).await?;
    let zip = match query.profile {
        Some(profile) => apply_profile(zip, profile, state.limits.clone()).await?,
        None => zip,
    };
    match open_package(zip, state.limits.clone(), state.strategies.clone()).await {
        Ok((package, definition, warnings, _, risk, _)) => {
            let eval = package.root().join(&package.eval_file);
            let open = package.format == Some(skilleval_model::package::EvalFormat::V2)
                && package.eval_file == "eval/tests.json"
                && tokio::task::spawn_blocking(move || profile_open(&eval))
                    .await
                    .ok()
                    .flatten()
                    == Some(true);
            Ok(Json(json!({
                "valid": true,
                "name": package.manifest.name,
                "test_cases": definition.cases(),
                "profile": package.config.profile.as_str(),
                "profile_open": open,
                "problems": warnings,
                "risk": risk,
            })))
        }
        Err(Opening::Package(e)) => {
            let error = package_error(e);
            if error.status != StatusCode::UNPROCESSABLE_ENTITY {
                return Err(error);
            }
            Ok(Json(json!({
                "valid": false,
                "code": error.code,
                "message": error.message,
                "problems": error.details.get("problems").cloned().unwrap_or_else(|| json!([])),
            })))
        }
        Err(Opening::Failed(e)) => Err(e),
    }
}
