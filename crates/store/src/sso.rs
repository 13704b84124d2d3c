//! Credentials from IAM Identity Center (SSO): a profile with
//! `sso_account_id` and `sso_role_name` (and `sso_session`, or the legacy
//! `sso_start_url` and `sso_region`), after `aws sso login` left an
//! access token in `~/.aws/sso/cache/SHA1.json` (the SHA-1 of the session
//! name, or of the start URL for legacy settings). The role's credentials
//! come from the portal's `GetRoleCredentials`
//! (`GET /federation/credentials`), kept until shortly before they expire;
//! the token file is read again at each fetch, so a new `aws sso login`
//! is picked up without a remount.
//!
//! An expired token is refreshed as the AWS CLI does, when the cache file
//! holds what that needs (an `sso-session` login: `refreshToken`,
//! `clientId` and `clientSecret`, with a client registration that has not
//! expired): an OIDC `CreateToken` request with the refresh token. The new
//! token is kept in memory only (ckptfs never writes into `~/.aws`); a
//! later `aws sso login` is still read. ckptfs never logs in itself: a
//! missing token, or an expired one it cannot refresh, is one line saying
//! to run `aws sso login`. The portal is `AWS_ENDPOINT_URL_SSO`, the OIDC
//! service `AWS_ENDPOINT_URL_SSO_OIDC`, either else `AWS_ENDPOINT_URL`,
//! else `https://portal.sso.REGION.amazonaws.com` and
//! `https://oidc.REGION.amazonaws.com`.

use super::aws_config::Sso;
use super::credentials::{credential, env, http_client, provider_error, send, Kept};
use chrono::{DateTime, Utc};
use object_store::aws::AwsCredential;
use object_store::client::HttpClient;
use object_store::CredentialProvider;
use serde::Deserialize;
use sha1::{Digest, Sha1};
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

/// The largest token file read.
const MAX_READ: u64 = 1 << 20;

pub struct SsoCredentials {
    profile: String,
    sso: Sso,
    token_file: PathBuf,
    endpoint: String,
    oidc: String,
    http: HttpClient,
    kept: Kept,
    /// A token refreshed by this process, kept until it expires.
    refreshed: parking_lot::Mutex<Option<(String, DateTime<Utc>)>>,
}

impl std::fmt::Debug for SsoCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SsoCredentials({:?})", self.profile)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Token {
    access_token: String,
    expires_at: String,
    refresh_token: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
    registration_expires_at: Option<String>,
}

/// What refreshing an expired token takes (from its cache file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refresh {
    pub refresh_token: String,
    pub client_id: String,
    pub client_secret: String,
}

/// An OIDC `CreateToken` answer, the parts read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewToken {
    access_token: String,
    /// Seconds.
    expires_in: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    role_credentials: RoleCredentials,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RoleCredentials {
    access_key_id: String,
    secret_access_key: String,
    session_token: String,
    /// Milliseconds since the epoch.
    expiration: i64,
}

/// The token cache file of `sso` under `home`.
pub fn token_file(home: &std::path::Path, sso: &Sso) -> PathBuf {
    let key = sso.session.as_deref().unwrap_or(&sso.start_url);
    let hex: String = Sha1::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    home.join(".aws/sso/cache").join(format!("{hex}.json"))
}

/// A date of a token cache file: botocore writes `...Z`, older CLIs
/// wrote `...UTC`.
fn cache_date(what: &str, at: &str) -> Result<DateTime<Utc>, String> {
    let t = at.trim();
    let t = t
        .strip_suffix("UTC")
        .map_or(t.to_string(), |s| format!("{s}Z"));
    DateTime::parse_from_rfc3339(&t)
        .map(|d| d.with_timezone(&Utc))
        .map_err(|e| format!("{what} {at:?} is not a date: {e}"))
}

/// A token cache file's text: its access token if not expired, else what
/// refreshing it takes (if the file has that and the client registration
/// is still valid), else why neither.
pub fn parse_token(text: &str) -> Result<std::result::Result<String, Refresh>, String> {
    let t: Token =
        serde_json::from_str(text).map_err(|e| format!("not an SSO token cache file: {e}"))?;
    if cache_date("expiresAt", &t.expires_at)? > Utc::now() {
        return Ok(Ok(t.access_token));
    }
    let registered = match &t.registration_expires_at {
        Some(at) => cache_date("registrationExpiresAt", at)? > Utc::now(),
        None => true,
    };
    match (t.refresh_token, t.client_id, t.client_secret) {
        (Some(refresh_token), Some(client_id), Some(client_secret)) if registered => {
            Ok(Err(Refresh {
                refresh_token,
                client_id,
                client_secret,
            }))
        }
        _ => Err(format!("the token expired at {}", t.expires_at)),
    }
}

