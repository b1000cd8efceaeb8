//! The pages: skills, skill, run (with its per-case table), case (with its review form),
//! comparison, upload.
//!
//! Query parameters are read leniently (a page never answers JSON): an unknown value is a 400
//! page naming the parameter and the values it takes.

use std::collections::{BTreeMap, HashMap};

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Extension;
use axum::Form;
use maud::{html, Markup};
use serde_json::Value;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_infra::store::pages::{CaseQuery, CaseSort, SkillSort};
use skilleval_infra::store::reviews::{ReviewRow, ReviewVerdict};
use skilleval_model::definition::TestCase;
use skilleval_model::package::RiskReport;
use skilleval_reports::html::{
    case_detail, case_table, risk_section, summary_section, CaseInput, CaseRow, HISTOGRAM_BINS,
};
use uuid::Uuid;

use super::charts::{line_chart, sparkline};
use super::{layout, layout_with_scripts, PageError};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::parse_uuid;
use crate::results::stored_summary;
use crate::routes::reviews::{
    agreement_rows, criterion_score, store_reviews, AgreementRow, ReviewItem, ReviewsBody,
};
use crate::state::AppState;

/// Cases per page of the run's table.
pub const CASES_PER_PAGE: i64 = 100;

type Page = Result<Html<String>, PageError>;

fn bad_param(name: &str, rule: &str) -> PageError {
    PageError(ApiError::invalid_field("invalid_query", name, rule))
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// A query string for links that keep the table's filters.
fn query_string(pairs: &[(&str, Option<&str>)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            s.append_pair(k, v);
        }
    }
    s.finish()
}

fn path_segment(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// `GET /ui/`: the skills, searchable and sortable.
pub async fn skills(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Query(params): Query<HashMap<String, String>>,
) -> Page {
    let search = params
        .get("q")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let sort = match params.get("sort").map(String::as_str) {
        None | Some("" | "name") => SkillSort::Name,
        Some("newest") => SkillSort::Newest,
        Some(_) => return Err(bad_param("sort", "must be `name` or `newest`")),
    };
    let rows = state
        .store
        .skill_list(principal.viewer(), &search, sort)
        .await?;
    Ok(layout(
        "Skills",
        html! {
            form.filters method="get" action="/ui/" #skill-search {
                label { "search " input type="search" name="q" value=(search); }
                label { "sort " select name="sort" {
                    option value="name" selected[sort == SkillSort::Name] { "name" }
                    option value="newest" selected[sort == SkillSort::Newest] { "newest" }
                } }
                button type="submit" { "Apply" }
            }
            @if rows.is_empty() {
                p.muted { "No skills yet. " a href="/ui/upload" { "Upload one." } }
            } @else {
                table #skills {
                    tr { th { "skill" } th { "versions" } th { "latest version" } th { "latest verdict" } th { "pass-rate trend" } }
                    @for r in &rows {
                        tr {
                            td { a href=(format!("/ui/skills/{}", path_segment(&r.name))) { (r.name) } }
                            td.num { (r.versions) }
                            td { (r.latest_version.as_deref().unwrap_or("")) }
                            td { @match (&r.latest_verdict, r.latest_run) {
                                (Some(v), Some(run)) => a.verdict.(v) href=(format!("/ui/runs/{run}")) { (v) },
                                (None, Some(run)) => a href=(format!("/ui/runs/{run}")) { "running" },
                                _ => span.muted { "no run" },
                            } }
                            td { (sparkline(&r.pass_rates)) @if let Some(last) = r.pass_rates.last() { " " (pct(*last)) } }
                        }
                    }
                }
            }
        },
    ))
}

/// The judge-agreement table.
fn agreement_table(rows: &[AgreementRow]) -> Markup {
    html! {
        @if rows.is_empty() {
            p.muted #agreement-none { "No human reviews yet." }
        } @else {
            table #agreement {
                tr { th { "grade" } th { "judge" } th { "reviews" } th { "agreement" } th { "Cohen's kappa (95 % CI)" } }
                @for r in rows {
                    tr {
                        td { (r.criterion.as_deref().unwrap_or("case grade")) }
                        td { (r.judge) }
                        td.num { (r.agreement.n) }
                        td.num.agreement-pct { (pct(r.agreement.percent_agreement)) }
                        td.num { @match (r.agreement.kappa, r.agreement.kappa_low, r.agreement.kappa_high) {
                            (Some(k), Some(lo), Some(hi)) => (format!("{k:.2} [{lo:.2}, {hi:.2}]")),
                            _ => "undefined (one label only)",
                        } }
                    }
                }
            }
        }
    }
}

