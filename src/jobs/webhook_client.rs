//! One webhook attempt over the wire, bounded whatever the receiver does: the
//! host name is resolved once, every address is checked against the allow
//! list (public, or named there explicitly), and the connection goes to a
//! checked address and nowhere else, so a DNS answer that changes between
//! the check and the connection (rebinding) cannot send it elsewhere. The
//! answer's head is bounded by hyper's buffer and at most `ANSWER_BYTES` of
//! its body are read; the rest is dropped with the connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::ledger::allow_hosts::{AllowHosts, TargetHost, WebhookTarget};

/// The most bytes of an answer's body read (then the connection is closed).
pub const ANSWER_BYTES: usize = 4 * 1024;

/// The largest answer head, and read buffer, one attempt holds (hyper's
/// minimum is 8 KiB): an answer with a bigger head fails the attempt.
const ANSWER_BUFFER_BYTES: usize = 16 * 1024;

/// Resolves a webhook host name at send time; tests inject their own.
pub trait Resolve: Send + Sync + std::fmt::Debug {
    /// The addresses `host` has now, each with `port`.
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>>;
}

/// The system's resolver (`getaddrinfo`, through tokio).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// The addresses of `target` the sender may connect to: its literal address
/// (the allow list named it), or what its name resolves to now, keeping
/// only the public ones and those the allow list names. None left: the
/// error says why.
pub async fn checked_addresses(
    target: &WebhookTarget,
    allow: &AllowHosts,
    resolver: &dyn Resolve,
) -> Result<Vec<SocketAddr>, String> {
    let name = match &target.host {
        TargetHost::Address(ip) => return Ok(vec![SocketAddr::new(*ip, target.port)]),
        TargetHost::Name(name) => name,
    };
    let resolved = resolver
        .resolve(name, target.port)
        .await
        .map_err(|e| format!("resolving {name}: {e}"))?;
    let mut refused = None;
    let mut addresses = Vec::new();
    for address in resolved {
        // The port is the URL's, whatever the resolver said.
        let address = SocketAddr::new(address.ip(), target.port);
        match allow.may_connect(address.ip(), target.port) {
            Ok(()) if !addresses.contains(&address) => addresses.push(address),
            Ok(()) => {}
            Err(why) => refused = refused.or(Some(why)),
        }
    }
    if addresses.is_empty() {
        return Err(match refused {
            Some(why) => format!("{name}: {why}"),
            None => format!("{name} resolves to no address"),
        });
    }
    Ok(addresses)
}

/// A connector that ignores the host of the URI it is given and connects to
/// the checked addresses, in order: TLS still verifies the URL's host name.
#[derive(Debug, Clone)]
struct Pinned(Arc<[SocketAddr]>);

impl tower::Service<Uri> for Pinned {
    type Response = TokioIo<TcpStream>;
    type Error = std::io::Error;
    type Future = BoxFuture<'static, std::io::Result<TokioIo<TcpStream>>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let addresses = Arc::clone(&self.0);
        Box::pin(async move {
            let mut last = None;
            for address in addresses.iter() {
                match TcpStream::connect(address).await {
                    Ok(stream) => {
                        let _ = stream.set_nodelay(true);
                        return Ok(TokioIo::new(stream));
                    }
                    Err(err) => last = Some(std::io::Error::new(err.kind(), format!("{address}: {err}"))),
                }
            }
            Err(last.unwrap_or_else(|| std::io::Error::other("no address to connect to")))
        })
    }
}

/// `POST`s `body` with `headers` to `target` over a fresh connection to one
/// of `addresses`; the answer's status, or why there was none. The caller
/// bounds how long it takes.
pub async fn post(
    target: &WebhookTarget,
    addresses: Vec<SocketAddr>,
    headers: &[(&'static str, String)],
    body: String,
) -> Result<u16, String> {
    let uri: Uri = target.url.as_str().parse().map_err(|e| format!("request: {e}"))?;
    let mut connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .wrap_connector(Pinned(addresses.into()));
    let io = tower::Service::call(&mut connector, uri)
        .await
        .map_err(|e| format!("connection: {}", super::webhooks::chain(e.as_ref())))?;
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(ANSWER_BUFFER_BYTES)
        .handshake::<_, Full<Bytes>>(io)
        .await
        .map_err(|e| format!("connection: {}", super::webhooks::chain(&e)))?;
    let mut request =
        hyper::Request::post(target.path_and_query.as_str()).header(hyper::header::HOST, &target.authority);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let request = request
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("request: {e}"))?;
    let exchange = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("connection: {}", super::webhooks::chain(&e)))?;
        let status = response.status().as_u16();
        // A little of the answer is read, so a receiver that sends a short
        // body finishes writing it; past `ANSWER_BYTES` the rest is dropped
        // with the connection, unread.
        let mut answer = response.into_body();
        let mut read = 0;
        while read < ANSWER_BYTES {
            match answer.frame().await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
                _ => break,
            }
        }
        Ok(status)
    };
    // The connection is driven beside the exchange and dropped (closed) with
    // it; once it ends, the exchange has its answer or its error.
    let driven = async move {
        let _ = connection.await;
        std::future::pending::<()>().await
    };
    tokio::select! {
        answered = exchange => answered,
        () = driven => Err("connection: closed".to_owned()),
    }
}
