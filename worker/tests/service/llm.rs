//! The fleet's model-call state on the real PostgreSQL: the response cache (round trip, expiry,
//! a hit sends no request) and the rate limiter shared by several workers (two limiters on
//! one database never grant more than the requests-per-minute limit in a window together; a
//! database error lets the call through), and the links of cached answers to the runs that
//! stored or were served them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use skilleval_infra::store::llm::{PgRateLimiter, PgResponseCache, Reservation, WriteBehindCache};
use skilleval_infra::store::Store;
use skilleval_providers::{
    ChatRequest, LlmClient, Message, ProviderConfig, ProviderKind, RateLimiter, ResponseCache,
};

use crate::helpers::{Produce, TestEnv};

async fn chat(State(calls): State<Arc<AtomicUsize>>, Json(_body): Json<Value>) -> Json<Value> {
    let n = calls.fetch_add(1, Ordering::SeqCst);
    Json(json!({
        "id": "c1",
        "model": "mock-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("answer {n}")}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2}
    }))
}

#[tokio::test]
async fn the_postgres_cache_round_trips_and_a_hit_sends_no_request() {
    let env = TestEnv::new().await;
    let cache = PgResponseCache::new(env.store.pool().clone());
    assert_eq!(cache.get("k1").await, None, "a miss");
    let value = json!({"text": "hello", "model": "m", "usage": {}});
    cache.put("k1", &value).await;
    assert_eq!(cache.get("k1").await, Some(value.clone()));
    let newer = json!({"text": "again", "model": "m"});
    cache.put("k1", &newer).await;
    assert_eq!(cache.get("k1").await, Some(newer), "a put replaces");
    let (model,): (Option<String>,) =
        sqlx::query_as("SELECT model FROM llm_cache WHERE key = 'k1'")
            .fetch_one(env.store.pool())
            .await
            .expect("row");
    assert_eq!(model.as_deref(), Some("m"));

    // An expired entry is a miss.
    let short = PgResponseCache::new(env.store.pool().clone()).with_ttl(Some(Duration::ZERO));
    short.put("k2", &value).await;
    assert_eq!(short.get("k2").await, None);

    // Through a client: the second equal request is answered from Postgres.
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let config = ProviderConfig {
        base_url: format!("http://{addr}/v1"),
        ..ProviderConfig::new("mock", ProviderKind::Openai, "mock-model")
    };
    let shared: Arc<dyn ResponseCache> = Arc::new(PgResponseCache::new(env.store.pool().clone()));
    // Two clients, as on two workers, sharing the one database.
    let first = LlmClient::new(config.clone(), None)
        .expect("client")
        .with_cache(shared.clone());
    let second = LlmClient::new(config, None)
        .expect("client")
        .with_cache(shared);
    let req = ChatRequest {
        messages: vec![Message::user("Say hello")],
        ..ChatRequest::default()
    };
    let a = first.chat(&req).await.expect("first call");
    assert!(!a.cached);
    let b = second.chat(&req).await.expect("second call");
    assert!(b.cached, "served from the Postgres cache");
    assert_eq!(a.text, b.text);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a hit sends no request");
    server.abort();
}

/// Seconds left in the current 60 s window, on the database's clock.
async fn seconds_left_in_window(store: &Store) -> f64 {
    let (left,): (f64,) =
        sqlx::query_as("SELECT (60 - mod(extract(epoch FROM now()), 60))::float8")
            .fetch_one(store.pool())
            .await
            .expect("clock");
    left
}