/// `GET /ui/skills/{name}`.
pub async fn skill(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Page {
    let Some((_, history)) = state.store.history(&name, None, 50).await? else {
        return Err(ApiError::not_found("skill", &name).into());
    };
    let collisions = crate::collisions::collisions_view(&state.store, &principal, &name).await?;
    let reviews = state.store.reviews_of_skill(&name).await?;
    let agreement = agreement_rows(&reviews);
    let has_monitor = match state.store.skill_id(&name).await? {
        Some(skill_id) => state.store.current_monitor(skill_id).await?.is_some(),
        None => false,
    };
    // Oldest first for the chart.
    let points: Vec<(String, f64)> = history
        .iter()
        .rev()
        .filter_map(|h| {
            let rate = h
                .run
                .as_ref()?
                .summary
                .as_ref()?
                .get("pass_rate")?
                .as_f64()?;
            Some((h.version.clone(), rate))
        })
        .collect();
    let skill_path = path_segment(&name);
    Ok(layout_with_scripts(
        &format!("Skill {name}"),
        html! {
            p { a #preview-link href=(format!("/ui/skills/{skill_path}/preview")) { "Preview a grade against a pasted output" } }
            h3 { "Pass rate by version" }
            @if points.is_empty() { p.muted { "No completed run yet." } }
            @else { (line_chart("version-chart", "pass rate by version", &points)) }
            h3 { "Versions" }
            table #versions {
                tr { th { "version" } th { "created" } th { "latest completed run" } th { "verdict" }
                     th { "pass rate" } th { "mean" } th { "baseline uplift" } th { "compare" } }
                @for (i, h) in history.iter().enumerate() {
                    @let previous = history.iter().skip(i + 1).find_map(|p| p.run.as_ref());
                    tr {
                        td { (h.version) " " a.edit-tests href=(format!("/ui/skills/{skill_path}/versions/{}/edit", path_segment(&h.version))) { "edit tests" } }
                        td { (h.created_at.format("%Y-%m-%d %H:%M")) }
                        @if let Some(run) = &h.run {
                            @let s = run.summary.as_ref();
                            td { a href=(format!("/ui/runs/{}", run.run_id)) { (run.run_id) } }
                            td { @if let Some(v) = &run.verdict { span.verdict.(v) { (v) } } }
                            td.num { (s.and_then(|s| s.get("pass_rate")).and_then(Value::as_f64).map(pct).unwrap_or_default()) }
                            td.num { (s.and_then(|s| s.get("mean")).and_then(Value::as_f64).map(|m| format!("{m:.3}")).unwrap_or_default()) }
                            // Shown when a baseline ran (the summary then carries it).
                            td.num { (s.and_then(|s| s.pointer("/benchmark/run_summary/delta/pass_rate")).map(uplift_text).unwrap_or_default()) }
                            td { @if let Some(prev) = previous {
                                form method="post" action="/ui/compare" {
                                    input type="hidden" name="base" value=(prev.run_id);
                                    input type="hidden" name="head" value=(run.run_id);
                                    button.compare type="submit" { "with previous" }
                                }
                            } }
                        } @else {
                            td.muted colspan="6" { "no completed run" }
                        }
                    }
                }
            }
            (super::collisions::section(&collisions))
            h3 { "Judge agreement" }
            p.muted { "Human reviews against the automatic grade, per rubric criterion and judge." }
            (agreement_table(&agreement))
            @if has_monitor { section #quality data-skill=(skill_path) hidden {
                h3 { "Production quality over time" }
                div #quality-chart {}
                p.muted { "Red marks are alert transitions." }
            } }
        },
        &["skill.js"],
    ))
}

/// The run table's parameters, from the query string.
fn case_query(params: &HashMap<String, String>) -> Result<(CaseQuery, i64), PageError> {
    let get = |k: &str| params.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let status = match get("status") {
        None => None,
        Some(s) => Some(
            CaseStatus::parse(s)
                .filter(|s| *s != CaseStatus::Queued)
                .ok_or_else(|| {
                    bad_param("status", "must be one of passed, failed, errored, skipped")
                })?,
        ),
    };
    let sort = match get("sort") {
        None | Some("case") => CaseSort::Case,
        Some("score") => CaseSort::ScoreAscending,
        Some("-score") => CaseSort::ScoreDescending,
        Some(_) => return Err(bad_param("sort", "must be `case`, `score` or `-score`")),
    };
    let page = match get("page") {
        None => 1,
        Some(p) => p
            .parse::<i64>()
            .ok()
            .filter(|p| (1..=1_000_000).contains(p))
            .ok_or_else(|| bad_param("page", "must be a whole number from 1"))?,
    };
    Ok((
        CaseQuery {
            status,
            tag: get("tag").map(str::to_string),
            suite: get("suite").map(str::to_string),
            strategy: get("strategy").map(str::to_string),
            sort,
            offset: (page - 1) * CASES_PER_PAGE,
            limit: CASES_PER_PAGE,
        },
        page,
    ))
}

fn select(name: &str, label: &str, current: Option<&str>, choices: &[String]) -> Markup {
    html! {
        label { (label) " " select name=(name) id=(format!("filter-{name}")) {
            option value="" { "any" }
            @for c in choices { option value=(c) selected[current == Some(c.as_str())] { (c) } }
        } }
    }
}

