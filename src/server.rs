//! Serving HTTP with bounds on slow, idle and numerous clients: hyper's
//! connection loop with a timer, so a client that has not sent its request
//! head within the header-read timeout is disconnected (hyper starts that
//! timer whenever it waits for a head, so a keep-alive connection left idle
//! closes after it too); at most `max_connections` connections at once, the
//! next ones closed as they are accepted; and, on shutdown, a graceful end
//! like `axum::serve`'s: no new connections, in-flight requests finish.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tower::ServiceExt;

/// The bounds the server keeps.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// A request head (and the next one on a kept-alive connection) must
    /// arrive within this long.
    pub header_read_timeout: Duration,
    /// Open connections at most; more are closed as soon as they are accepted.
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `shutdown` completes, then lets the
/// requests in flight finish (the caller bounds how long it waits).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    // Every connection task holds a receiver; when all are dropped, every
    // connection has ended.
    let (done_tx, done_rx) = watch::channel(());
    let slots = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let mut stopping = stop_rx.clone();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopping.wait_for(|stop| *stop) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                // Out of file descriptors, say: wait a little instead of spinning.
                tracing::warn!(error = %err, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!(
                max = options.max_connections,
                "connection limit reached; closing a new connection"
            );
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = router
            .clone()
            .map_request(|request: Request<Incoming>| request.map(Body::new));
        let service = TowerToHyperService::new(service);
        let mut stop = stop_rx.clone();
        let done = done_rx.clone();
        tokio::spawn(async move {
            // HTTP/1 only: the auto-detecting builder waits for a new
            // connection's first bytes with no timer, so a socket that sends
            // nothing would stay open forever.
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(options.header_read_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service).with_upgrades();
            tokio::pin!(conn);
            let mut draining = false;
            loop {
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(err) = result {
                            tracing::debug!(error = %err, "connection ended with an error");
                        }
                        break;
                    }
                    _ = stop.wait_for(|stop| *stop), if !draining => {
                        draining = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(slot);
            drop(done);
        });
    }
    drop(listener);
    drop(done_rx);
    done_tx.closed().await;
    Ok(())
}
