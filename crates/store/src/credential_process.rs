//! Credentials from an external command: the `credential_process` setting
//! of an AWS profile, as the AWS CLI and SDKs run it (the "sourcing
//! credentials with an external process" contract). Companies put their
//! credential brokers (Vault, aws-vault, SSO helpers, in-house signers)
//! behind it, so a node whose `~/.aws/config` says
//! `credential_process = /usr/bin/broker --role models` mounts a bucket
//! with no key in any file.
//!
//! The command line is split as a POSIX shell would split words (no
//! shell runs it), started with no stdin, and must print one JSON object:
//! `{"Version": 1, "AccessKeyId": ..., "SecretAccessKey": ...,
//! "SessionToken": ... (optional), "Expiration": RFC 3339 (optional)}`.
//! Credentials without `Expiration` are kept for the life of the process;
//! others are fetched again when less than [`REFRESH_BEFORE`] remains.
//!
//! Bounded: the command is killed after [`TIMEOUT`] (a broker waiting for
//! a login prompt must not hang a FUSE read), and at most [`MAX_OUTPUT`]
//! bytes of its output are read. Every failure is one line naming the
//! profile, the command and what went wrong (its exit status and the
//! first line it wrote to stderr, or the field that is missing).

use chrono::{DateTime, Utc};
use object_store::aws::AwsCredential;
use object_store::CredentialProvider;
use parking_lot::Mutex;
use serde::Deserialize;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest a credential command may run.
pub const TIMEOUT: Duration = Duration::from_secs(60);
/// The most output read from a credential command.
pub const MAX_OUTPUT: u64 = 64 << 10;
pub use super::credentials::REFRESH_BEFORE;

/// What the command prints (the fields of version 1 of the contract).
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Output {
    version: u64,
    access_key_id: Option<String>,
    secret_access_key: Option<String>,
    session_token: Option<String>,
    expiration: Option<String>,
}

use super::credentials::Fetched;

/// Parses a credential command's output.
pub fn parse_output(out: &[u8]) -> Result<(AwsCredential, Option<DateTime<Utc>>), String> {
    let o: Output = serde_json::from_slice(out)
        .map_err(|e| format!("its output is not the expected JSON object ({e})"))?;
    if o.version != 1 {
        return Err(format!(
            "its output has \"Version\": {}, only version 1 is understood",
            o.version
        ));
    }
    let field = |v: Option<String>, name: &str| {
        v.filter(|s| !s.is_empty())
            .ok_or_else(|| format!("its output has no \"{name}\""))
    };
    let key_id = field(o.access_key_id, "AccessKeyId")?;
    let secret_key = field(o.secret_access_key, "SecretAccessKey")?;
    let expires = match o.expiration.filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(
            DateTime::parse_from_rfc3339(&s)
                .map_err(|e| format!("its \"Expiration\" {s:?} is not an RFC 3339 time ({e})"))?
                .with_timezone(&Utc),
        ),
    };
    Ok((
        AwsCredential {
            key_id,
            secret_key,
            token: o.session_token.filter(|s| !s.is_empty()),
        },
        expires,
    ))
}

/// The first line of `bytes`, trimmed and cut to 200 characters.
fn first_line(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    s.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

/// Runs `argv` with no stdin for at most `timeout`: its stdout (at most
/// [`MAX_OUTPUT`] bytes), or why it failed.
fn run(argv: &[String], timeout: Duration) -> Result<Vec<u8>, String> {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    // Both pipes are drained on their own threads, so that a command that
    // writes a lot to one of them cannot block on a full pipe. A process
    // the command left behind may hold the pipes open past its exit: the
    // output is then waited for until the deadline only.
    let drain = |p: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(p) = p {
                let mut p = p.take(MAX_OUTPUT + 1);
                let _ = p.read_to_end(&mut buf);
                let _ = tx.send(buf);
                // Swallow the rest so the writer sees no broken pipe.
                let _ = std::io::copy(p.get_mut(), &mut std::io::sink());
            } else {
                let _ = tx.send(buf);
            }
        });
        rx
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + timeout;
    let timed_out = || format!("it did not finish within {} s", timeout.as_secs_f64());
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(timed_out());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for it failed: {e}")),
        }
    };
    let left = || deadline.saturating_duration_since(Instant::now());
    let stdout = out.recv_timeout(left()).map_err(|_| timed_out())?;
    let stderr = err.recv_timeout(left()).unwrap_or_default();
    if !status.success() {
        let why = first_line(&stderr);
        return Err(if why.is_empty() {
            format!("it failed ({status})")
        } else {
            format!("it failed ({status}): {why}")
        });
    }
    if stdout.len() as u64 > MAX_OUTPUT {
        return Err(format!("it printed more than {MAX_OUTPUT} bytes"));
    }
    Ok(stdout)
}

