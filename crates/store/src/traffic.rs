//! Counters of the S3 client's traffic, for `ckptfs stats` and the
//! metrics endpoint: requests sent, bytes uploaded in request bodies, and
//! requests that failed in a way `object_store` retries (a 5xx or 429
//! answer, a connection, request or timeout error). A request that ran out
//! of retries is counted among those too, so `s3_retries` is the number of
//! retried or finally failed attempts. Bytes downloaded are counted where
//! they are received (`remote::FETCHED_BYTES`).
//!
//! They are counted by wrapping `object_store`'s own HTTP client
//! ([`CountingConnector`]): every request any S3 call makes passes through
//! it, retries included, which the calls above it never see.

use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};
use object_store::ClientOptions;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Requests sent to the S3 server (each attempt).
pub static REQUESTS: AtomicU64 = AtomicU64::new(0);
/// Bytes of request bodies sent (uploads).
pub static SENT_BYTES: AtomicU64 = AtomicU64::new(0);
/// Attempts that failed in a way the client retries.
pub static RETRIES: AtomicU64 = AtomicU64::new(0);

/// `object_store`'s default connector (reqwest), counting.
#[derive(Debug, Default)]
pub struct CountingConnector;

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Counting(inner)))
    }
}

#[derive(Debug)]
struct Counting(HttpClient);

#[async_trait::async_trait]
impl HttpService for Counting {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        REQUESTS.fetch_add(1, Relaxed);
        SENT_BYTES.fetch_add(req.body().content_length() as u64, Relaxed);
        let r = self.0.execute(req).await;
        let retried = match &r {
            Ok(resp) => resp.status().is_server_error() || resp.status().as_u16() == 429,
            Err(e) => matches!(
                e.kind(),
                HttpErrorKind::Connect
                    | HttpErrorKind::Request
                    | HttpErrorKind::Timeout
                    | HttpErrorKind::Interrupted
            ),
        };
        if retried {
            RETRIES.fetch_add(1, Relaxed);
        }
        r
    }
}
