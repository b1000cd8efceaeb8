//! The two lists of the API, `GET /v1/skills` and `GET /v1/runs`: filtered, sorted and
//! keyset-paginated in SQL, scoped to the viewer's publisher. A page starts after a [`Keyset`]
//! (the last row's sort key and id), so a page boundary that falls among equal sort keys
//! neither repeats nor skips a row: the id breaks every tie, in the same direction as the key.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Postgres, Row};
use uuid::Uuid;

use super::lifecycle::{RunKind, RunStatus};
use super::runs::Counters;
use super::tenancy::Viewer;
use super::{Store, StoreError};

/// Ascending or descending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortOrder {
    Asc,
    Desc,
}

impl SortOrder {
    fn sql(self) -> &'static str {
        match self {
            SortOrder::Asc => "ASC",
            SortOrder::Desc => "DESC",
        }
    }

    /// The row comparison that takes the rows after a keyset in this order.
    fn after(self) -> &'static str {
        match self {
            SortOrder::Asc => ">",
            SortOrder::Desc => "<",
        }
    }
}

/// A sort key's value, as a page's last row had it.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyValue {
    Text(String),
    Time(DateTime<Utc>),
    Number(f64),
}

/// Where a page starts: after the row with this sort key and id.
#[derive(Debug, Clone, PartialEq)]
pub struct Keyset {
    pub key: KeyValue,
    pub id: Uuid,
}

/// What the skills list sorts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkillSortKey {
    Name,
    /// When the skill was first uploaded.
    Created,
    /// When its latest version was uploaded.
    Updated,
    /// Its latest version's latest finished run's pass rate (none: -1, below every rate).
    PassRate,
}

impl SkillSortKey {
    /// The sort key's expression over the `listed` rows.
    fn expr(self) -> &'static str {
        match self {
            SkillSortKey::Name => "name",
            SkillSortKey::Created => "created_at",
            SkillSortKey::Updated => "updated_at",
            SkillSortKey::PassRate => "COALESCE(pass_rate, -1)",
        }
    }
}

/// The verdict filter of the skills list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerdictFilter {
    Pass,
    Fail,
    /// No finished run yet.
    None,
}

/// The skills list's filters, sort and page.
#[derive(Debug, Clone)]
pub struct SkillQuery {
    /// Words found in the name or the latest version's description (case-insensitive).
    pub search: Option<String>,
    /// The latest version's profile.
    pub profile: Option<String>,
    /// The latest version's verdict (its latest finished upload or manual run).
    pub verdict: Option<VerdictFilter>,
    /// A model some version's definition names.
    pub model: Option<String>,
    pub sort: SkillSortKey,
    pub order: SortOrder,
    pub after: Option<Keyset>,
    pub limit: i64,
}

/// One skill of the list, with its latest version and that version's latest verdict.
#[derive(Debug, Clone)]
pub struct SkillItem {
    pub skill_id: Uuid,
    pub name: String,
    pub description: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub versions: i64,
    pub latest_version_id: Uuid,
    pub latest_version: String,
    pub profile: String,
    pub models: Vec<String>,
    pub latest_run_id: Option<Uuid>,
    pub verdict: Option<String>,
    pub pass_rate: Option<f64>,
    /// The row's sort key, for the next page's cursor.
    pub key: KeyValue,
}

/// What the runs list sorts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunSortKey {
    Created,
    /// The summary's mean score (a run not finished: -1, below every score).
    Score,
}

impl RunSortKey {
    fn expr(self) -> &'static str {
        match self {
            RunSortKey::Created => "r.created_at",
            RunSortKey::Score => "COALESCE((r.summary->>'mean')::float8, -1)",
        }
    }
}

/// A version filter of the runs list: by id, or by label (within the `skill` filter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionFilter {
    Id(Uuid),
    Label(String),
}

/// The runs list's filters, sort and page.
#[derive(Debug, Clone)]
pub struct RunQuery {
    pub skill: Option<String>,
    pub version: Option<VersionFilter>,
    pub status: Option<RunStatus>,
    pub kind: Option<RunKind>,
    /// Finished runs with this verdict.
    pub verdict: Option<String>,
    /// Created at or after.
    pub created_after: Option<DateTime<Utc>>,
    /// Created before.
    pub created_before: Option<DateTime<Utc>>,
    pub sort: RunSortKey,
    pub order: SortOrder,
    pub after: Option<Keyset>,
    pub limit: i64,
}

/// One run of the list.
#[derive(Debug, Clone)]
pub struct RunItem {
    pub run_id: Uuid,
    pub skill: String,
    pub version_id: Uuid,
    pub version: String,
    pub kind: String,
    pub status: String,
    pub verdict: Option<String>,
    pub counters: Counters,
    /// The summary's mean score, once finished.
    pub score: Option<f64>,
    pub pass_rate: Option<f64>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub key: KeyValue,
}

