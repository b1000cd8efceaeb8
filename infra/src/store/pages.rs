//! What the web interface's pages read that the API does not: the skills list with each
//! skill's latest verdict and recent pass rates, a run's per-case table filtered, sorted and
//! paged in SQL (a 10,000-case run's page reads one page of rows, never the whole run), its
//! score histogram and filter choices, and one case's stored result.

use sqlx::{PgPool, Row};
use uuid::Uuid;

use skilleval_execution::result::CaseStatus;

use super::tenancy::Viewer;
use super::{Store, StoreError};

/// One skill in the list.
#[derive(Debug, Clone)]
pub struct SkillListRow {
    pub name: String,
    pub versions: i64,
    pub latest_version: Option<String>,
    /// The latest finalised upload or manual run of any version.
    pub latest_run: Option<Uuid>,
    pub latest_verdict: Option<String>,
    /// Pass rates of the last completed runs, oldest first (the trend).
    pub pass_rates: Vec<f64>,
}

/// How the skills list is ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SkillSort {
    #[default]
    Name,
    /// Most recently created skill first.
    Newest,
}

/// The per-case table's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaseSort {
    /// Eval file order.
    #[default]
    Case,
    ScoreAscending,
    ScoreDescending,
}

/// The per-case table's filter, order and page.
#[derive(Debug, Clone, Default)]
pub struct CaseQuery {
    pub status: Option<CaseStatus>,
    pub tag: Option<String>,
    pub suite: Option<String>,
    pub strategy: Option<String>,
    pub sort: CaseSort,
    pub offset: i64,
    pub limit: i64,
}

/// One row of the per-case table.
#[derive(Debug, Clone)]
pub struct CaseListRow {
    pub case_index: i32,
    pub test_case_id: String,
    pub name: String,
    pub status: CaseStatus,
    pub strategy: String,
    pub score: Option<f64>,
    pub tags: Vec<String>,
    pub suites: Vec<String>,
}

/// The distinct values a run's table can be filtered by.
#[derive(Debug, Clone, Default)]
pub struct CaseFacets {
    pub tags: Vec<String>,
    pub suites: Vec<String>,
    pub strategies: Vec<String>,
}

async fn skill_list(
    pool: &PgPool,
    viewer: Viewer,
    search: &str,
    sort: SkillSort,
) -> Result<Vec<SkillListRow>, sqlx::Error> {
    let order = match sort {
        SkillSort::Name => "s.name",
        SkillSort::Newest => "s.created_at DESC, s.name",
    };
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT s.name,
                (SELECT count(*) FROM skill_versions v WHERE v.skill_id = s.id),
                (SELECT v.version FROM skill_versions v WHERE v.skill_id = s.id
                 ORDER BY v.created_at DESC, v.id DESC LIMIT 1),
                latest.id, latest.verdict,
                COALESCE(ARRAY(
                    SELECT (t.summary->>'pass_rate')::float8 FROM (
                        SELECT r.summary, r.finished_at, r.id FROM runs r
                        JOIN skill_versions v ON v.id = r.version_id
                        WHERE v.skill_id = s.id AND r.status = 'completed'
                          AND r.kind IN ('upload', 'manual') AND r.summary ? 'pass_rate'
                        ORDER BY r.finished_at DESC NULLS LAST, r.id DESC LIMIT 10
                    ) t ORDER BY t.finished_at NULLS FIRST, t.id
                ), '{{}}')
         FROM skills s
         LEFT JOIN LATERAL (
             SELECT r.id, r.verdict FROM runs r JOIN skill_versions v ON v.id = r.version_id
             WHERE v.skill_id = s.id AND r.finalised AND r.kind IN ('upload', 'manual')
             ORDER BY r.finished_at DESC NULLS LAST, r.id DESC LIMIT 1
         ) latest ON true
         WHERE ($1 = '' OR s.name ILIKE '%' || $1 || '%')
           AND ($2::uuid IS NULL OR s.publisher_id = $2)
         ORDER BY {order}
         LIMIT 500"
    )))
    .bind(search)
    .bind(viewer.filter())
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(SkillListRow {
                name: r.try_get(0)?,
                versions: r.try_get(1)?,
                latest_version: r.try_get(2)?,
                latest_run: r.try_get(3)?,
                latest_verdict: r.try_get(4)?,
                pass_rates: r.try_get(5)?,
            })
        })
        .collect()
}

/// The row a page shows for a case: a run with a baseline or repeats holds one row per
/// (configuration, attempt), and its pages show the primary one (with the skill, attempt 1),
/// as the run's summary and verdict do.
const PRIMARY_VARIANT: &str = "configuration = 'with_skill' AND run_number = 1";

/// The WHERE clause every per-case statement shares ($1 run, $2 status, $3 tag, $4 suite,
/// $5 strategy).
const CASE_FILTER: &str = "run_id = $1 AND configuration = 'with_skill' AND run_number = 1
     AND ($2::text IS NULL OR status = $2)
     AND ($3::text IS NULL OR $3 = ANY(tags)) AND ($4::text IS NULL OR $4 = ANY(suites))
     AND ($5::text IS NULL OR strategy = $5)";

