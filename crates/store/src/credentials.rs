//! Which credentials an S3 client signs with, from the shared files'
//! settings of a profile (`aws_config::Resolved`): a key pair, a
//! `credential_process`, a role to assume (`sts`), or IAM Identity
//! Center (`sso`). A role's own source is chosen the same way, so a chain
//! of profiles (a role assumed with credentials from another role, from
//! SSO, from a process) works as in the AWS CLI.
//!
//! Every provider that fetches credentials keeps them until shortly
//! before they expire ([`Kept`]), and is asked once when the client is
//! built, so a broken setup is one line at start, not an EIO at the
//! first read.
//!
//! Why not `aws-config` (measured for issue 43, clean release builds with
//! 2 jobs, plugged in as object_store's credential provider): it adds
//! 39 to 44 crates to ckptfs's 217, 2 to 4 minutes of compile (CPU time;
//! ckptfs takes about 7) and 5.4 to 8.1 MB to the stripped binary (13.5
//! MB); under rust-version 1.89 it stays at 1.8.13 (every later one needs
//! a newer Rust); and its messages differ from the one-line ones users
//! and tests/s3_cli rely on (`FILE:LINE:` of a bad setting, `aws sso
//! login` hints).

use super::aws_config::Resolved;
use chrono::{DateTime, Utc};
use object_store::aws::{AwsCredential, AwsCredentialProvider};
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpRequest, ReqwestConnector,
};
use object_store::StaticCredentialProvider;
use std::sync::Arc;
use std::time::Duration;

/// Credentials are fetched again when they expire within this.
pub const REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);
/// The longest wait for an STS or SSO answer.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// Fetched credentials and when they stop being valid (None: never).
pub type Fetched = (Arc<AwsCredential>, Option<DateTime<Utc>>);

/// Credentials kept between fetches.
#[derive(Default)]
pub struct Kept(tokio::sync::Mutex<Option<Fetched>>);

impl Kept {
    /// The kept credentials while they are valid for more than
    /// [`REFRESH_BEFORE`], else the result of `fetch`, kept. Concurrent
    /// callers wait for one fetch instead of starting several.
    pub async fn get<F>(&self, fetch: F) -> Result<Arc<AwsCredential>, String>
    where
        F: std::future::Future<Output = Result<(AwsCredential, Option<DateTime<Utc>>), String>>,
    {
        let mut kept = self.0.lock().await;
        if let Some((c, expires)) = &*kept {
            if still_valid(*expires) {
                return Ok(c.clone());
            }
        }
        let (c, expires) = fetch.await?;
        let c = Arc::new(c);
        *kept = Some((c.clone(), expires));
        Ok(c)
    }
}

/// Whether credentials expiring at `expires` may still be used.
pub fn still_valid(expires: Option<DateTime<Utc>>) -> bool {
    expires.is_none_or(|t| {
        t - Utc::now() > chrono::Duration::from_std(REFRESH_BEFORE).expect("5 minutes")
    })
}

/// Credentials as object_store wants them; fails (rather than panicking
/// later in the signer) on a value no HTTP header can carry.
pub fn credential(
    key_id: String,
    secret_key: String,
    token: Option<String>,
) -> Result<AwsCredential, String> {
    let fine = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
    if !fine(&key_id) || !fine(&secret_key) || token.as_deref().is_some_and(|t| !fine(t)) {
        return Err("the credentials hold characters an HTTP header cannot carry".into());
    }
    Ok(AwsCredential {
        key_id,
        secret_key,
        token,
    })
}

/// An HTTP client for STS and SSO requests.
pub fn http_client() -> Result<HttpClient, String> {
    ReqwestConnector::default()
        .connect(
            &ClientOptions::new()
                .with_allow_http(true)
                .with_timeout(HTTP_TIMEOUT),
        )
        .map_err(|e| e.to_string())
}

/// The largest STS or SSO answer read.
pub const MAX_ANSWER: usize = 1 << 20;

/// Sends `req` with `http`: the answer's status and body (refused past
/// [`MAX_ANSWER`] bytes).
pub async fn send(http: &HttpClient, req: HttpRequest) -> Result<(u16, Vec<u8>), String> {
    let answer = http.execute(req).await.map_err(|e| e.to_string())?;
    let status = answer.status().as_u16();
    let body = answer
        .into_body()
        .bytes()
        .await
        .map_err(|e| e.to_string())?;
    if body.len() > MAX_ANSWER {
        return Err(format!("an answer of {} bytes", body.len()));
    }
    Ok((status, body.to_vec()))
}

/// A credential failure as object_store reports errors.
pub fn provider_error(e: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: e.into(),
    }
}

/// An environment variable, unless unset or empty.
pub fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// The provider for the credentials of `r`, when the shared files give
/// some (None: object_store's own chain applies). `region` is the
/// client's region (for STS).
pub fn provider(r: &Resolved, region: &str) -> Result<Option<AwsCredentialProvider>, String> {
    if let Some(role) = &r.role {
        let source = match &role.source {
            Some(s) => provider(s, region)?.ok_or_else(|| {
                format!(
                    "AWS profile {:?}: its source profile {:?} has no credentials to assume \
                     role {} with",
                    r.profile, s.profile, role.role_arn
                )
            })?,
            None => {
                let (Some(k), Some(s)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"))
                else {
                    return Err(format!(
                        "AWS profile {:?}: credential_source = Environment, but \
                         AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not both set",
                        r.profile
                    ));
                };
                let c = credential(k, s, env("AWS_SESSION_TOKEN"))
                    .map_err(|e| format!("AWS profile {:?}: environment: {e}", r.profile))?;
                Arc::new(StaticCredentialProvider::new(c))
            }
        };
        let p = super::sts::RoleCredentials::new(&r.profile, role, source, region)?;
        return Ok(Some(Arc::new(p)));
    }
    if let Some(sso) = &r.sso {
        return Ok(Some(Arc::new(super::sso::SsoCredentials::new(
            &r.profile, sso,
        )?)));
    }
    if let (Some(k), Some(s)) = (&r.access_key_id, &r.secret_access_key) {
        let c = credential(k.clone(), s.clone(), r.session_token.clone())
            .map_err(|e| format!("AWS profile {:?}: {e}", r.profile))?;
        return Ok(Some(Arc::new(StaticCredentialProvider::new(c))));
    }
    if let Some(cmd) = &r.credential_process {
        let p = super::credential_process::ProcessCredentials::new(&r.profile, cmd)?;
        return Ok(Some(Arc::new(p)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_and_header_safe_values() {
        assert!(still_valid(None));
        assert!(still_valid(Some(Utc::now() + chrono::Duration::hours(1))));
        assert!(!still_valid(Some(
            Utc::now() + chrono::Duration::minutes(4)
        )));
        assert!(credential("AK".into(), "S".into(), Some("T".into())).is_ok());
        assert!(credential("AK".into(), "S\n".into(), None).is_err());
        assert!(credential("AK".into(), "S".into(), Some("a b".into())).is_err());
        assert!(credential(String::new(), "S".into(), None).is_err());
    }
}
