//! The coordinator's periodic sweep deletes expired model answers from `llm_cache`, and only
//! those.

use std::time::{Duration, Instant};

use crate::helpers::{spawn_app_with, AppOptions};

async fn cache_keys(pool: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT key FROM llm_cache ORDER BY key")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_sweep_deletes_expired_model_answers_and_keeps_the_rest() {
    let app = spawn_app_with(AppOptions {
        background: true,
        sweep_interval_secs: 1,
        ..AppOptions::default()
    })
    .await;
    sqlx::query(
        "INSERT INTO llm_cache (key, response, expires_at) VALUES
           ('expired-1', '{}', now() - interval '1 minute'),
           ('expired-2', '{}', now() - interval '1 day'),
           ('fresh', '{}', now() + interval '1 hour'),
           ('forever', '{}', NULL)",
    )
    .execute(&app.pool)
    .await
    .unwrap();

    let start = Instant::now();
    while cache_keys(&app.pool).await.len() > 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "hang guard: expired rows still there after 60 s: {:?}",
            cache_keys(&app.pool).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(cache_keys(&app.pool).await, vec!["forever", "fresh"]);
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("skilleval_coordinator_llm_cache_expired_total 2"),
        "{metrics}"
    );
}