async fn case_page(
    pool: &PgPool,
    run_id: Uuid,
    q: &CaseQuery,
) -> Result<(Vec<CaseListRow>, i64), sqlx::Error> {
    let order = match q.sort {
        CaseSort::Case => "case_index",
        CaseSort::ScoreAscending => "score ASC NULLS FIRST, case_index",
        CaseSort::ScoreDescending => "score DESC NULLS LAST, case_index",
    };
    let status = q.status.map(CaseStatus::as_str);
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT case_index, test_case_id, name, status, strategy, score, tags, suites
         FROM eval_results WHERE {CASE_FILTER}
         ORDER BY {order} OFFSET $6 LIMIT $7"
    )))
    .bind(run_id)
    .bind(status)
    .bind(q.tag.as_deref())
    .bind(q.suite.as_deref())
    .bind(q.strategy.as_deref())
    .bind(q.offset)
    .bind(q.limit)
    .fetch_all(pool)
    .await?;
    let total: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM eval_results WHERE {CASE_FILTER}"
    )))
    .bind(run_id)
    .bind(status)
    .bind(q.tag.as_deref())
    .bind(q.suite.as_deref())
    .bind(q.strategy.as_deref())
    .fetch_one(pool)
    .await?;
    let rows = rows
        .iter()
        .map(|r| {
            let status: String = r.try_get(3)?;
            Ok(CaseListRow {
                case_index: r.try_get(0)?,
                test_case_id: r.try_get(1)?,
                name: r.try_get(2)?,
                status: CaseStatus::parse(&status).ok_or_else(|| {
                    sqlx::Error::Decode(format!("unknown case status `{status}`").into())
                })?,
                strategy: r.try_get(4)?,
                score: r.try_get(5)?,
                tags: r.try_get(6)?,
                suites: r.try_get(7)?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok((rows, total))
}

impl Store {
    /// Skills whose name contains `search` (case-insensitive; '' for all), at most 500.
    /// The skills the viewer may see, filtered by name and sorted.
    pub async fn skill_list(
        &self,
        viewer: Viewer,
        search: &str,
        sort: SkillSort,
    ) -> Result<Vec<SkillListRow>, StoreError> {
        skill_list(self.pool(), viewer, search, sort)
            .await
            .map_err(StoreError::query("listing skills"))
    }

    /// One page of a run's recorded cases, filtered and sorted, and how many match.
    #[tracing::instrument(skip_all, fields(run_id = %run_id))]
    pub async fn case_page(
        &self,
        run_id: Uuid,
        query: &CaseQuery,
    ) -> Result<(Vec<CaseListRow>, i64), StoreError> {
        case_page(self.pool(), run_id, query)
            .await
            .map_err(StoreError::query("reading a page of cases"))
    }

    /// Graded cases per score bucket of width 0.1 (the last bucket includes 1.0).
    pub async fn score_histogram(&self, run_id: Uuid) -> Result<Vec<(i32, i64)>, StoreError> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT LEAST(floor(GREATEST(LEAST(score, 1.0), 0.0) * 10), 9)::int4 AS bin, count(*)
             FROM eval_results WHERE run_id = $1 AND {PRIMARY_VARIANT}
               AND score IS NOT NULL AND score = score
             GROUP BY bin ORDER BY bin"
        )))
        .bind(run_id)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("reading a run's score histogram"))
    }

    /// The tags, suites and strategies of a run's recorded cases.
    pub async fn case_facets(&self, run_id: Uuid) -> Result<CaseFacets, StoreError> {
        let context = "reading a run's filter choices";
        let distinct = |select: &str, from: &str| {
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
                "SELECT DISTINCT {select} FROM eval_results{from}
                 WHERE run_id = $1 AND {PRIMARY_VARIANT} ORDER BY 1"
            )))
            .bind(run_id)
            .fetch_all(self.pool())
        };
        Ok(CaseFacets {
            tags: distinct("t", ", unnest(tags) t")
                .await
                .map_err(StoreError::query(context))?,
            suites: distinct("s", ", unnest(suites) s")
                .await
                .map_err(StoreError::query(context))?,
            strategies: distinct("strategy", "")
                .await
                .map_err(StoreError::query(context))?,
        })
    }

    /// One recorded case's whole result (the worker's JSON) by its position in the run.
    pub async fn case_result_at(
        &self,
        run_id: Uuid,
        case_index: i32,
    ) -> Result<Option<String>, StoreError> {
        sqlx::query_scalar::<_, Option<String>>(sqlx::AssertSqlSafe(format!(
            "SELECT result FROM eval_results
             WHERE run_id = $1 AND case_index = $2 AND {PRIMARY_VARIANT}"
        )))
        .bind(run_id)
        .bind(case_index)
        .fetch_optional(self.pool())
        .await
        .map(Option::flatten)
        .map_err(StoreError::query("reading a case's result"))
    }

    /// Recorded cases' whole results by id (for reviews and side-by-side outputs).
    pub async fn case_results_by_id(
        &self,
        run_id: Uuid,
        test_case_ids: &[String],
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT test_case_id, result FROM eval_results
             WHERE run_id = $1 AND test_case_id = ANY($2) AND {PRIMARY_VARIANT}"
        )))
        .bind(run_id)
        .bind(test_case_ids)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("reading cases' results"))
    }
}
