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
//! ckptfs does not log in or refresh the token itself: an expired or
//! missing token is one line saying to run `aws sso login`. The portal is
//! `AWS_ENDPOINT_URL_SSO`, else `AWS_ENDPOINT_URL`, else
//! `https://portal.sso.REGION.amazonaws.com`.

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
    http: HttpClient,
    kept: Kept,
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

/// The access token in a token cache file's text, if not expired.
pub fn parse_token(text: &str) -> Result<String, String> {
    let t: Token =
        serde_json::from_str(text).map_err(|e| format!("not an SSO token cache file: {e}"))?;
    // botocore writes `...Z`; older CLIs wrote `...UTC`.
    let at = t.expires_at.trim();
    let at = at
        .strip_suffix("UTC")
        .map_or(at.to_string(), |s| format!("{s}Z"));
    let expires = DateTime::parse_from_rfc3339(&at)
        .map_err(|e| format!("expiresAt {:?} is not a date: {e}", t.expires_at))?;
    if expires <= Utc::now() {
        return Err(format!("the token expired at {}", t.expires_at));
    }
    Ok(t.access_token)
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
        Ok(SsoCredentials {
            profile: profile.to_string(),
            sso: sso.clone(),
            token_file: token_file(std::path::Path::new(&home), sso),
            endpoint: endpoint.trim_end_matches('/').to_string(),
            http: http_client()?,
            kept: Kept::default(),
        })
    }

    fn at(&self, what: impl std::fmt::Display) -> String {
        format!(
            "AWS profile {:?} (SSO, account {}, role {}): {what}",
            self.profile, self.sso.account_id, self.sso.role_name
        )
    }

    fn token(&self) -> Result<String, String> {
        let login = format!("run `aws sso login --profile {}`", self.profile);
        let f = std::fs::File::open(&self.token_file)
            .map_err(|e| self.at(format!("{}: {e}: {login}", self.token_file.display())))?;
        let mut text = String::new();
        f.take(MAX_READ)
            .read_to_string(&mut text)
            .map_err(|e| self.at(format!("{}: {e}", self.token_file.display())))?;
        parse_token(&text)
            .map_err(|e| self.at(format!("{}: {e}: {login}", self.token_file.display())))
    }

    async fn fetch(&self) -> Result<(AwsCredential, Option<DateTime<Utc>>), String> {
        let token = self.token()?;
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
        assert_eq!(parse_token(&t).unwrap(), "tok");
        let old = r#"{"accessToken": "tok", "expiresAt": "2020-01-01T00:00:00UTC"}"#;
        assert!(parse_token(old).unwrap_err().contains("expired"));
        assert!(parse_token("{}").is_err());
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
