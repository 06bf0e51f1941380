//! Graceful shutdown: requests in flight are answered, new connections are
//! not accepted, readiness goes first, everything stops.

use std::time::Duration;

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
    until_metric("3 queued", &handle, "pmstate_queue_depth", 3.0).await;

    handle.shutdown();
    until("draining", || s.events.all().iter().any(|e| matches!(e, Event::Draining { .. }))).await;
    // no new connections once draining (the listener closes soon after the
    // event; a slow machine may take a while: the watchdog is generous)
    let addr = s.addr;
    let start = std::time::Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(start.elapsed() < WATCHDOG, "still accepting connections while draining");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_outlasts_the_drain_timeout_does_not_hold_the_shutdown() {
    let mut opts = options(testdata("smpl_tracker").join("last.ckpt"));
    opts.limits.drain_timeout = Duration::from_millis(300);
    // the stalled body is not cut off before the drain times out
    opts.limits.body_stall_timeout = WATCHDOG;
    let s = start(opts).await;
    let handle = s.server.handle();
    // a client that stalls mid-body (its body timeouts are far off)
    let (body, _) = row_request(&obs("smpl_tracker"), &[0], json!({}));
    let _stalled = Held::start(s.addr, &body).await;
    until_metric("the request in flight", &handle, "pmstate_requests_in_flight", 1.0).await;
    handle.shutdown();
    // wait returns: the drain was cut short, the batcher and reload thread stopped
    tokio::time::timeout(WATCHDOG, s.server.wait()).await.expect("a shutdown within the watchdog").unwrap();
    let ev = s.events.all();
    let timed_out: Vec<_> = ev.iter().filter(|e| matches!(e, Event::DrainTimedOut { .. })).collect();
    assert!(matches!(timed_out[..], [Event::DrainTimedOut { seconds }] if *seconds == 0.3), "{ev:?}");
    assert!(matches!(ev.last(), Some(Event::Stopped)), "{ev:?}");
    // (the stalled connection's task ends with the runtime: `pmstate serve` exits, closing it)
}