/// `%`, `_` and `\` taken literally in an `ILIKE` pattern.
fn like_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The keyset condition on `key` and `id` (`$n` is the key's bind, `$n+1` the id's), or
/// `true` on the first page.
fn keyset_condition(
    after: Option<&Keyset>,
    key: &str,
    id: &str,
    order: SortOrder,
    n: usize,
) -> String {
    match after {
        None => "true".to_string(),
        Some(k) => {
            let cast = match k.key {
                KeyValue::Text(_) => "text",
                KeyValue::Time(_) => "timestamptz",
                KeyValue::Number(_) => "float8",
            };
            format!(
                "({key}, {id}) {} (${n}::{cast}, ${}::uuid)",
                order.after(),
                n + 1
            )
        }
    }
}

type Query<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;

fn bind_keyset<'q>(query: Query<'q>, after: Option<&Keyset>) -> Query<'q> {
    match after {
        None => query,
        Some(k) => {
            let query = match &k.key {
                KeyValue::Text(s) => query.bind(s.clone()),
                KeyValue::Time(t) => query.bind(*t),
                KeyValue::Number(n) => query.bind(*n),
            };
            query.bind(k.id)
        }
    }
}

fn key_of(row: &PgRow, index: usize, like: &KeyValue) -> Result<KeyValue, sqlx::Error> {
    Ok(match like {
        KeyValue::Text(_) => KeyValue::Text(row.try_get(index)?),
        KeyValue::Time(_) => KeyValue::Time(row.try_get(index)?),
        KeyValue::Number(_) => KeyValue::Number(row.try_get(index)?),
    })
}

fn skill_key_kind(sort: SkillSortKey) -> KeyValue {
    match sort {
        SkillSortKey::Name => KeyValue::Text(String::new()),
        SkillSortKey::Created | SkillSortKey::Updated => KeyValue::Time(DateTime::UNIX_EPOCH),
        SkillSortKey::PassRate => KeyValue::Number(0.0),
    }
}

async fn list_skills(
    pool: &PgPool,
    viewer: Viewer,
    q: &SkillQuery,
) -> Result<Vec<SkillItem>, sqlx::Error> {
    let key = q.sort.expr();
    let dir = q.order.sql();
    let keyset = keyset_condition(q.after.as_ref(), key, "skill_id", q.order, 6);
    let verdict = match q.verdict {
        None => "true",
        Some(VerdictFilter::Pass) => "verdict = 'pass'",
        Some(VerdictFilter::Fail) => "verdict = 'fail'",
        Some(VerdictFilter::None) => "verdict IS NULL",
    };
    // One row per visible skill: its latest version (by upload time) and that version's
    // latest finished upload or manual run. Filters and the keyset apply to these rows.
    let sql = format!(
        "WITH listed AS (
             SELECT s.id AS skill_id, s.name, s.created_at,
                    lv.id AS version_id, lv.version, lv.description, lv.created_at AS updated_at,
                    c.profile,
                    (SELECT count(*) FROM skill_versions v WHERE v.skill_id = s.id) AS versions,
                    (SELECT COALESCE(array_agg(DISTINCT m ORDER BY m), '{{}}')
                     FROM skill_versions v, unnest(v.models) m WHERE v.skill_id = s.id) AS models,
                    lr.id AS run_id, lr.verdict, (lr.summary->>'pass_rate')::float8 AS pass_rate
             FROM skills s
             JOIN LATERAL (
                 SELECT v.id, v.version, v.description, v.created_at FROM skill_versions v
                 WHERE v.skill_id = s.id ORDER BY v.created_at DESC, v.id DESC LIMIT 1
             ) lv ON true
             JOIN eval_configs c ON c.version_id = lv.id
             LEFT JOIN LATERAL (
                 SELECT r.id, r.verdict, r.summary FROM runs r
                 WHERE r.version_id = lv.id AND r.finalised AND r.kind IN ('upload', 'manual')
                 ORDER BY r.finished_at DESC NULLS LAST, r.id DESC LIMIT 1
             ) lr ON true
             WHERE ($1::uuid IS NULL OR s.publisher_id = $1)
         )
         SELECT skill_id, name, description, created_at, updated_at, versions, version_id,
                version, profile, models, run_id, verdict, pass_rate, {key} AS sort_key
         FROM listed
         WHERE ($2::text IS NULL OR name ILIKE '%' || $2 || '%' OR description ILIKE '%' || $2 || '%')
           AND ($3::text IS NULL OR profile = $3)
           AND ($4::text IS NULL OR $4 = ANY(models))
           AND {verdict}
           AND {keyset}
         ORDER BY {key} {dir}, skill_id {dir}
         LIMIT $5"
    );
    let query = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(viewer.filter())
        .bind(q.search.as_deref().map(like_literal))
        .bind(q.profile.as_deref())
        .bind(q.model.as_deref())
        .bind(q.limit);
    let rows = bind_keyset(query, q.after.as_ref()).fetch_all(pool).await?;
    let kind = skill_key_kind(q.sort);
    rows.iter()
        .map(|r| {
            Ok(SkillItem {
                skill_id: r.try_get(0)?,
                name: r.try_get(1)?,
                description: r.try_get(2)?,
                created_at: r.try_get(3)?,
                updated_at: r.try_get(4)?,
                versions: r.try_get(5)?,
                latest_version_id: r.try_get(6)?,
                latest_version: r.try_get(7)?,
                profile: r.try_get(8)?,
                models: r.try_get(9)?,
                latest_run_id: r.try_get(10)?,
                verdict: r.try_get(11)?,
                pass_rate: r.try_get(12)?,
                key: key_of(r, 13, &kind)?,
            })
        })
        .collect()
}

