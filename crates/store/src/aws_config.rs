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
//! in the config file, in the AWS CLI's order), a role to assume
//! (`role_arn` with `source_profile` or `credential_source = Environment`,
//! and `role_session_name`, `external_id`, `duration_seconds`;
//! `store::sts`), IAM Identity Center (SSO) settings (`sso_session` naming
//! an `[sso-session NAME]` section, or the legacy `sso_start_url` and
//! `sso_region`, with `sso_account_id` and `sso_role_name`; `store::sso`),
//! `region` and `endpoint_url` from the config file. A role comes before
//! SSO, and both before keys and processes, as in the AWS CLI. The caller
//! lets the environment win, as the CLI does ([`Resolved`] only fills
//! what the environment left unset). Nested settings (`s3 =` followed by
//! indented lines) and every other key are ignored.
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
/// The longest chain of profiles assuming roles from one another.
pub const MAX_ROLE_CHAIN: usize = 5;

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
    /// A role the profile's credentials come from (the key fields and the
    /// process are then None).
    pub role: Option<Role>,
    /// IAM Identity Center (SSO) settings the profile's credentials come
    /// from (the key fields and the process are then None).
    pub sso: Option<Sso>,
}

/// A role to assume (`role_arn`) and what to assume it with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    pub role_arn: String,
    pub session_name: Option<String>,
    pub external_id: Option<String>,
    pub duration_seconds: Option<u32>,
    /// The profile whose credentials assume the role (`source_profile`;
    /// a profile naming itself gives its own keys); None: the
    /// environment's keys (`credential_source = Environment`).
    pub source: Option<Box<Resolved>>,
}

/// IAM Identity Center settings of a profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sso {
    pub start_url: String,
    pub region: String,
    pub account_id: String,
    pub role_name: String,
    /// The `sso-session` section the settings come from: its name keys
    /// the token cache (else the start URL does, for legacy settings).
    pub session: Option<String>,
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
    let parsed = |p: &Path| -> Result<Option<Sections>, String> {
        read_file(p)?
            .map(|t| parse(&t, &p.display().to_string()))
            .transpose()
    };
    let files = Files {
        creds: parsed(creds)?,
        config: parsed(config)?,
        creds_name: creds.display().to_string(),
        config_name: config.display().to_string(),
    };
    let name = profile.unwrap_or("default");
    files.resolve(name, profile.is_some(), &mut Vec::new())
}

/// Both shared files, parsed.
struct Files {
    creds: Option<Sections>,
    config: Option<Sections>,
    creds_name: String,
    config_name: String,
}

type Section = HashMap<String, String>;

impl Files {
    /// The sections of profile `name` in the credentials file and in the
    /// config file.
    fn sections(&self, name: &str) -> (Option<&Section>, Option<&Section>) {
        let from_creds = self.creds.as_ref().and_then(|s| s.get(name));
        let config_name = if name == "default" {
            "default".to_string()
        } else {
            format!("profile {name}")
        };
        let from_config = self.config.as_ref().and_then(|s| {
            s.get(&config_name)
                // The CLI also accepts `[default]` spelt `[profile default]`.
                .or_else(|| {
                    (name == "default")
                        .then(|| s.get("profile default"))
                        .flatten()
                })
        });
        (from_creds, from_config)
    }

    /// The settings of profile `name` (`named`: the user named it, so it
    /// must exist); `chain` holds the profiles whose roles led here.
    fn resolve(
        &self,
        name: &str,
        named: bool,
        chain: &mut Vec<String>,
    ) -> Result<Resolved, String> {
        let (from_creds, from_config) = self.sections(name);
        if named && from_creds.is_none() && from_config.is_none() {
            return Err(format!(
                "AWS profile {name:?} is in neither {} nor {}",
                self.creds_name, self.config_name
            ));
        }
        let get = |m: Option<&Section>, k: &str| {
            m.and_then(|m| m.get(k)).filter(|v| !v.is_empty()).cloned()
        };
        let either = |k: &str| get(from_config, k).or_else(|| get(from_creds, k));
        let mut r = Resolved {
            profile: name.to_string(),
            region: get(from_config, "region"),
            endpoint_url: get(from_config, "endpoint_url"),
            ..Resolved::default()
        };
        if let Some(role_arn) = either("role_arn") {
            r.role = Some(self.role(name, role_arn, &either, chain)?);
            return Ok(r);
        }
        if let Some(sso) = self.sso(name, &either)? {
            r.sso = Some(sso);
            return Ok(r);
        }
        let (keys, process) = Self::keys(from_creds, from_config);
        r.access_key_id = get(keys, "aws_access_key_id");
        r.secret_access_key = get(keys, "aws_secret_access_key");
        r.session_token = get(keys, "aws_session_token");
        r.credential_process = process;
        Ok(r)
    }

