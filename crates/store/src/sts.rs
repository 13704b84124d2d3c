//! Credentials of an assumed role: a profile with `role_arn`, assumed
//! with the credentials of its `source_profile` (or of the environment)
//! by an STS `AssumeRole` request signed with them, as the AWS CLI does.
//! The temporary credentials are kept until shortly before they expire
//! (`credentials::Kept`), then the role is assumed again.
//!
//! The STS endpoint is `AWS_ENDPOINT_URL_STS`, else `AWS_ENDPOINT_URL`,
//! else the regional `https://sts.REGION.amazonaws.com`. An STS error is
//! one line naming the profile, the role and STS's own code and message.

use super::aws_config::Role;
use super::credentials::{credential, env, http_client, provider_error, send, Kept};
use chrono::{DateTime, Utc};
use object_store::aws::{AwsAuthorizer, AwsCredential, AwsCredentialProvider};
use object_store::client::HttpClient;
use object_store::CredentialProvider;
use serde::Deserialize;
use std::sync::Arc;

/// A role assumed with another provider's credentials.
pub struct RoleCredentials {
    profile: String,
    role: Role,
    source: AwsCredentialProvider,
    endpoint: String,
    region: String,
    http: HttpClient,
    kept: Kept,
}

impl std::fmt::Debug for RoleCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RoleCredentials({})", self.role.role_arn)
    }
}

/// `AssumeRoleResponse`, the parts read.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Answer {
    assume_role_result: AnswerResult,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AnswerResult {
    credentials: AnswerCredentials,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AnswerCredentials {
    access_key_id: String,
    secret_access_key: String,
    session_token: String,
    expiration: String,
}

/// `ErrorResponse`, the parts read.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ErrorAnswer {
    error: ErrorBody,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ErrorBody {
    code: String,
    #[serde(default)]
    message: String,
}

/// The credentials in an STS `AssumeRole` answer (`status` its HTTP
/// status).
pub fn parse_answer(
    status: u16,
    body: &[u8],
) -> Result<(AwsCredential, Option<DateTime<Utc>>), String> {
    let text = std::str::from_utf8(body).map_err(|_| "STS answered with non-UTF-8 bytes")?;
    if !(200..300).contains(&status) {
        return Err(match quick_xml::de::from_str::<ErrorAnswer>(text) {
            Ok(e) => format!(
                "STS refused (HTTP {status}): {}: {}",
                e.error.code, e.error.message
            ),
            Err(_) => format!("STS answered HTTP {status}"),
        });
    }
    let a: Answer = quick_xml::de::from_str(text)
        .map_err(|e| format!("STS's answer is not an AssumeRole result: {e}"))?;
    let c = a.assume_role_result.credentials;
    let expires = DateTime::parse_from_rfc3339(c.expiration.trim())
        .map_err(|e| format!("STS's Expiration {:?} is not a date: {e}", c.expiration))?
        .with_timezone(&Utc);
    let cred = credential(c.access_key_id, c.secret_access_key, Some(c.session_token))?;
    Ok((cred, Some(expires)))
}

/// The form body of an `AssumeRole` request.
fn form(role: &Role, profile: &str) -> String {
    let session = role.session_name.clone().unwrap_or_else(|| {
        // The CLI's default: a name that says who assumed it and when.
        format!("ckptfs-{profile}-{}", Utc::now().timestamp())
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || "=,.@-_".contains(*c))
            .take(64)
            .collect()
    });
    let mut f = form_urlencoded::Serializer::new(String::new());
    f.append_pair("Action", "AssumeRole")
        .append_pair("Version", "2011-06-15")
        .append_pair("RoleArn", &role.role_arn)
        .append_pair("RoleSessionName", &session);
    if let Some(d) = role.duration_seconds {
        f.append_pair("DurationSeconds", &d.to_string());
    }
    if let Some(x) = &role.external_id {
        f.append_pair("ExternalId", x);
    }
    f.finish()
}