/// A profile's `credential_process`, run when credentials are needed and
/// kept until they are about to expire.
pub struct ProcessCredentials {
    profile: String,
    command: String,
    argv: Vec<String>,
    timeout: Duration,
    cached: Mutex<Option<Fetched>>,
}

impl std::fmt::Debug for ProcessCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProcessCredentials({:?})", self.command)
    }
}

impl ProcessCredentials {
    /// The `credential_process` of `profile`; fails if the command line is
    /// empty or its quoting is unbalanced.
    pub fn new(profile: &str, command: &str) -> Result<ProcessCredentials, String> {
        let argv = shlex::split(command)
            .filter(|a| !a.is_empty())
            .ok_or_else(|| {
                format!(
                "AWS profile {profile:?}: credential_process {command:?} is not a command line \
                 (empty, or unbalanced quotes)"
            )
            })?;
        Ok(ProcessCredentials {
            profile: profile.to_string(),
            command: command.to_string(),
            argv,
            timeout: TIMEOUT,
            cached: Mutex::new(None),
        })
    }

    /// Sets the time limit of one run (tests use a short one).
    pub fn with_timeout(mut self, timeout: Duration) -> ProcessCredentials {
        self.timeout = timeout;
        self
    }

    /// Valid credentials: the kept ones, or the command's new ones. Blocks
    /// while the command runs (at most the timeout); concurrent callers
    /// wait for one run instead of starting several.
    pub fn credentials(&self) -> Result<Arc<AwsCredential>, String> {
        let mut cached = self.cached.lock();
        if let Some((c, expires)) = &*cached {
            if super::credentials::still_valid(*expires) {
                return Ok(c.clone());
            }
        }
        let (c, expires) = run(&self.argv, self.timeout)
            .and_then(|out| parse_output(&out))
            .map_err(|e| {
                format!(
                    "AWS profile {:?}: credential_process {:?}: {e}",
                    self.profile, self.command
                )
            })?;
        let c = Arc::new(c);
        *cached = Some((c.clone(), expires));
        Ok(c)
    }
}

