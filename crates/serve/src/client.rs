//! A small HTTP/1.1 client over hyper-util's pooled client: what the tests
//! use to talk to a server like any other client; and [`Caller`], one
//! connection without a pool, for the load generator.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{HeaderMap, Request};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// What a request failed on.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Building, connecting, sending or reading the answer failed.
    #[error("request to {url}: {source}")]
    Request {
        /// The URL.
        url: String,
        /// What happened (hyper's or http's error).
        source: BoxError,
    },
    /// No complete answer within the client's timeout.
    #[error("request to {url}: no answer within {seconds} s")]
    Timeout {
        /// The URL.
        url: String,
        /// The timeout.
        seconds: f64,
    },
}

/// An answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON (`Value::Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A keep-alive client for one server.
#[derive(Clone)]
pub struct Client {
    inner: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
    base: String,
    timeout: Option<Duration>,
}

impl Client {
    /// A client of the server at `addr`, without a timeout (the load
    /// generator measures what the server takes, however long).
    pub fn new(addr: SocketAddr) -> Self {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let inner = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(conn);
        Client { inner, base: format!("http://{addr}"), timeout: None }
    }

    /// The same client, giving up on a request (connect, send and the whole
    /// answer) after `timeout` with [`ClientError::Timeout`]: what tests
    /// use, so that a server that hangs fails them instead of hanging them.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<Reply, ClientError> {
        self.send("GET", path, Bytes::new(), &[]).await
    }

    /// `POST path` with `body` and extra headers.
    pub async fn post(
        &self,
        path: &str,
        body: impl Into<Bytes>,
        headers: &[(&str, String)],
    ) -> Result<Reply, ClientError> {
        self.send("POST", path, body.into(), headers).await
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Bytes,
        headers: &[(&str, String)],
    ) -> Result<Reply, ClientError> {
        let url = format!("{}{path}", self.base);
        let exchange = self.exchange(&url, method, body, headers);
        match self.timeout {
            None => exchange.await,
            Some(t) => tokio::time::timeout(t, exchange)
                .await
                .unwrap_or_else(|_| Err(ClientError::Timeout { url: url.clone(), seconds: t.as_secs_f64() })),
        }
    }

    async fn exchange(
        &self,
        url: &str,
        method: &str,
        body: Bytes,
        headers: &[(&str, String)],
    ) -> Result<Reply, ClientError> {
        let err = |e: BoxError| ClientError::Request { url: url.to_owned(), source: e };
        let mut b = Request::builder().method(method).uri(url);
        for (k, v) in headers {
            b = b.header(*k, v);
        }
        let req = b.body(Full::new(body)).map_err(|e| err(e.into()))?;
        let resp = self.inner.request(req).await.map_err(|e| err(e.into()))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.map_err(|e| err(e.into()))?.to_bytes();
        Ok(Reply { status, headers, body })
    }
}

/// One keep-alive HTTP/1.1 connection driven directly, without a pool:
/// what each simulated caller of the load generator holds. It sends the
/// same request again and again and keeps only the status, so that the
/// load generator's own work per request (it shares the machine with the
/// server) stays small: no URL formatted, no header parsed, no pool
/// checkout, no answer headers copied.
pub struct Caller {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    url: String,
}

impl Caller {
    /// Connects to `addr` for `POST path` with `headers`; the connection is
    /// driven by a task on the current tokio runtime.
    pub async fn connect(addr: SocketAddr, path: &str, headers: &[(&str, String)]) -> Result<Self, ClientError> {
        let url = format!("http://{addr}{path}");
        let err = |e: BoxError| ClientError::Request { url: url.clone(), source: e };
        let uri: axum::http::Uri = url.parse().map_err(|e: axum::http::uri::InvalidUri| err(e.into()))?;
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            let name = axum::http::HeaderName::from_bytes(k.as_bytes()).map_err(|e| err(e.into()))?;
            map.insert(name, v.parse().map_err(|e: axum::http::header::InvalidHeaderValue| err(e.into()))?);
        }
        map.insert(
            axum::http::header::HOST,
            addr.to_string().parse().map_err(|e: axum::http::header::InvalidHeaderValue| err(e.into()))?,
        );
        let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| err(e.into()))?;
        tcp.set_nodelay(true).map_err(|e| err(e.into()))?;
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| err(e.into()))?;
        // ends with the connection (the server closes it, or `send` is dropped)
        tokio::spawn(conn);
        Ok(Caller { send, uri, headers: map, url })
    }

    /// Sends `body`, reads the whole answer; its HTTP status.
    pub async fn post(&mut self, body: Bytes) -> Result<u16, ClientError> {
        let err = |e: BoxError| ClientError::Request { url: self.url.clone(), source: e };
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = axum::http::Method::POST;
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = self.headers.clone();
        // the connection takes the next request once it has finished the
        // last answer: sending before that is an error ("not ready")
        self.send.ready().await.map_err(|e| err(e.into()))?;
        let resp = self.send.send_request(req).await.map_err(|e| err(e.into()))?;
        let status = resp.status().as_u16();
        resp.into_body().collect().await.map_err(|e| err(e.into()))?;
        Ok(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_server_that_never_answers_is_a_timeout_and_a_closed_port_keeps_its_source() {
        // accepts the connection, reads nothing, answers nothing
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let held = tokio::spawn(async move { silent.accept().await });
        let c = Client::new(addr).with_timeout(Duration::from_millis(200));
        let e = c.get("/v2/health/ready").await.unwrap_err();
        assert!(matches!(&e, ClientError::Timeout { url, .. } if url.ends_with("/v2/health/ready")), "{e}");
        held.abort();

        // a port nobody listens on: the connect error is kept as the source
        let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let e = Client::new(gone).with_timeout(Duration::from_secs(60)).get("/").await.unwrap_err();
        assert!(matches!(e, ClientError::Request { .. }), "{e}");
        assert!(std::error::Error::source(&e).is_some());
    }
}