impl RoleCredentials {
    pub fn new(
        profile: &str,
        role: &Role,
        source: AwsCredentialProvider,
        region: &str,
    ) -> Result<RoleCredentials, String> {
        let endpoint = env("AWS_ENDPOINT_URL_STS")
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com"));
        Ok(RoleCredentials {
            profile: profile.to_string(),
            role: role.clone(),
            source,
            endpoint: endpoint.trim_end_matches('/').to_string() + "/",
            region: region.to_string(),
            http: http_client()?,
            kept: Kept::default(),
        })
    }

    fn at(&self, what: impl std::fmt::Display) -> String {
        format!(
            "AWS profile {:?}: assuming role {} at {}: {what}",
            self.profile, self.role.role_arn, self.endpoint
        )
    }

    async fn assume(&self) -> Result<(AwsCredential, Option<DateTime<Utc>>), String> {
        let source = self
            .source
            .get_credential()
            .await
            .map_err(|e| self.at(format!("its source credentials: {e}")))?;
        let mut req = http::Request::builder()
            .method("POST")
            .uri(&self.endpoint)
            .header(
                "content-type",
                "application/x-www-form-urlencoded; charset=utf-8",
            )
            .body(form(&self.role, &self.profile).into())
            .map_err(|e| self.at(e))?;
        AwsAuthorizer::new(&source, "sts", &self.region).authorize(&mut req, None);
        let (status, body) = send(&self.http, req).await.map_err(|e| self.at(e))?;
        parse_answer(status, &body).map_err(|e| self.at(e))
    }
}

#[async_trait::async_trait]
impl CredentialProvider for RoleCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        self.kept.get(self.assume()).await.map_err(provider_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_errors() {
        let ok = br#"<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <AssumedRoleUser><Arn>arn:aws:sts::1:assumed-role/r/s</Arn><AssumedRoleId>X:s</AssumedRoleId></AssumedRoleUser>
    <Credentials>
      <AccessKeyId>ASIA1</AccessKeyId>
      <SecretAccessKey>sec</SecretAccessKey>
      <SessionToken>tok</SessionToken>
      <Expiration>2030-01-02T03:04:05Z</Expiration>
    </Credentials>
  </AssumeRoleResult>
  <ResponseMetadata><RequestId>r</RequestId></ResponseMetadata>
</AssumeRoleResponse>"#;
        let (c, e) = parse_answer(200, ok).unwrap();
        assert_eq!(
            (c.key_id.as_str(), c.secret_key.as_str(), c.token.as_deref()),
            ("ASIA1", "sec", Some("tok"))
        );
        assert_eq!(e.unwrap().to_rfc3339(), "2030-01-02T03:04:05+00:00");
        let denied = br#"<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code>
<Message>not allowed</Message></Error><RequestId>r</RequestId></ErrorResponse>"#;
        let e = parse_answer(403, denied).unwrap_err();
        assert!(
            e.contains("HTTP 403") && e.contains("AccessDenied: not allowed"),
            "{e}"
        );
        assert!(parse_answer(500, b"\xff").is_err());
        assert!(parse_answer(200, b"<x/>")
            .unwrap_err()
            .contains("not an AssumeRole"));
    }

    #[test]
    fn the_form_names_the_role_and_options() {
        let role = Role {
            role_arn: "arn:aws:iam::1:role/a b".into(),
            session_name: None,
            external_id: Some("x&y".into()),
            duration_seconds: Some(900),
            source: None,
        };
        let f = form(&role, "dev ops");
        assert!(
            f.starts_with("Action=AssumeRole&Version=2011-06-15&"),
            "{f}"
        );
        assert!(
            f.contains("RoleArn=arn%3Aaws%3Aiam%3A%3A1%3Arole%2Fa+b"),
            "{f}"
        );
        assert!(f.contains("RoleSessionName=ckptfs-devops-"), "{f}");
        assert!(f.contains("DurationSeconds=900&ExternalId=x%26y"), "{f}");
    }
}