/// The token in an OIDC `CreateToken` answer, and when it expires.
pub fn parse_new_token(status: u16, body: &[u8]) -> Result<(String, DateTime<Utc>), String> {
    if !(200..300).contains(&status) {
        let why = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("error").and_then(|m| m.as_str()).map(str::to_string))
            .unwrap_or_default();
        return Err(
            format!("refreshing the token was refused (HTTP {status}) {why}")
                .trim_end()
                .to_string(),
        );
    }
    let t: NewToken = serde_json::from_slice(body)
        .map_err(|e| format!("the OIDC answer has no access token: {e}"))?;
    let secs = t.expires_in.clamp(0, 7 * 24 * 3600);
    Ok((t.access_token, Utc::now() + chrono::Duration::seconds(secs)))
}

/// The credentials in a `GetRoleCredentials` answer.
pub fn parse_answer(
    status: u16,
    body: &[u8],
) -> Result<(AwsCredential, Option<DateTime<Utc>>), String> {
    if !(200..300).contains(&status) {
        let msg = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| {
                v.get("message")
                    .and_then(|m| m.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        return Err(format!("the SSO portal refused (HTTP {status}) {msg}")
            .trim_end()
            .to_string());
    }
    let a: Answer = serde_json::from_slice(body)
        .map_err(|e| format!("the SSO portal's answer has no role credentials: {e}"))?;
    let c = a.role_credentials;
    let expires = DateTime::from_timestamp_millis(c.expiration)
        .ok_or_else(|| format!("expiration {} is not a time", c.expiration))?;
    let cred = credential(c.access_key_id, c.secret_access_key, Some(c.session_token))?;
    Ok((cred, Some(expires)))
}

impl SsoCredentials {
    pub fn new(profile: &str, sso: &Sso) -> Result<SsoCredentials, String> {
        let home = env("HOME").ok_or_else(|| {
            format!("AWS profile {profile:?} (SSO): HOME is not set, so there is no token cache")
        })?;
        let endpoint = env("AWS_ENDPOINT_URL_SSO")
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| format!("https://portal.sso.{}.amazonaws.com", sso.region));
        let oidc = env("AWS_ENDPOINT_URL_SSO_OIDC")
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| format!("https://oidc.{}.amazonaws.com", sso.region));
        Ok(SsoCredentials {
            profile: profile.to_string(),
            sso: sso.clone(),
            token_file: token_file(std::path::Path::new(&home), sso),
            endpoint: endpoint.trim_end_matches('/').to_string(),
            oidc: oidc.trim_end_matches('/').to_string(),
            http: http_client()?,
            kept: Kept::default(),
            refreshed: parking_lot::Mutex::new(None),
        })
    }

    fn at(&self, what: impl std::fmt::Display) -> String {
        format!(
            "AWS profile {:?} (SSO, account {}, role {}): {what}",
            self.profile, self.sso.account_id, self.sso.role_name
        )
    }

    /// A valid access token: the cache file's, else one this process
    /// refreshed and still holds, else a new one refreshed now.
    async fn token(&self) -> Result<String, String> {
        let login = format!("run `aws sso login --profile {}`", self.profile);
        let file = self.token_file.display();
        let f = std::fs::File::open(&self.token_file)
            .map_err(|e| self.at(format!("{file}: {e}: {login}")))?;
        let mut text = String::new();
        f.take(MAX_READ)
            .read_to_string(&mut text)
            .map_err(|e| self.at(format!("{file}: {e}")))?;
        let refresh = match parse_token(&text) {
            Ok(Ok(token)) => return Ok(token),
            Ok(Err(refresh)) => refresh,
            Err(e) => return Err(self.at(format!("{file}: {e}: {login}"))),
        };
        if let Some((token, until)) = &*self.refreshed.lock() {
            if *until > Utc::now() {
                return Ok(token.clone());
            }
        }
        let body = serde_json::json!({
            "clientId": refresh.client_id,
            "clientSecret": refresh.client_secret,
            "grantType": "refresh_token",
            "refreshToken": refresh.refresh_token,
        });
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("{}/token", self.oidc))
            .header("content-type", "application/json")
            .body(body.to_string().into())
            .map_err(|e| self.at(e))?;
        let (status, answer) = send(&self.http, req)
            .await
            .map_err(|e| self.at(format!("refreshing the token at {}: {e}", self.oidc)))?;
        let (token, until) = parse_new_token(status, &answer)
            .map_err(|e| self.at(format!("{file}: {e}: {login}")))?;
        *self.refreshed.lock() = Some((token.clone(), until));
        Ok(token)
    }

    async fn fetch(&self) -> Result<(AwsCredential, Option<DateTime<Utc>>), String> {
        let token = self.token().await?;
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("role_name", &self.sso.role_name)
            .append_pair("account_id", &self.sso.account_id)
            .finish();
        let req = http::Request::builder()
            .method("GET")
            .uri(format!(
                "{}/federation/credentials?{}",
                self.endpoint, query
            ))
            .header("x-amz-sso_bearer_token", token)
            .body(Vec::new().into())
            .map_err(|e| self.at(e))?;
        let (status, body) = send(&self.http, req).await.map_err(|e| self.at(e))?;
        parse_answer(status, &body).map_err(|e| self.at(e))
    }
}

