//! Settings from the AWS shared files, as the AWS CLI reads them: the
//! credentials file (`AWS_SHARED_CREDENTIALS_FILE`, default
//! `~/.aws/credentials`, sections `[NAME]`) and the config file
//! (`AWS_CONFIG_FILE`, default `~/.aws/config`, sections `[default]` and
//! `[profile NAME]`), for the profile `AWS_PROFILE` (else `default`).
//!
//! What is taken: `aws_access_key_id`, `aws_secret_access_key` and
//! `aws_session_token` (the credentials file first, then the config file;
//! the three from one place, never mixed), `credential_process` (a command
//! that prints credentials, `store::credential_process`; used when the
//! credentials file has no key pair for the profile, before a key pair
//! in the config file, in the AWS CLI's order), `region` and
//! `endpoint_url` from the config file. The caller lets the environment win, as the CLI
//! does ([`Resolved`] only fills what the environment left unset).
//! Nested settings (`s3 =` followed by indented lines) and every other
//! key are ignored.
//!
//! A missing file is no error; a file that cannot be read or parsed is a
//! one-line error naming the file and the line. Naming a profile
//! (`AWS_PROFILE`) that neither file has is an error too. Files are read
//! whole up to 1 MiB (larger is an error): nothing is sized from their
//! content. Pure apart from reading the two files.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The largest shared file read.
const MAX_FILE: u64 = 1 << 20;

/// One parsed file: key/value pairs by section name (keys lowercased).
type Sections = HashMap<String, HashMap<String, String>>;

/// Parses an INI file as botocore does for these files; `name` is used in
/// errors.
pub fn parse(text: &str, name: &str) -> Result<Sections, String> {
    let mut out: Sections = HashMap::new();
    let mut section: Option<String> = None;
    // Inside a nested block (`key =` with no value, then indented lines).
    let mut nested = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let indented = raw.starts_with([' ', '\t']);
        if indented && nested {
            continue;
        }
        let at = || format!("{name}:{}", i + 1);
        if let Some(rest) = line.strip_prefix('[') {
            let Some(s) = rest.strip_suffix(']') else {
                return Err(format!("{}: a section header must end with `]`", at()));
            };
            let s = s.trim().to_string();
            out.entry(s.clone()).or_default();
            section = Some(s);
            nested = false;
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!(
                "{}: expected `key = value` or `[section]`, found {:?}",
                at(),
                line.chars().take(40).collect::<String>()
            ));
        };
        let Some(s) = &section else {
            return Err(format!("{}: a setting before any `[section]`", at()));
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        nested = v.is_empty();
        if !nested {
            out.entry(s.clone()).or_default().insert(k, v.to_string());
        }
    }
    Ok(out)
}

/// What the shared files say for the chosen profile.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    /// The profile's `credential_process`, when it is the profile's
    /// source of credentials (the key fields are then None).
    pub credential_process: Option<String>,
    /// The profile the settings are of (`default` unless named).
    pub profile: String,
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
}

/// Reads `path` if it exists (None when it does not).
fn read_file(path: &Path) -> Result<Option<String>, String> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut s = String::new();
    f.take(MAX_FILE + 1)
        .read_to_string(&mut s)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if s.len() as u64 > MAX_FILE {
        return Err(format!(
            "{}: larger than {MAX_FILE} bytes, not an AWS settings file",
            path.display()
        ));
    }
    Ok(Some(s))
}

/// The settings of `profile` (None: `default`, not named by the user)
/// from the credentials file `creds` and the config file `config`.
pub fn resolve_files(
    creds: &Path,
    config: &Path,
    profile: Option<&str>,
) -> Result<Resolved, String> {
    let name = profile.unwrap_or("default");
    let parsed = |p: &Path| -> Result<Option<Sections>, String> {
        read_file(p)?
            .map(|t| parse(&t, &p.display().to_string()))
            .transpose()
    };
    let creds_s = parsed(creds)?;
    let config_s = parsed(config)?;
    let from_creds = creds_s.as_ref().and_then(|s| s.get(name));
    let config_name = if name == "default" {
        "default".to_string()
    } else {
        format!("profile {name}")
    };
    let from_config = config_s.as_ref().and_then(|s| {
        s.get(&config_name)
            // The CLI also accepts `[default]` spelt `[profile default]`.
            .or_else(|| {
                (name == "default")
                    .then(|| s.get("profile default"))
                    .flatten()
            })
    });
    if profile.is_some() && from_creds.is_none() && from_config.is_none() {
        return Err(format!(
            "AWS profile {name:?} is in neither {} nor {}",
            creds.display(),
            config.display()
        ));
    }
    let get = |m: Option<&HashMap<String, String>>, k: &str| {
        m.and_then(|m| m.get(k)).filter(|v| !v.is_empty()).cloned()
    };
    // The key pair from one file: the credentials file if it has one;
    // else a credential process (either file); else the config file's.
    let process =
        get(from_creds, "credential_process").or_else(|| get(from_config, "credential_process"));
    let keys_from = if get(from_creds, "aws_access_key_id").is_some() {
        from_creds
    } else if process.is_some() {
        None
    } else {
        from_config
    };
    Ok(Resolved {
        access_key_id: get(keys_from, "aws_access_key_id"),
        secret_access_key: get(keys_from, "aws_secret_access_key"),
        session_token: get(keys_from, "aws_session_token"),
        credential_process: process.filter(|_| keys_from.is_none()),
        profile: name.to_string(),
        region: get(from_config, "region"),
        endpoint_url: get(from_config, "endpoint_url"),
    })
}