#[async_trait::async_trait]
impl CredentialProvider for ProcessCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        // The command blocks: run it where blocking is allowed.
        tokio::task::block_in_place(|| self.credentials()).map_err(|e| {
            object_store::Error::Generic {
                store: "S3",
                source: e.into(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// An executable shell script in `dir` that appends a line to `count`
    /// each run, then runs `body`.
    fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
        let p = dir.join(name);
        let count = dir.join("runs");
        std::fs::write(
            &p,
            format!("#!/bin/sh\necho run >> '{}'\n{body}\n", count.display()),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.display().to_string()
    }

    fn runs(dir: &std::path::Path) -> usize {
        std::fs::read_to_string(dir.join("runs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    #[test]
    fn output_fields_and_their_errors() {
        let (c, t) = parse_output(
            br#"{"Version": 1, "AccessKeyId": "AK", "SecretAccessKey": "SK",
                 "SessionToken": "T", "Expiration": "2030-01-02T03:04:05Z"}"#,
        )
        .unwrap();
        assert_eq!((c.key_id.as_str(), c.secret_key.as_str()), ("AK", "SK"));
        assert_eq!(c.token.as_deref(), Some("T"));
        assert_eq!(t.unwrap().to_rfc3339(), "2030-01-02T03:04:05+00:00");
        let (c, t) =
            parse_output(br#"{"Version": 1, "AccessKeyId": "AK", "SecretAccessKey": "SK"}"#)
                .unwrap();
        assert!(c.token.is_none() && t.is_none());
        for (out, what) in [
            (&br#"{"Version": 2, "AccessKeyId": "A", "SecretAccessKey": "S"}"#[..], "Version\": 2"),
            (br#"{"Version": 1, "SecretAccessKey": "S"}"#, "no \"AccessKeyId\""),
            (br#"{"Version": 1, "AccessKeyId": "A", "SecretAccessKey": ""}"#, "no \"SecretAccessKey\""),
            (
                br#"{"Version": 1, "AccessKeyId": "A", "SecretAccessKey": "S", "Expiration": "soon"}"#,
                "\"soon\" is not an RFC 3339 time",
            ),
            (b"AKIA...\n", "not the expected JSON"),
            (b"", "not the expected JSON"),
        ] {
            let e = parse_output(out).unwrap_err();
            assert!(e.contains(what), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    #[test]
    fn runs_once_while_valid_and_again_near_expiry() {
        let d = tempfile::tempdir().unwrap();
        let forever = script(
            d.path(),
            "forever",
            r#"echo '{"Version": 1, "AccessKeyId": "AK1", "SecretAccessKey": "S1"}'"#,
        );
        let p = ProcessCredentials::new("default", &format!("'{forever}' --flag")).unwrap();
        assert_eq!(p.credentials().unwrap().key_id, "AK1");
        assert_eq!(p.credentials().unwrap().key_id, "AK1");
        assert_eq!(runs(d.path()), 1, "credentials without expiry are kept");

        let d = tempfile::tempdir().unwrap();
        // Expires in a minute: inside the refresh margin, so every call
        // asks the command again.
        let soon = (Utc::now() + chrono::Duration::minutes(1)).to_rfc3339();
        let short = script(
            d.path(),
            "short",
            &format!(
                r#"echo '{{"Version": 1, "AccessKeyId": "AK2", "SecretAccessKey": "S2", "SessionToken": "T2", "Expiration": "{soon}"}}'"#
            ),
        );
        let p = ProcessCredentials::new("p", &short).unwrap();
        assert_eq!(p.credentials().unwrap().token.as_deref(), Some("T2"));
        p.credentials().unwrap();
        assert_eq!(runs(d.path()), 2);

        let d = tempfile::tempdir().unwrap();
        let later = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
        let long = script(
            d.path(),
            "long",
            &format!(
                r#"echo '{{"Version": 1, "AccessKeyId": "AK3", "SecretAccessKey": "S3", "Expiration": "{later}"}}'"#
            ),
        );
        let p = ProcessCredentials::new("p", &long).unwrap();
        p.credentials().unwrap();
        p.credentials().unwrap();
        assert_eq!(runs(d.path()), 1, "an hour left: kept");
    }

    #[test]
    fn failures_are_one_line_naming_profile_command_and_cause() {
        let d = tempfile::tempdir().unwrap();
        let fails = script(
            d.path(),
            "fails",
            "echo 'token expired, run login' >&2\nexit 3",
        );
        let e = ProcessCredentials::new("work", &fails)
            .unwrap()
            .credentials()
            .unwrap_err();
        for part in [
            "\"work\"",
            "fails",
            "exit status: 3",
            "token expired, run login",
        ] {
            assert!(e.contains(part), "{e}");
        }
        assert_eq!(e.lines().count(), 1, "{e}");

        let e = ProcessCredentials::new("work", "/nonexistent/broker")
            .unwrap()
            .credentials()
            .unwrap_err();
        assert!(e.contains("cannot start it"), "{e}");

        // A command that does not finish is killed at the deadline.
        let pid = d.path().join("pid");
        let hangs = script(
            d.path(),
            "hangs",
            &format!("echo $$ > '{}'\nsleep 30", pid.display()),
        );
        let e = ProcessCredentials::new("work", &hangs)
            .unwrap()
            .with_timeout(Duration::from_millis(300))
            .credentials()
            .unwrap_err();
        assert!(e.contains("did not finish"), "{e}");
        let pid: i32 = std::fs::read_to_string(&pid)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SAFETY: signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        assert!(!alive, "the command {pid} is still running");

        let chatty = script(d.path(), "chatty", "head -c 200000 /dev/zero | tr '\\0' x");
        let e = ProcessCredentials::new("work", &chatty)
            .unwrap()
            .credentials()
            .unwrap_err();
        assert!(e.contains("more than"), "{e}");

        for bad in ["", "   ", "broker 'unclosed"] {
            let e = ProcessCredentials::new("work", bad).unwrap_err();
            assert!(e.contains("not a command line"), "{e}");
        }
    }
}