async fn list_runs(
    pool: &PgPool,
    viewer: Viewer,
    q: &RunQuery,
) -> Result<Vec<RunItem>, sqlx::Error> {
    let key = q.sort.expr();
    let dir = q.order.sql();
    let keyset = keyset_condition(q.after.as_ref(), key, "r.id", q.order, 11);
    let (version_id, version_label) = match &q.version {
        None => (None, None),
        Some(VersionFilter::Id(id)) => (Some(*id), None),
        Some(VersionFilter::Label(label)) => (None, Some(label.as_str())),
    };
    let sql = format!(
        "SELECT r.id, s.name, r.version_id, v.version, r.kind, r.status,
                CASE WHEN r.finalised THEN r.verdict END,
                r.total, r.completed, r.passed, r.failed, r.errored, r.skipped,
                (r.summary->>'mean')::float8, (r.summary->>'pass_rate')::float8,
                r.created_at, r.finished_at, {key} AS sort_key
         FROM runs r
         JOIN skill_versions v ON v.id = r.version_id
         JOIN skills s ON s.id = v.skill_id
         WHERE ($1::uuid IS NULL OR s.publisher_id = $1)
           AND ($2::text IS NULL OR s.name = $2)
           AND ($3::uuid IS NULL OR r.version_id = $3)
           AND ($4::text IS NULL OR v.version = $4)
           AND ($5::text IS NULL OR r.status = $5)
           AND ($6::text IS NULL OR r.kind = $6)
           AND ($7::text IS NULL OR (r.finalised AND r.verdict = $7))
           AND ($8::timestamptz IS NULL OR r.created_at >= $8)
           AND ($9::timestamptz IS NULL OR r.created_at < $9)
           AND {keyset}
         ORDER BY {key} {dir}, r.id {dir}
         LIMIT $10"
    );
    let query = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(viewer.filter())
        .bind(q.skill.as_deref())
        .bind(version_id)
        .bind(version_label)
        .bind(q.status.map(RunStatus::as_str))
        .bind(q.kind.map(RunKind::as_str))
        .bind(q.verdict.as_deref())
        .bind(q.created_after)
        .bind(q.created_before)
        .bind(q.limit);
    let rows = bind_keyset(query, q.after.as_ref()).fetch_all(pool).await?;
    let kind = match q.sort {
        RunSortKey::Created => KeyValue::Time(DateTime::UNIX_EPOCH),
        RunSortKey::Score => KeyValue::Number(0.0),
    };
    rows.iter()
        .map(|r| {
            Ok(RunItem {
                run_id: r.try_get(0)?,
                skill: r.try_get(1)?,
                version_id: r.try_get(2)?,
                version: r.try_get(3)?,
                kind: r.try_get(4)?,
                status: r.try_get(5)?,
                verdict: r.try_get(6)?,
                counters: Counters {
                    total: r.try_get(7)?,
                    completed: r.try_get(8)?,
                    passed: r.try_get(9)?,
                    failed: r.try_get(10)?,
                    errored: r.try_get(11)?,
                    skipped: r.try_get(12)?,
                },
                score: r.try_get(13)?,
                pass_rate: r.try_get(14)?,
                created_at: r.try_get(15)?,
                finished_at: r.try_get(16)?,
                key: key_of(r, 17, &kind)?,
            })
        })
        .collect()
}

impl Store {
    /// A page of the skills the viewer may see, filtered and sorted.
    #[tracing::instrument(skip_all)]
    pub async fn list_skills(
        &self,
        viewer: Viewer,
        query: &SkillQuery,
    ) -> Result<Vec<SkillItem>, StoreError> {
        list_skills(self.pool(), viewer, query)
            .await
            .map_err(StoreError::query("listing skills"))
    }

    /// A page of the runs the viewer may see, filtered and sorted.
    #[tracing::instrument(skip_all)]
    pub async fn list_runs(
        &self,
        viewer: Viewer,
        query: &RunQuery,
    ) -> Result<Vec<RunItem>, StoreError> {
        list_runs(self.pool(), viewer, query)
            .await
            .map_err(StoreError::query("listing runs"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_is_taken_literally() {
        assert_eq!(like_literal("50%_a\\b"), "50\\%\\_a\\\\b");
    }

    #[test]
    fn the_keyset_follows_the_order() {
        let after = Keyset {
            key: KeyValue::Number(0.5),
            id: Uuid::nil(),
        };
        assert_eq!(
            keyset_condition(Some(&after), "k", "id", SortOrder::Desc, 6),
            "(k, id) < ($6::float8, $7::uuid)"
        );
        assert_eq!(keyset_condition(None, "k", "id", SortOrder::Asc, 6), "true");
    }
}
