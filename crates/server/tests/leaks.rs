//! Many create/step/close cycles leave no sessions and no file descriptors
//! behind. Alone in its binary, not in `tests/server/`: it counts the
//! process's descriptors, and other tests would open some meanwhile.

#[path = "server/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{open_fds, start, test_config, Api};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_cycles_leave_no_sessions_or_descriptors() {
    let server = start(test_config()).await;
    let fds_before = open_fds();
    let sessions_before = server.live_sessions();
    {
        let api = Api::new(&server);
        let mut tasks = tokio::task::JoinSet::new();
        // 16 workers x 625 cycles = 10,000 create/step/close cycles.
        for w in 0..16u64 {
            let api = api.clone();
            tasks.spawn(async move {
                for i in 0..625u64 {
                    let (_, v) = api
                        .create(json!({"env": "counter", "seed": w * 1000 + i}))
                        .await;
                    let id = v["id"].as_u64().unwrap();
                    let (s, _) = api.step(id, "inc").await;
                    assert_eq!(s, 200);
                    let (s, _) = api.post("/close", json!({"id": id})).await;
                    assert_eq!(s, 200);
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        assert_eq!(server.live_sessions(), sessions_before);
    }
    // The client is dropped: its pooled connections close, and the server's
    // ends close when they see EOF.
    let deadline = Instant::now() + Duration::from_secs(5);
    while open_fds() > fds_before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(open_fds(), fds_before, "file descriptors leaked");
    server.shutdown().await.unwrap();
}