#[async_trait::async_trait]
impl CredentialProvider for SsoCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        self.kept.get(self.fetch()).await.map_err(provider_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_and_answers() {
        let sso = Sso {
            start_url: "https://d-1.awsapps.com/start".into(),
            region: "eu-west-1".into(),
            account_id: "111".into(),
            role_name: "R".into(),
            session: Some("my-sso".into()),
        };
        // sha1("my-sso"), as botocore names the file.
        assert_eq!(
            token_file(std::path::Path::new("/h"), &sso),
            PathBuf::from("/h/.aws/sso/cache/0ad374308c5a4e22f723adf10145eafad7c4031c.json")
        );
        let later = (Utc::now() + chrono::Duration::hours(1)).format("%Y-%m-%dT%H:%M:%SZ");
        let t = format!(r#"{{"accessToken": "tok", "expiresAt": "{later}"}}"#);
        assert_eq!(parse_token(&t).unwrap(), Ok("tok".to_string()));
        let old = r#"{"accessToken": "tok", "expiresAt": "2020-01-01T00:00:00UTC"}"#;
        assert!(parse_token(old).unwrap_err().contains("expired"));
        assert!(parse_token("{}").is_err());
        // Expired, with what refreshing takes; not once the client
        // registration has expired too.
        let refreshable = |reg: &str| {
            format!(
                r#"{{"accessToken": "tok", "expiresAt": "2020-01-01T00:00:00Z",
                "refreshToken": "r", "clientId": "c", "clientSecret": "s",
                "registrationExpiresAt": "{reg}"}}"#
            )
        };
        assert_eq!(
            parse_token(&refreshable(&later.to_string())).unwrap(),
            Err(Refresh {
                refresh_token: "r".into(),
                client_id: "c".into(),
                client_secret: "s".into(),
            })
        );
        assert!(parse_token(&refreshable("2021-01-01T00:00:00Z"))
            .unwrap_err()
            .contains("expired"));
        let (tok, until) =
            parse_new_token(200, br#"{"accessToken": "new", "expiresIn": 3600}"#).unwrap();
        assert_eq!(tok, "new");
        assert!(until > Utc::now() + chrono::Duration::minutes(59));
        let e = parse_new_token(400, br#"{"error": "invalid_grant"}"#).unwrap_err();
        assert!(e.contains("HTTP 400") && e.contains("invalid_grant"), "{e}");
        let ok = br#"{"roleCredentials": {"accessKeyId": "ASIA2", "secretAccessKey": "s",
            "sessionToken": "t", "expiration": 1893456000000}}"#;
        let (c, e) = parse_answer(200, ok).unwrap();
        assert_eq!(c.key_id, "ASIA2");
        assert_eq!(e.unwrap().timestamp(), 1_893_456_000);
        let e =
            parse_answer(401, br#"{"message": "Session token not found or invalid"}"#).unwrap_err();
        assert!(e.contains("HTTP 401") && e.contains("not found"), "{e}");
    }
}