/// The settings of the environment's profile from the environment's
/// files (`AWS_PROFILE`, `AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`,
/// `HOME`).
pub fn resolve_env() -> Result<Resolved, String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let home = var("HOME").map(PathBuf::from);
    let file = |env: &str, name: &str| -> Option<PathBuf> {
        var(env)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
    };
    let profile = var("AWS_PROFILE").or_else(|| var("AWS_DEFAULT_PROFILE"));
    match (
        file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
        file("AWS_CONFIG_FILE", "config"),
    ) {
        (Some(c), Some(f)) => resolve_files(&c, &f, profile.as_deref()),
        // No HOME and no files named: nothing to read.
        _ => Ok(Resolved {
            profile: profile.unwrap_or_else(|| "default".into()),
            ..Resolved::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_and_precedence_between_the_files() {
        let d = tempfile::tempdir().unwrap();
        let creds = d.path().join("credentials");
        let config = d.path().join("config");
        std::fs::write(
            &creds,
            "# comment\n[default]\naws_access_key_id = AKD\naws_secret_access_key = SD\n\n\
             [work]\naws_access_key_id=AKW\naws_secret_access_key=SW\naws_session_token = T\n",
        )
        .unwrap();
        std::fs::write(
            &config,
            "[default]\nregion = eu-west-1\n\n[profile work]\nregion=us-west-2\n\
             endpoint_url = http://127.0.0.1:9000\ns3 =\n  addressing_style = path\n\
             [profile onlyconfig]\naws_access_key_id = AKC\naws_secret_access_key = SC\n",
        )
        .unwrap();
        let r = resolve_files(&creds, &config, None).unwrap();
        assert_eq!(r.access_key_id.as_deref(), Some("AKD"));
        assert_eq!(r.region.as_deref(), Some("eu-west-1"));
        assert_eq!(r.endpoint_url, None);
        let w = resolve_files(&creds, &config, Some("work")).unwrap();
        assert_eq!(
            w,
            Resolved {
                access_key_id: Some("AKW".into()),
                secret_access_key: Some("SW".into()),
                session_token: Some("T".into()),
                credential_process: None,
                profile: "work".into(),
                region: Some("us-west-2".into()),
                endpoint_url: Some("http://127.0.0.1:9000".into()),
            }
        );
        let c = resolve_files(&creds, &config, Some("onlyconfig")).unwrap();
        assert_eq!(c.secret_access_key.as_deref(), Some("SC"));
        let e = resolve_files(&creds, &config, Some("nope")).unwrap_err();
        assert!(e.contains("\"nope\"") && e.contains("credentials"), "{e}");
        // Missing files: nothing, no error.
        let none = d.path().join("none");
        assert_eq!(
            resolve_files(&none, &none, None).unwrap(),
            Resolved {
                profile: "default".into(),
                ..Resolved::default()
            }
        );
    }

    #[test]
    fn credential_process_sits_between_the_two_files_keys() {
        let d = tempfile::tempdir().unwrap();
        let creds = d.path().join("credentials");
        let config = d.path().join("config");
        std::fs::write(
            &creds,
            "[keys]\naws_access_key_id = AKF\naws_secret_access_key = SF\n",
        )
        .unwrap();
        std::fs::write(
            &config,
            "[profile keys]\ncredential_process = broker one\n\
             [profile proc]\ncredential_process = broker --role 'a b'\n\
             aws_access_key_id = AKC\naws_secret_access_key = SC\n\
             [profile plain]\naws_access_key_id = AKP\naws_secret_access_key = SP\n",
        )
        .unwrap();
        // Keys in the credentials file win over a process.
        let k = resolve_files(&creds, &config, Some("keys")).unwrap();
        assert_eq!(k.access_key_id.as_deref(), Some("AKF"));
        assert_eq!(k.credential_process, None);
        // A process wins over keys in the config file.
        let p = resolve_files(&creds, &config, Some("proc")).unwrap();
        assert_eq!(p.credential_process.as_deref(), Some("broker --role 'a b'"));
        assert_eq!((p.access_key_id, p.secret_access_key), (None, None));
        assert_eq!(p.profile, "proc");
        let c = resolve_files(&creds, &config, Some("plain")).unwrap();
        assert_eq!(c.access_key_id.as_deref(), Some("AKP"));
        assert_eq!(c.credential_process, None);
    }

    #[test]
    fn a_bad_file_is_one_line_naming_the_file_and_line() {
        for (text, line, what) in [
            ("[default]\nregion = x\njunk\n", 3, "expected `key = value`"),
            ("region = x\n", 1, "before any `[section]`"),
            ("[default\n", 1, "must end with `]`"),
        ] {
            let e = parse(text, "cfg").unwrap_err();
            assert!(e.starts_with(&format!("cfg:{line}: ")), "{e}");
            assert!(e.contains(what), "{e}");
            assert_eq!(e.lines().count(), 1);
        }
        // Arbitrary bytes never panic.
        for t in ["[", "=", "]\n=", "[a]\n =\n\t=", "[a]\n\u{feff}x=1"] {
            let _ = parse(t, "x");
        }
    }
}