#[tokio::test]
async fn two_limiters_on_one_database_never_grant_more_than_the_rpm_together() {
    let env = TestEnv::new().await;
    const RPM: u32 = 5;
    let limits = HashMap::from([("p".to_string(), (Some(RPM), None))]);
    // Two workers: their own pools, one database.
    let a = Store::connect_url(&env.db_url, 3).await.expect("pool a");
    let b = Store::connect_url(&env.db_url, 3).await.expect("pool b");
    let limiters = [
        Arc::new(PgRateLimiter::new(a.pool().clone(), limits.clone())),
        Arc::new(PgRateLimiter::new(b.pool().clone(), limits)),
    ];
    // Stay inside one window: start early in it.
    let left = seconds_left_in_window(&env.store).await;
    if left < 8.0 {
        tokio::time::sleep(Duration::from_secs_f64(left + 0.2)).await;
    }

    let granted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for limiter in &limiters {
        for _ in 0..8 {
            let limiter = limiter.clone();
            let granted = granted.clone();
            tasks.push(tokio::spawn(async move {
                // The caller's deadline bounds the wait for the next window.
                if tokio::time::timeout(Duration::from_secs(3), limiter.acquire("p", 100))
                    .await
                    .is_ok()
                {
                    granted.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(
        granted.load(Ordering::SeqCst),
        RPM as usize,
        "16 callers on two workers, {RPM} per minute: exactly {RPM} granted in the window"
    );
    let rows: Vec<(i32,)> =
        sqlx::query_as("SELECT requests FROM provider_rate_windows WHERE provider = 'p'")
            .fetch_all(env.store.pool())
            .await
            .expect("windows");
    assert_eq!(rows, vec![(5,)], "one window, at the limit");
    assert!(matches!(
        limiters[0].try_reserve("p", 1).await.expect("reserve"),
        Reservation::Full(wait) if wait <= Duration::from_secs(61)
    ));
    // A provider without limits is not counted.
    limiters[1].acquire("other", 1_000_000).await;
    assert_eq!(limiters[1].prune(1).await.expect("prune"), 0);
}

#[tokio::test]
async fn the_limiter_counts_tokens_and_a_database_error_lets_the_call_through() {
    let env = TestEnv::new().await;
    let left = seconds_left_in_window(&env.store).await;
    if left < 5.0 {
        tokio::time::sleep(Duration::from_secs_f64(left + 0.2)).await;
    }
    let limiter = PgRateLimiter::new(
        env.store.pool().clone(),
        HashMap::from([("p".to_string(), (None, Some(1_000)))]),
    );
    sqlx::query(
        "INSERT INTO provider_rate_windows (provider, window_start, requests, tokens)
         VALUES ('p', now() - interval '1 hour', 3, 3)",
    )
    .execute(env.store.pool())
    .await
    .expect("an old window");
    assert_eq!(
        limiter.try_reserve("p", 600).await.expect("r1"),
        Reservation::Granted
    );
    // Opening a window prunes the old ones (in the background).
    let mut old_windows = 1;
    for _ in 0..600 {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM provider_rate_windows WHERE window_start < now() - interval '30 minutes'",
        )
        .fetch_one(env.store.pool())
        .await
        .expect("count");
        old_windows = n;
        if n == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        old_windows, 0,
        "old windows are pruned (hang guard: waited up to 30 s)"
    );
    assert!(matches!(
        limiter.try_reserve("p", 600).await.expect("r2"),
        Reservation::Full(_)
    ));
    assert_eq!(
        limiter.try_reserve("p", 400).await.expect("r3"),
        Reservation::Granted
    );

    // Postgres gone: the call goes ahead rather than stalling the fleet.
    let pool = Store::connect_url(&env.db_url, 1).await.expect("pool");
    let broken = PgRateLimiter::new(
        pool.pool().clone(),
        HashMap::from([("p".to_string(), (Some(1), None))]),
    );
    pool.pool().close().await;
    tokio::time::timeout(Duration::from_secs(30), broken.acquire("p", 1))
        .await
        .expect("hang guard: a database error blocked the caller for 30 s");
}

#[tokio::test]
async fn the_write_behind_cache_stores_every_answer_in_batches_the_last_put_winning() {
    let env = TestEnv::new().await;
    let cache = WriteBehindCache::start(PgResponseCache::new(env.store.pool().clone()))
        .expect("inside a runtime");
    // One key put twice at once (the same batch: a statement that wrote it twice would fail
    // and drop the whole batch), then more than one batch (256) of others, one of them put again
    // later: the last answer wins either way.
    cache.put("wb-dup", &json!({"text": "first"})).await;
    cache.put("wb-dup", &json!({"text": "second"})).await;
    // An answer holding the NUL character (`jsonb` refuses it) is not cached, and does not
    // cost its batch the others.
    cache.put("wb-nul", &json!({"text": "a\0b"})).await;
    for i in 0..300 {
        cache
            .put(
                &format!("wb-{i}"),
                &json!({"text": format!("answer {i}"), "model": "m"}),
            )
            .await;
    }
    cache
        .put("wb-7", &json!({"text": "newer", "model": "m"}))
        .await;
    let stored = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM llm_cache WHERE key LIKE 'wb-%'")
            .fetch_one(env.store.pool())
            .await
            .expect("count")
    };
    // The deadline only guards against a hang: the writes follow within milliseconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while stored().await < 301 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(stored().await, 301, "every answer stored once");
    assert_eq!(cache.get("wb-dup").await, Some(json!({"text": "second"})));
    assert_eq!(
        cache.get("wb-nul").await,
        None,
        "an answer with NUL is not cached"
    );
    assert_eq!(
        cache.get("wb-299").await,
        Some(json!({"text": "answer 299", "model": "m"}))
    );
    assert_eq!(
        cache.get("wb-7").await,
        Some(json!({"text": "newer", "model": "m"})),
        "the last put wins"
    );
    let (model,): (Option<String>,) =
        sqlx::query_as("SELECT model FROM llm_cache WHERE key = 'wb-0'")
            .fetch_one(env.store.pool())
            .await
            .expect("row");
    assert_eq!(model.as_deref(), Some("m"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_lookups_share_statements_and_each_gets_its_own_answer() {
    let env = TestEnv::new().await;
    let pool = env.store.pool().clone();
    // Stored directly, so the lookups below are the only statements the cache sends.
    let seed = PgResponseCache::new(pool.clone());
    for i in (0..300).step_by(2) {
        seed.put(&format!("lk-{i}"), &json!({"text": format!("answer {i}")}))
            .await;
    }
    PgResponseCache::new(pool.clone())
        .with_ttl(Some(Duration::ZERO))
        .put("lk-expired", &json!({"text": "stale"}))
        .await;

    let cache =
        Arc::new(WriteBehindCache::start(PgResponseCache::new(pool)).expect("inside a runtime"));
    // 300 lookups at once (every even key stored, every odd one not), one key asked twice,
    // and an expired entry.
    let mut keys: Vec<String> = (0..300).map(|i| format!("lk-{i}")).collect();
    keys.push("lk-10".into());
    keys.push("lk-expired".into());
    let answers = futures::future::join_all(keys.iter().map(|key| {
        let cache = cache.clone();
        async move { cache.get(key).await }
    }))
    .await;
    for (key, answer) in keys.iter().zip(&answers) {
        let i: Option<usize> = key.strip_prefix("lk-").and_then(|n| n.parse().ok());
        let expected = match i {
            Some(i) if i % 2 == 0 => Some(json!({"text": format!("answer {i}")})),
            _ => None,
        };
        assert_eq!(answer, &expected, "the answer for {key}");
    }
    let statements = cache.lookup_statements();
    assert!(
        (1..keys.len() as u64).contains(&statements),
        "{} lookups at once took {statements} statements",
        keys.len()
    );

    // A lone lookup waits for no batch: one statement of its own.
    assert_eq!(cache.get("lk-4").await, Some(json!({"text": "answer 4"})));
    assert_eq!(cache.lookup_statements(), statements + 1);
}

/// The runs `key` is linked to in `llm_cache_uses`, sorted.
async fn runs_linked_to(pool: &sqlx::PgPool, key: &str) -> Vec<uuid::Uuid> {
    sqlx::query_scalar("SELECT run_id FROM llm_cache_uses WHERE key = $1 ORDER BY run_id")
        .bind(key)
        .fetch_all(pool)
        .await
        .expect("links")
}

async fn stored(pool: &sqlx::PgPool, key: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM llm_cache WHERE key = $1)")
        .bind(key)
        .fetch_one(pool)
        .await
        .expect("exists")
}

/// Waits until `probe` holds (the write-behind cache writes a few milliseconds after `put`);
/// the 30 s deadline only guards against a hang.
async fn eventually_true<F, Fut>(what: &str, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !probe().await {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: still not after 30 s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn answers_are_linked_to_the_runs_that_stored_or_were_served_them() {
    use skilleval_providers::CacheOwner;
    let env = TestEnv::new().await;
    let pool = env.store.pool().clone();
    let first = env
        .seed_run(1, &Produce::Given { fail_every: 0 })
        .await
        .run_id;
    let second = env
        .seed_run(1, &Produce::Given { fail_every: 0 })
        .await
        .run_id;
    let mut both = vec![first, second];
    both.sort();
    let behind =
        WriteBehindCache::start(PgResponseCache::new(pool.clone())).expect("inside a runtime");
    let inline = PgResponseCache::new(pool.clone());

    // Stored inside a run's scope: linked to it. Outside any: no link.
    CacheOwner { run_id: first }
        .scope(behind.put("owned", &json!({"text": "a"})))
        .await;
    behind.put("unowned", &json!({"text": "b"})).await;
    eventually_true("both answers stored", || async {
        stored(&pool, "owned").await && stored(&pool, "unowned").await
    })
    .await;
    eventually_true("the owned answer linked", || async {
        runs_linked_to(&pool, "owned").await == vec![first]
    })
    .await;
    assert_eq!(
        runs_linked_to(&pool, "unowned").await,
        Vec::<uuid::Uuid>::new()
    );

    // Served inside another run's scope: linked to that run too (written behind, or inline
    // by the plain cache). A miss links nothing.
    let hit = CacheOwner { run_id: second }
        .scope(behind.get("owned"))
        .await;
    assert_eq!(hit, Some(json!({"text": "a"})));
    eventually_true("the hit linked to the second run", || async {
        runs_linked_to(&pool, "owned").await == both
    })
    .await;
    let miss = CacheOwner { run_id: second }
        .scope(inline.get("nowhere"))
        .await;
    assert_eq!(miss, None);
    assert_eq!(
        runs_linked_to(&pool, "nowhere").await,
        Vec::<uuid::Uuid>::new()
    );
    let hit = CacheOwner { run_id: first }
        .scope(inline.get("unowned"))
        .await;
    assert_eq!(hit, Some(json!({"text": "b"})));
    assert_eq!(runs_linked_to(&pool, "unowned").await, vec![first]);

    // A run deleted while its job was still calling the model: its answer is not stored (it
    // would outlive the deletion), nor linked; an equal answer of a live run in the same batch
    // still is.
    let deleted = uuid::Uuid::now_v7();
    CacheOwner { run_id: deleted }
        .scope(behind.put("late", &json!({"text": "gone"})))
        .await;
    CacheOwner { run_id: second }
        .scope(behind.put("shared-late", &json!({"text": "kept"})))
        .await;
    CacheOwner { run_id: deleted }
        .scope(behind.put("shared-late", &json!({"text": "dropped"})))
        .await;
    CacheOwner { run_id: deleted }
        .scope(inline.put("late-inline", &json!({"text": "gone"})))
        .await;
    eventually_true("the live run's answer stored", || async {
        stored(&pool, "shared-late").await
    })
    .await;
    assert!(
        !stored(&pool, "late").await,
        "an answer of a deleted run was stored"
    );
    assert!(!stored(&pool, "late-inline").await);
    assert_eq!(
        behind.get("shared-late").await,
        Some(json!({"text": "kept"})),
        "the live run's answer, not the deleted one's"
    );
    assert_eq!(runs_linked_to(&pool, "shared-late").await, vec![second]);
    let dangling: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM llm_cache_uses WHERE run_id NOT IN (SELECT id FROM runs)",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(dangling, 0);
}
