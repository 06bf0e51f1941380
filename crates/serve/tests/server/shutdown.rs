//! Graceful shutdown: requests in flight are answered, new connections are
//! not accepted, readiness goes first, everything stops.

use crate::common::*;
use pmstate_serve::Event;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_the_requests_in_flight() {
    let s = start_variant("smpl_tracker").await;
    let handle = s.server.handle();
    let o = obs("smpl_tracker");
    let paused = handle.pause();
    let mut waiting = vec![];
    for i in 0..3 {
        let (c, (body, _)) = (s.client.clone(), row_request(&o, &[i], json!({})));
        waiting.push(tokio::spawn(async move { infer(&c, body).await }));
    }
    until("3 queued", || metric(&handle.metrics_text(), "pmstate_queue_depth") == 3.0).await;

    handle.shutdown();
    until("draining", || s.events.all().iter().any(|e| matches!(e, Event::Draining))).await;
    // no new connections once draining
    let addr = s.addr;
    let mut refused = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(refused, "still accepting connections while draining");

    // the requests in flight are answered
    drop(paused);
    for w in waiting {
        let r = w.await.unwrap();
        assert_eq!(outputs(&r)["mean_action"].0, [1, 69]);
    }
    s.server.wait().await.unwrap();
    let ev = s.events.all();
    assert!(matches!(ev.last(), Some(Event::Stopped)), "{ev:?}");
    assert!(!ev.iter().any(|e| matches!(e, Event::DrainTimedOut { .. })));
}