/// Any section a later feature adds to a run's summary (a baseline's uplift, the gate),
/// shown as it is when present.
fn optional_sections(summary: Option<&Value>) -> Markup {
    let known = [
        (
            "benchmark",
            "Baseline and repeats (benchmark.json: uplift, pass@k, pass^k, flaky cases)",
        ),
        ("triggers", "Trigger evals (precision, recall, F1)"),
        ("regression_gate", "Regression gate"),
        ("collision_gate", "Catalogue collision gate (no_collision)"),
    ];
    html! {
        @if let Some(s) = summary {
            @for (key, title) in known {
                @if let Some(v) = s.get(key).filter(|v| !v.is_null()) {
                    section.optional id=(format!("section-{key}")) {
                        h3 { (title) }
                        @if let Some(cid) = v.get("comparison_id").and_then(Value::as_str) {
                            p { a href=(format!("/ui/comparisons/{}", path_segment(cid))) { "the comparison" } }
                        }
                        pre.text { (serde_json::to_string_pretty(v).unwrap_or_default()) }
                    }
                }
            }
        }
    }
}

/// `GET /ui/runs/{id}`: verdict, statistics, histogram, breakdowns, agreement, and the
/// per-case table one page at a time (filtered and sorted in SQL).
pub async fn run(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> Page {
    let run_id = parse_uuid("id", &id)?;
    let run = state
        .store
        .get_run(run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run", run_id))?;
    let (query, page) = case_query(&params)?;
    let summary = run
        .finalised
        .then(|| stored_summary(run.summary.as_ref()))
        .flatten();
    let (rows, matching) = state.store.case_page(run_id, &query).await?;
    let facets = state.store.case_facets(run_id).await?;
    let mut bins = [0u64; HISTOGRAM_BINS];
    for (bin, n) in state.store.score_histogram(run_id).await? {
        if let Some(slot) = usize::try_from(bin).ok().and_then(|b| bins.get_mut(b)) {
            *slot = u64::try_from(n).unwrap_or(0);
        }
    }
    let reviews = state.store.reviews_of_run(run_id).await?;
    let agreement = agreement_rows(&reviews);
    // A version stored before risk reports existed has none; an unreadable one is left out.
    let risk: Option<RiskReport> = run
        .risk_report
        .clone()
        .and_then(|v| serde_json::from_value(v).ok());
    let rows: Vec<CaseRow> = rows
        .into_iter()
        .map(|r| CaseRow {
            case_index: u32::try_from(r.case_index).unwrap_or(0),
            test_case_id: r.test_case_id,
            name: r.name,
            status: r.status,
            strategy: r.strategy,
            score: r.score,
            tags: r.tags,
            suites: r.suites,
        })
        .collect();
    let href = |r: &CaseRow| format!("/ui/runs/{run_id}/cases/{}", r.case_index);
    let status_name = query.status.map(CaseStatus::as_str);
    let sort_name = match query.sort {
        CaseSort::Case => "case",
        CaseSort::ScoreAscending => "score",
        CaseSort::ScoreDescending => "-score",
    };
    let keep = |page: i64| {
        let page = page.to_string();
        query_string(&[
            ("status", status_name),
            ("tag", query.tag.as_deref()),
            ("suite", query.suite.as_deref()),
            ("strategy", query.strategy.as_deref()),
            ("sort", Some(sort_name).filter(|s| *s != "case")),
            ("page", Some(page.as_str()).filter(|p| *p != "1")),
        ])
    };
    let pages = (matching + CASES_PER_PAGE - 1) / CASES_PER_PAGE;
    let statuses: Vec<String> = ["passed", "failed", "errored", "skipped"]
        .iter()
        .map(|s| (*s).to_string())
        .collect();
    Ok(layout_with_scripts(
        &format!("Run of {} {}", run.skill, run.version),
        html! {
            p.meta { "Skill " a href=(format!("/ui/skills/{}", path_segment(&run.skill))) { (run.skill) }
                " · version " (run.version) " · " (run.kind.as_str()) " run " code { (run_id) }
                " · created " (run.created_at.format("%Y-%m-%d %H:%M:%S UTC")) }
            section #progress data-run=(run_id) data-finalised=(run.finalised) {
                p { "Status: " span #run-status { (run.status.to_string()) } " · "
                    span #run-completed { (run.counters.completed) } " of "
                    span #run-total { (run.counters.total) } " cases done" }
                progress #run-progress max=(run.counters.total.max(1)) value=(run.counters.completed) {}
                @if !run.finalised {
                    p #live-verdict hidden {}
                }
            }
            @if let Some(s) = &summary {
                (summary_section(s, &bins))
            } @else {
                p.muted { "The summary appears when the run is finalised." }
            }
            (optional_sections(run.summary.as_ref()))
            @if let Some(risk) = &risk { (risk_section(risk)) }
            h3 { "Judge agreement (this run)" }
            (agreement_table(&agreement))
            p { "Export: "
                a href=(format!("/v1/runs/{run_id}/report?format=markdown")) { "report.md" } " · "
                a href=(format!("/v1/runs/{run_id}/report?format=json")) { "report.json" } " · "
                a href=(format!("/v1/runs/{run_id}/feedback")) { "feedback.json" } }
            h2 { "Cases" }
            form.filters method="get" action=(format!("/ui/runs/{run_id}")) #case-filters {
                (select("status", "status", status_name, &statuses))
                (select("tag", "tag", query.tag.as_deref(), &facets.tags))
                (select("suite", "suite", query.suite.as_deref(), &facets.suites))
                (select("strategy", "strategy", query.strategy.as_deref(), &facets.strategies))
                label { "sort " select name="sort" #filter-sort {
                    option value="case" selected[sort_name == "case"] { "case order" }
                    option value="score" selected[sort_name == "score"] { "score, lowest first" }
                    option value="-score" selected[sort_name == "-score"] { "score, highest first" }
                } }
                button type="submit" #apply-filters { "Apply" }
            }
            p.muted #case-count { (matching) " matching cases · page " (page) " of " (pages.max(1)) }
            (case_table(&rows, &href))
            p.pager {
                @if page > 1 { a #prev-page href=(format!("?{}", keep(page - 1))) { "← previous" } }
                @if page < pages { a #next-page href=(format!("?{}", keep(page + 1))) { "next →" } }
            }
        },
        &["progress.js"],
    ))
}

/// `GET /ui/runs/{id}/cases/{index}`: the case, its grade, its reviews and the review form.
pub async fn case(
    State(state): State<AppState>,
    Path((id, index)): Path<(String, String)>,
    Query(params): Query<HashMap<String, String>>,
) -> Page {
    let run_id = parse_uuid("id", &id)?;
    let index: i32 = index.parse().map_err(|_| {
        PageError(ApiError::invalid_field(
            "invalid_path",
            "index",
            "must be a case position (a whole number)",
        ))
    })?;
    let run = state
        .store
        .get_run(run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run", run_id))?;
    let text = state
        .store
        .case_result_at(run_id, index)
        .await?
        .ok_or_else(|| ApiError::not_found("recorded case at position", index))?;
    let result: JobResult = serde_json::from_str(&text)
        .map_err(|e| ApiError::internal(anyhow::anyhow!("stored result does not parse: {e}")))?;
    let reviews: Vec<ReviewRow> = state
        .store
        .reviews_of_run(run_id)
        .await?
        .into_iter()
        .filter(|r| r.test_case_id == result.test_case_id)
        .collect();
    let criteria: Vec<String> = match &result.rubric_scores {
        Some(Value::Object(map)) => map
            .keys()
            .filter(|k| criterion_score(&result, k).is_some())
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    let planned = planned_case(&state, run_id, index, &result.test_case_id).await;
    let input = planned.as_ref().map(|c| CaseInput {
        prompt: &c.input.prompt,
        description: c.description.as_deref(),
        context: c.input.context.as_ref(),
        files: &c.input.files,
    });
    let reviewable = matches!(result.status, CaseStatus::Passed | CaseStatus::Failed);
    let saved = params.contains_key("saved");
    Ok(layout(
        &format!("Case {}", result.test_case_id),
        html! {
            p.meta { a href=(format!("/ui/runs/{run_id}")) { "← run of " (run.skill) " " (run.version) }
                " · " (result.name) }
            (case_detail(&result, input.as_ref()))
            h3 { "Human review" }
            @if saved { p #review-saved { "Review saved." } }
            @if !reviews.is_empty() {
                table #reviews {
                    tr { th { "grade" } th { "automatic" } th { "review" } th { "reviewer" } th { "note" } }
                    @for r in &reviews {
                        tr { td { (r.criterion.as_deref().unwrap_or("case grade")) }
                             td { (if r.judge_pass { "pass" } else { "fail" }) " (" (r.judge) ")" }
                             td { @match r.verdict { ReviewVerdict::Agree => span.agree { "agree" }, ReviewVerdict::Disagree => span.disagree { "disagree" } } }
                             td { (r.reviewer) } td { (r.note) } }
                    }
                }
            }
            @if reviewable {
                form method="post" action=(format!("/ui/runs/{run_id}/cases/{index}/review")) #review-form {
                    fieldset { legend { "Case grade: " (result.status.as_str()) }
                        label { input type="radio" name="case" value="agree" #review-case-agree; " agree" }
                        label { input type="radio" name="case" value="disagree" #review-case-disagree; " disagree" }
                    }
                    @for c in &criteria {
                        fieldset { legend { "Criterion " (c) ": " (criterion_score(&result, c).map(|s| format!("{s:.2}")).unwrap_or_default()) }
                            label { input type="radio" name=(format!("criterion:{c}")) value="agree"; " agree" }
                            label { input type="radio" name=(format!("criterion:{c}")) value="disagree"; " disagree" }
                        }
                    }
                    p { label { "Note " textarea name="note" #review-note rows="2" cols="60" {} } }
                    p { label { "Reviewer " input type="text" name="reviewer" #review-reviewer; } }
                    button type="submit" #review-submit { "Save review" }
                }
            } @else {
                p.muted { "An " (result.status.as_str()) " case has no grade to review." }
            }
        },
    ))
}

/// The case as planned (prompt templated, description, context, files), from the run's plan:
/// results do not store it. `None` when the plan cannot say (a filtered run whose positions
/// differ from the eval file's, a plan that no longer reads).
async fn planned_case(state: &AppState, run_id: Uuid, index: i32, id: &str) -> Option<TestCase> {
    let plan = state.planner.plan_of(run_id).await.ok()?;
    let mut chunks = plan.chunks(usize::try_from(index).ok()?, 1);
    let jobs = chunks.recv().await?.ok()?;
    let job = jobs.into_iter().next().filter(|j| j.case.id == id)?;
    Some(job.case)
}

/// `POST /ui/runs/{id}/cases/{index}/review` (the form): stored through the API's checks.
pub async fn review(
    State(state): State<AppState>,
    Path((id, index)): Path<(String, String)>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Result<Response, PageError> {
    let run_id = parse_uuid("id", &id)?;
    let position: i32 = index.parse().map_err(|_| {
        PageError(ApiError::invalid_field(
            "invalid_path",
            "index",
            "must be a case position (a whole number)",
        ))
    })?;
    let text = state
        .store
        .case_result_at(run_id, position)
        .await?
        .ok_or_else(|| ApiError::not_found("recorded case at position", position))?;
    let result: JobResult = serde_json::from_str(&text)
        .map_err(|e| ApiError::internal(anyhow::anyhow!("stored result does not parse: {e}")))?;
    let field: BTreeMap<&str, &str> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let note = field.get("note").copied().unwrap_or("").to_string();
    let verdict = |name: &str, v: &str| match v {
        "agree" => Ok(ReviewVerdict::Agree),
        "disagree" => Ok(ReviewVerdict::Disagree),
        _ => Err(PageError(ApiError::invalid_field(
            "invalid_body",
            name,
            "must be `agree` or `disagree`",
        ))),
    };
    let mut items = Vec::new();
    for (name, value) in &field {
        let criterion = if *name == "case" {
            None
        } else if let Some(c) = name.strip_prefix("criterion:") {
            Some(c.to_string())
        } else {
            continue;
        };
        items.push(ReviewItem {
            test_case_id: result.test_case_id.clone(),
            criterion,
            verdict: verdict(name, value)?,
            note: note.clone(),
        });
    }
    if items.is_empty() {
        return Err(PageError(ApiError::invalid_field(
            "invalid_body",
            "case",
            "choose agree or disagree for the case grade or a criterion",
        )));
    }
    // The form's input of each review, to name in an error instead of the API's pointer.
    let inputs: Vec<String> = items
        .iter()
        .map(|i| {
            i.criterion
                .as_ref()
                .map_or_else(|| "case".to_string(), |c| format!("criterion:{c}"))
        })
        .collect();
    store_reviews(
        &state,
        run_id,
        ReviewsBody {
            reviewer: field
                .get("reviewer")
                .copied()
                .unwrap_or("")
                .trim()
                .to_string(),
            reviews: items,
        },
    )
    .await
    .map_err(|e| match e.field().and_then(|f| form_input(f, &inputs)) {
        Some(input) => e.naming_field(&input),
        None => e,
    })?;
    Ok(Redirect::to(&format!("/ui/runs/{run_id}/cases/{position}?saved=1")).into_response())
}

/// The review form's input behind a pointer of the reviews API body: `/reviewer` and
/// `/reviews/N/note` are the form's `reviewer` and `note`, anything else of review N is the
/// verdict input it came from (`case` or `criterion:NAME`).
fn form_input(pointer: &str, inputs: &[String]) -> Option<String> {
    if pointer == "/reviewer" {
        return Some("reviewer".to_string());
    }
    let mut parts = pointer.strip_prefix("/reviews/")?.splitn(2, '/');
    let index: usize = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("note") => Some("note".to_string()),
        _ => inputs.get(index).cloned(),
    }
}

/// `POST /ui/compare` (a form on the skill page): the stored comparison of two runs, or a
/// new one, then its page.
pub async fn compare(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Form(fields): Form<HashMap<String, String>>,
) -> Result<Response, PageError> {
    let get = |k: &str| {
        fields
            .get(k)
            .ok_or_else(|| PageError(ApiError::invalid_field("invalid_body", k, "is required")))
            .and_then(|v| parse_uuid(k, v).map_err(PageError))
    };
    let (base, head) = (get("base")?, get("head")?);
    // Another publisher's run answers like a missing one.
    for (field, id) in [("base", base), ("head", head)] {
        if !state.store.visible_run(principal.viewer(), id).await? {
            return Err(PageError(ApiError::not_found(field, id)));
        }
    }
    let Some(comparison) = crate::comparing::comparison_between(&state.store, base, head).await?
    else {
        return Err(PageError(ApiError::new(
            StatusCode::CONFLICT,
            "not_comparable",
            "these two runs share no case that can be compared",
        )));
    };
    let id = comparison
        .get("comparison_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok(Redirect::to(&format!("/ui/comparisons/{}", path_segment(&id))).into_response())
}

/// Moved cases shown with their outputs side by side.
const SIDE_BY_SIDE: usize = 20;

/// Two outputs side by side, line by line: lines only the base has marked removed, lines only
/// the head has marked added (`similar`'s line diff).
fn side_by_side_diff(base: &str, head: &str) -> Markup {
    use similar::{ChangeTag, TextDiff};
    let diff = TextDiff::from_lines(base, head);
    let mut left: Vec<(String, &str)> = Vec::new();
    let mut right: Vec<(String, &str)> = Vec::new();
    for change in diff.iter_all_changes() {
        let line = change.to_string_lossy().into_owned();
        match change.tag() {
            ChangeTag::Equal => {
                left.push((line.clone(), ""));
                right.push((line, ""));
            }
            ChangeTag::Delete => left.push((line, "del")),
            ChangeTag::Insert => right.push((line, "ins")),
        }
    }
    let changed = left
        .iter()
        .chain(&right)
        .filter(|(_, c)| !c.is_empty())
        .count();
    let pane = |lines: &[(String, &str)], class: &str| {
        html! {
            pre.text.diff.(class) {
                @for (line, c) in lines {
                    @if c.is_empty() { (line) } @else { span.(c) { (line) } }
                }
            }
        }
    };
    html! {
        p.muted.diff-count { (changed) " changed line(s): removed in the base, added in the head" }
        div.side-by-side {
            div { p.muted { "base" } (pane(&left, "output-a")) }
            div { p.muted { "head" } (pane(&right, "output-b")) }
        }
    }
}

/// `GET /ui/comparisons/{id}`.
pub async fn comparison(State(state): State<AppState>, Path(id): Path<String>) -> Page {
    let comparison_id: Uuid = parse_uuid("id", &id)?;
    let stored = state
        .store
        .get_comparison(comparison_id)
        .await?
        .ok_or_else(|| ApiError::not_found("comparison", comparison_id))?;
    let c = stored.result.unwrap_or(Value::Null);
    let cases: Vec<&Value> = c
        .get("cases")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let moved: Vec<&Value> = cases
        .iter()
        .copied()
        .filter(|d| {
            d.get("delta")
                .and_then(Value::as_f64)
                .is_some_and(|x| x != 0.0)
        })
        .collect();
    let shown: Vec<String> = moved
        .iter()
        .take(SIDE_BY_SIDE)
        .filter_map(|d| {
            d.get("test_case_id")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect();
    let outputs = |rows: Vec<(String, Option<String>)>| -> HashMap<String, String> {
        rows.into_iter()
            .filter_map(|(id, text)| {
                let r: JobResult = serde_json::from_str(text.as_deref()?).ok()?;
                Some((id, r.output.unwrap_or_default()))
            })
            .collect()
    };
    let base_out = outputs(
        state
            .store
            .case_results_by_id(stored.base_run, &shown)
            .await?,
    );
    let head_out = outputs(
        state
            .store
            .case_results_by_id(stored.head_run, &shown)
            .await?,
    );
    let num = |v: Option<&Value>| {
        v.and_then(Value::as_f64)
            .map(|f| format!("{f:+.3}"))
            .unwrap_or_default()
    };
    let text = |v: Option<&Value>| {
        v.map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            .unwrap_or_default()
    };
    Ok(layout(
        "Comparison",
        html! {
            p.meta { "Base run " a href=(format!("/ui/runs/{}", stored.base_run)) { (stored.base_run) }
                " → head run " a href=(format!("/ui/runs/{}", stored.head_run)) { (stored.head_run) } }
            p #comparison-outcome { "Outcome: " strong { (text(c.get("outcome"))) } }
            p { (text(c.get("summary"))) }
            table.stats #comparison-stats {
                tr { th { "pass rate A" } td { (c.pointer("/pass_rate/a").and_then(Value::as_f64).map(pct).unwrap_or_default()) }
                     th { "pass rate B" } td { (c.pointer("/pass_rate/b").and_then(Value::as_f64).map(pct).unwrap_or_default()) }
                     th { "pass-rate difference" } td { (num(c.pointer("/pass_rate/difference/mean"))) }
                     th { "McNemar p" } td { (c.pointer("/pass_rate/mcnemar/p_two_sided").and_then(Value::as_f64).map(|p| format!("{p:.4}")).unwrap_or_default()) } }
                tr { th { "mean A" } td { (c.get("total_score_a").and_then(Value::as_f64).map(|f| format!("{f:.3}")).unwrap_or_default()) }
                     th { "mean B" } td { (c.get("total_score_b").and_then(Value::as_f64).map(|f| format!("{f:.3}")).unwrap_or_default()) }
                     th { "score difference" } td { (num(c.pointer("/overall/difference/mean"))) }
                     th { "gate" } td { (text(c.pointer("/gate/verdict"))) } }
            }
            h3 { "Moved cases (" (moved.len()) " of " (cases.len()) " paired)" }
            table #moved-cases {
                tr { th { "case" } th { "score A" } th { "score B" } th { "delta" } th { "change" } }
                @for d in moved.iter().chain(cases.iter().filter(|d| d.get("delta").and_then(Value::as_f64).is_none_or(|x| x == 0.0))).take(500) {
                    tr { td { (text(d.get("test_case_id"))) }
                         td.num { (d.get("score_a").and_then(Value::as_f64).map(|f| format!("{f:.3}")).unwrap_or_default()) }
                         td.num { (d.get("score_b").and_then(Value::as_f64).map(|f| format!("{f:.3}")).unwrap_or_default()) }
                         td.num { (num(d.get("delta"))) }
                         td { (text(d.get("change"))) } }
                }
            }
            h3 { "Outputs side by side" }
            @for id in &shown {
                h4 { (id) }
                (side_by_side_diff(
                    base_out.get(id).map(String::as_str).unwrap_or(""),
                    head_out.get(id).map(String::as_str).unwrap_or(""),
                ))
            }
            @if shown.is_empty() { p.muted { "No case moved." } }
        },
    ))
}

/// `GET /ui/upload`: drop a ZIP, see every problem, then run it and follow it live.
pub async fn upload() -> Html<String> {
    layout_with_scripts(
        "Upload a skill",
        html! {
            p { "Drop a skill package ZIP or its folder (SKILL.md, the eval definition and its files). It is validated first: "
                "nothing is stored until it is valid and you start the run." }
            div.dropzone #dropzone {
                p { "Drop the ZIP or the folder here, or choose " }
                p { label { "a ZIP " input type="file" #package-file accept=".zip,application/zip"; } }
                p { label { "a folder " input type="file" #package-folder webkitdirectory multiple; } }
            }
            p #profile-choice hidden {
                label { "This package leaves its profile open (the default strategy of cases that name none): "
                    select #package-profile {
                        @for p in ["deterministic", "structured", "flexible", "creative", "enterprise"] { option value=(p) { (p) } }
                    } }
            }
            p #validation-status.muted {}
            ul.problems #problems {}
            p { button type="button" #start-run disabled { "Store and run" } }
            section #upload-progress hidden {
                p { "Run " a #run-link href="#" {} ": " span #run-status {} " · "
                    span #run-completed { "0" } " of " span #run-total { "0" } " cases done" }
                progress #run-progress max="1" value="0" {}
                p #live-verdict hidden {}
            }
        },
        &["progress.js", "upload.js"],
    )
}

/// Case ids listed on the preview page at most.
const PREVIEW_CASES: usize = 2_000;

/// `GET /ui/skills/{name}/preview`: pick a case of the newest version, paste an output, see
/// how it would be graded (`POST /v1/skills/{name}/preview`), nothing stored.
pub async fn preview(State(state): State<AppState>, Path(name): Path<String>) -> Page {
    let version = crate::routes::editor::find_version(&state, &name, None)
        .await?
        .ok_or_else(|| ApiError::not_found("version of skill", &name))?;
    let version_label = version.version.clone();
    let hash = version.package_hash.clone();
    let ids = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<String>> {
        let definition = crate::runs::definition::read_definition(version.config)?;
        let mut ids = Vec::new();
        definition.plan_chunks(
            &hash,
            Uuid::nil(),
            &skilleval_execution::plan::CaseFilter::default(),
            None,
            500,
            |jobs| {
                ids.extend(jobs.into_iter().map(|j| j.case.id));
                ids.len() < PREVIEW_CASES
            },
        )?;
        ids.truncate(PREVIEW_CASES);
        Ok(ids)
    })
    .await
    .map_err(|e| ApiError::internal(anyhow::anyhow!("listing cases failed: {e}")))??;
    Ok(layout_with_scripts(
        &format!("Preview a grade · {name} {}", version_label),
        html! {
            p { "Paste an output for one case of version " (version_label)
                " and see how it is graded, by the same strategies as a run. Nothing is stored." }
            form #preview-form data-skill=(path_segment(&name)) data-version=(version_label) {
                p { label { "case " select #preview-case {
                    @for id in &ids { option value=(id) { (id) } }
                } } }
                p { label { "output" br; textarea #preview-output rows="6" cols="80" {} } }
                button type="submit" #preview-submit { "Grade" }
            }
            section #preview-result hidden {
                p { "Status: " span #preview-status {} " · score " span #preview-score {} }
                pre.text #preview-details {}
            }
        },
        &["preview.js"],
    ))
}

/// A baseline's pass-rate uplift as `benchmark.json` writes it (a signed string, `"+0.50"`),
/// or a number.
fn uplift_text(u: &Value) -> String {
    match (u.as_str(), u.as_f64()) {
        (Some(text), _) => text.to_string(),
        (None, Some(f)) => format!("{f:+.2}"),
        (None, None) => u.to_string(),
    }
}

/// `GET /ui/skills/{name}/versions/{version}/edit`: the test-case editor. The form is built
/// by `editor.js` from `GET /v1/skills/{name}/versions/{version}/definition`; it previews a
/// case's grade with the edited definition (`POST /v1/skills/{name}/preview`) and downloads
/// the package rebuilt around it (`POST /v1/skills/{name}/versions/{version}/package`).
pub async fn editor(
    State(state): State<AppState>,
    Path((name, version)): Path<(String, String)>,
) -> Page {
    let (_, versions) = state
        .store
        .versions_of(&name)
        .await?
        .ok_or_else(|| ApiError::not_found("skill", &name))?;
    if !versions.iter().any(|v| v.version == version) {
        return Err(ApiError::not_found("version", &version).into());
    }
    let mut strategies = state.strategies.names();
    strategies.sort_unstable();
    Ok(layout_with_scripts(
        &format!("Edit the tests · {name} {version}"),
        html! {
            p { "Edit version " (version) "'s eval definition, preview a case's grade against a pasted output, "
                "and download the package with the edited definition as " code { "eval/tests.json" }
                ". Nothing is stored: upload the downloaded package to make it a version." }
            div #editor data-skill=(path_segment(&name)) data-version=(path_segment(&version))
                data-version-label=(version) data-strategies=(strategies.join(",")) {
                p #editor-status.muted { "Loading the definition…" }
                p #editor-converted.muted hidden {}
                p { label { "profile " select #editor-profile {
                    @for p in ["deterministic", "structured", "flexible", "creative", "enterprise"] { option value=(p) { (p) } }
                } } }
                div #editor-cases {}
                p { button type="button" #add-case { "Add a case" } }
            }
            section #editor-preview {
                h3 { "Preview a grade" }
                p { label { "case " select #editor-preview-case {} } }
                p { label { "output" br; textarea #editor-preview-output rows="5" cols="80" {} } }
                button type="button" #editor-preview-submit { "Grade with the edited definition" }
                p #editor-preview-result hidden { "Status: " span #editor-preview-status {} " · score " span #editor-preview-score {} }
                pre.text #editor-preview-details hidden {}
            }
            section #editor-download {
                h3 { "Download" }
                button type="button" #download-package { "Validate and download the package" }
                p #download-status.muted {}
                ul.problems #download-problems {}
            }
        },
        &["editor.js"],
    ))
}

/// `GET /ui/matrix/{id}`: a model matrix as a table, a row per skill and a column per model,
/// each cell coloured by the significant change of its comparison with the reference run.
pub async fn matrix(State(state): State<AppState>, Path(id): Path<String>) -> Page {
    let matrix_id: Uuid = parse_uuid("id", &id)?;
    let m = crate::routes::matrix::matrix_view(&state, matrix_id)
        .await?
        .ok_or_else(|| ApiError::not_found("matrix", matrix_id))?;
    Ok(matrix_page(matrix_id, &m))
}

/// The matrix page of `GET /v1/matrix/{id}`'s answer `m`.
fn matrix_page(matrix_id: Uuid, m: &Value) -> Html<String> {
    let models: Vec<String> = m["models"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let cells: Vec<&Value> = m["cells"].as_array().into_iter().flatten().collect();
    // Rows in the cells' order (skill by skill), each skill once.
    let mut skills: Vec<(String, String)> = Vec::new();
    for c in &cells {
        let key = (
            c["skill"].as_str().unwrap_or_default().to_string(),
            c["version"].as_str().unwrap_or_default().to_string(),
        );
        if !skills.contains(&key) {
            skills.push(key);
        }
    }
    let cell = |skill: &str, model: &str| {
        cells
            .iter()
            .copied()
            .find(|c| c["skill"] == skill && c["model"] == model)
    };
    let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
    layout(
        "Model matrix",
        html! {
            p.meta #matrix-status { "Matrix " (matrix_id) " — " strong { (text(&m["status"])) }
                " — estimated " (m.pointer("/estimate/estimated_tokens").map(text).unwrap_or_default()) " tokens, "
                (m.pointer("/estimate/estimated_cost_usd").and_then(Value::as_f64).map(|c| format!("{c:.4} USD")).unwrap_or_else(|| "cost unknown".into())) }
            p.muted { "Each cell is a run of the skill's version producing with that model, compared case by case with the version's reference run: "
                span.change-worse { "significantly worse" } ", " span.change-better { "significantly better" } ", " span.change-no_change { "no detectable change" } "." }
            table #matrix {
                tr { th { "skill" } @for model in &models { th { (model) } } }
                @for (skill, version) in &skills {
                    tr {
                        th { a href=(format!("/ui/skills/{}", path_segment(skill))) { (skill) } " " span.muted { (version) } }
                        @for model in &models {
                            @match cell(skill, model) {
                                Some(c) => {
                                    @let change = c["change"].as_str().unwrap_or("pending");
                                    td class=(format!("matrix-cell change-{change}")) data-skill=(skill) data-model=(model) data-change=(change) {
                                        a href=(format!("/ui/runs/{}", path_segment(&text(&c["run_id"])))) {
                                            (c["pass_rate"].as_f64().map(pct).unwrap_or_else(|| "–".into()))
                                        }
                                        @if let (Some(lo), Some(hi)) = (c["pass_rate_interval"][0].as_f64(), c["pass_rate_interval"][1].as_f64()) {
                                            " " span.muted { "[" (pct(lo)) ", " (pct(hi)) "]" }
                                        }
                                        br;
                                        (text(&c["verdict"])) " · "
                                        @match c.pointer("/comparison/comparison_id").and_then(Value::as_str) {
                                            Some(cid) => a href=(format!("/ui/comparisons/{}", path_segment(cid))) { (change.replace('_', " ")) },
                                            None => span.muted { (text(&c["status"])) },
                                        }
                                    }
                                }
                                None => td.muted { "–" },
                            }
                        }
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod matrix_page_tests {
    use super::*;

    #[test]
    fn hostile_text_in_a_matrix_is_rendered_as_text() {
        let hostile = "<script>alert(1)</script>";
        let m = serde_json::json!({
            "status": "completed",
            "models": [hostile],
            "cells": [{"skill": hostile, "version": hostile, "model": hostile,
                       "run_id": hostile, "pass_rate": 0.5, "pass_rate_interval": [0.2, 0.8],
                       "verdict": hostile, "change": "worse",
                       "comparison": {"comparison_id": hostile}}]
        });
        let html = matrix_page(Uuid::nil(), &m).0;
        assert!(!html.contains(hostile), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert!(html.contains("data-change=\"worse\""), "{html}");
        assert!(html.contains("50.0 %"), "{html}");
    }
}
