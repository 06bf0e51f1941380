//! A small HTTP/1.1 client over hyper-util's pooled client: what the load
//! generator and the tests use to talk to a server like any other client.

use std::net::SocketAddr;

use axum::http::{HeaderMap, Request};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connecting or sending failed.
    #[error("request to {url}: {reason}")]
    Request {
        /// The URL.
        url: String,
        /// What happened.
        reason: String,
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
}

impl Client {
    /// A client of the server at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let inner = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(conn);
        Client { inner, base: format!("http://{addr}") }
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
        let err = |reason: String| ClientError::Request { url: url.clone(), reason };
        let mut b = Request::builder().method(method).uri(&url);
        for (k, v) in headers {
            b = b.header(*k, v);
        }
        let req = b.body(Full::new(body)).map_err(|e| err(e.to_string()))?;
        let resp = self.inner.request(req).await.map_err(|e| err(e.to_string()))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.map_err(|e| err(e.to_string()))?.to_bytes();
        Ok(Reply { status, headers, body })
    }
}