    /// Where a profile's key pair comes from: the credentials file if it
    /// has one; else a credential process (either file); else the config
    /// file's.
    fn keys<'a>(
        from_creds: Option<&'a Section>,
        from_config: Option<&'a Section>,
    ) -> (Option<&'a Section>, Option<String>) {
        let get = |m: Option<&Section>, k: &str| {
            m.and_then(|m| m.get(k)).filter(|v| !v.is_empty()).cloned()
        };
        let process = get(from_creds, "credential_process")
            .or_else(|| get(from_config, "credential_process"));
        if get(from_creds, "aws_access_key_id").is_some() {
            (from_creds, None)
        } else if process.is_some() {
            (None, process)
        } else {
            (from_config, None)
        }
    }

    fn role(
        &self,
        name: &str,
        role_arn: String,
        either: &dyn Fn(&str) -> Option<String>,
        chain: &mut Vec<String>,
    ) -> Result<Role, String> {
        let at = |what: String| format!("AWS profile {name:?} (role_arn {role_arn}): {what}");
        if either("mfa_serial").is_some() {
            return Err(at(
                "mfa_serial: the role needs an MFA code, which a daemon cannot ask for \
                 (assume the role beforehand and use its keys)"
                    .into(),
            ));
        }
        let duration_seconds = either("duration_seconds")
            .map(|d| {
                d.parse::<u32>()
                    .ok()
                    .filter(|d| (900..=43_200).contains(d))
                    .ok_or_else(|| at(format!("duration_seconds {d:?} is not 900 to 43200")))
            })
            .transpose()?;
        let source = match (either("source_profile"), either("credential_source")) {
            (Some(_), Some(_)) => {
                return Err(at(
                    "has both source_profile and credential_source; it may have one".into(),
                ))
            }
            (Some(src), None) if src == name => {
                // A profile naming itself assumes the role with its own keys.
                let (from_creds, from_config) = self.sections(name);
                let (keys, process) = Self::keys(from_creds, from_config);
                let get = |k: &str| {
                    keys.and_then(|m| m.get(k))
                        .filter(|v| !v.is_empty())
                        .cloned()
                };
                Some(Box::new(Resolved {
                    profile: name.to_string(),
                    access_key_id: get("aws_access_key_id"),
                    secret_access_key: get("aws_secret_access_key"),
                    session_token: get("aws_session_token"),
                    credential_process: process,
                    ..Resolved::default()
                }))
            }
            (Some(src), None) => {
                chain.push(name.to_string());
                if chain.contains(&src) || chain.len() >= MAX_ROLE_CHAIN {
                    chain.push(src);
                    return Err(at(format!(
                        "source_profile chain {} loops or is longer than {MAX_ROLE_CHAIN}",
                        chain.join(" -> ")
                    )));
                }
                let s = self.resolve(&src, true, chain).map_err(at)?;
                chain.pop();
                Some(Box::new(s))
            }
            (None, Some(c)) if c == "Environment" => None,
            (None, Some(c)) => {
                return Err(at(format!(
                    "credential_source = {c} is not supported (only Environment; \
                     or name a source_profile)"
                )))
            }
            (None, None) => {
                return Err(at(
                    "has neither source_profile nor credential_source to assume it with".into(),
                ))
            }
        };
        Ok(Role {
            role_arn,
            session_name: either("role_session_name"),
            external_id: either("external_id"),
            duration_seconds,
            source,
        })
    }

    /// The profile's IAM Identity Center settings, if it has any.
    fn sso(
        &self,
        name: &str,
        either: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Sso>, String> {
        let session = either("sso_session");
        if session.is_none()
            && either("sso_start_url").is_none()
            && either("sso_account_id").is_none()
        {
            return Ok(None);
        }
        let at = |what: String| format!("AWS profile {name:?} (SSO): {what}");
        let section = match &session {
            Some(s) => Some(
                self.config
                    .as_ref()
                    .and_then(|c| c.get(&format!("sso-session {s}")))
                    .ok_or_else(|| {
                        at(format!(
                            "no [sso-session {s}] section in {}",
                            self.config_name
                        ))
                    })?,
            ),
            None => None,
        };
        let from_session = |k: &str| {
            section
                .and_then(|m| m.get(k))
                .filter(|v| !v.is_empty())
                .cloned()
        };
        let need = |k: &str, v: Option<String>| v.ok_or_else(|| at(format!("{k} is not set")));
        Ok(Some(Sso {
            start_url: need(
                "sso_start_url",
                from_session("sso_start_url").or_else(|| either("sso_start_url")),
            )?,
            region: need(
                "sso_region",
                from_session("sso_region").or_else(|| either("sso_region")),
            )?,
            account_id: need("sso_account_id", either("sso_account_id"))?,
            role_name: need("sso_role_name", either("sso_role_name"))?,
            session,
        }))
    }
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
                role: None,
                sso: None,
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
    fn roles_and_sso_come_before_keys() {
        let d = tempfile::tempdir().unwrap();
        let creds = d.path().join("credentials");
        let config = d.path().join("config");
        std::fs::write(
            &creds,
            "[base]\naws_access_key_id = AKB\naws_secret_access_key = SB\n\
             [self]\naws_access_key_id = AKS\naws_secret_access_key = SS\n",
        )
        .unwrap();
        std::fs::write(
            &config,
            "[profile role]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = base\n\
             external_id = x\nduration_seconds = 3600\nregion = eu-west-1\n\
             [profile chain]\nrole_arn = arn:aws:iam::1:role/c\nsource_profile = role\n\
             [profile self]\nrole_arn = arn:aws:iam::1:role/s\nsource_profile = self\n\
             [profile envsrc]\nrole_arn = arn:aws:iam::1:role/e\ncredential_source = Environment\n\
             [profile loop1]\nrole_arn = arn:aws:iam::1:role/l\nsource_profile = loop2\n\
             [profile loop2]\nrole_arn = arn:aws:iam::1:role/l\nsource_profile = loop1\n\
             [profile imds]\nrole_arn = arn:aws:iam::1:role/i\ncredential_source = Ec2InstanceMetadata\n\
             [profile mfa]\nrole_arn = arn:aws:iam::1:role/m\nsource_profile = base\nmfa_serial = x\n\
             [profile orphan]\nrole_arn = arn:aws:iam::1:role/o\n\
             [profile sso]\nsso_session = corp\nsso_account_id = 111\nsso_role_name = Reader\n\
             aws_access_key_id = AKX\naws_secret_access_key = SX\n\
             [sso-session corp]\nsso_start_url = https://corp.awsapps.com/start\nsso_region = eu-west-1\n\
             [profile legacy]\nsso_start_url = https://l/start\nsso_region = us-east-2\n\
             sso_account_id = 222\nsso_role_name = W\n\
             [profile half]\nsso_account_id = 333\n",
        )
        .unwrap();
        let r = resolve_files(&creds, &config, Some("role")).unwrap();
        let role = r.role.clone().unwrap();
        assert_eq!(role.role_arn, "arn:aws:iam::1:role/r");
        assert_eq!(role.external_id.as_deref(), Some("x"));
        assert_eq!(role.duration_seconds, Some(3600));
        let src = role.source.unwrap();
        assert_eq!(src.profile, "base");
        assert_eq!(src.access_key_id.as_deref(), Some("AKB"));
        assert_eq!(
            (r.access_key_id, r.region.as_deref()),
            (None, Some("eu-west-1"))
        );
        // A chain: chain -> role -> base.
        let c = resolve_files(&creds, &config, Some("chain")).unwrap();
        let inner = c.role.unwrap().source.unwrap();
        assert_eq!(inner.role.unwrap().source.unwrap().profile, "base");
        // A profile naming itself assumes the role with its own keys.
        let s = resolve_files(&creds, &config, Some("self")).unwrap();
        assert_eq!(
            s.role.unwrap().source.unwrap().access_key_id.as_deref(),
            Some("AKS")
        );
        let e = resolve_files(&creds, &config, Some("envsrc")).unwrap();
        assert!(e.role.unwrap().source.is_none());
        for (p, what) in [
            ("loop1", "loop1 -> loop2 -> loop1"),
            ("imds", "Ec2InstanceMetadata is not supported"),
            ("mfa", "MFA"),
            ("orphan", "neither source_profile nor credential_source"),
            ("half", "sso_start_url is not set"),
        ] {
            let e = resolve_files(&creds, &config, Some(p)).unwrap_err();
            assert!(
                e.contains(&format!("{p:?}")) && e.contains(what),
                "{p}: {e}"
            );
            assert_eq!(e.lines().count(), 1);
        }
        // SSO wins over keys in the same profile.
        let s = resolve_files(&creds, &config, Some("sso")).unwrap();
        assert_eq!(s.access_key_id, None);
        assert_eq!(
            s.sso,
            Some(Sso {
                start_url: "https://corp.awsapps.com/start".into(),
                region: "eu-west-1".into(),
                account_id: "111".into(),
                role_name: "Reader".into(),
                session: Some("corp".into()),
            })
        );
        let l = resolve_files(&creds, &config, Some("legacy"))
            .unwrap()
            .sso
            .unwrap();
        assert_eq!((l.region.as_str(), l.session), ("us-east-2", None));
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
