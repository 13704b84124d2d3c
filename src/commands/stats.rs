//! `ckptfs stats MNT`: the daemon's counters, as its mount's root answers
//! them (`user.ckptfs.stats`, readable by the mount's owner and root;
//! `fs::stats`): one `name value` line each, or one JSON object.

use super::{Global, Result};
use crate::cli::StatsArgs;
use crate::fs::stats::{ERRNO_PREFIX, XATTR_STATS};
use anyhow::Context as _;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::ExitCode;

pub fn run(_g: Global, a: StatsArgs) -> Result<ExitCode> {
    let path = a
        .mountpoint
        .canonicalize()
        .with_context(|| a.mountpoint.display().to_string())?;
    let root = super::mount::ckptfs_mount_of(&path)
        .ok_or_else(|| anyhow::anyhow!("{}: not in a ckptfs mount", a.mountpoint.display()))?;
    let text = getxattr(&root, XATTR_STATS)
        .with_context(|| format!("{}: cannot read the daemon's counters", root.display()))?;
    let pairs =
        parse(&text).with_context(|| format!("{}: the daemon's counters", root.display()))?;
    if a.json {
        let mut o = serde_json::Map::new();
        let mut errors = serde_json::Map::new();
        for (k, v) in &pairs {
            let n: serde_json::Value = match v.parse::<u64>() {
                Ok(i) => i.into(),
                Err(_) => v
                    .parse::<f64>()
                    .map(Into::into)
                    .unwrap_or(v.as_str().into()),
            };
            match k.strip_prefix(ERRNO_PREFIX) {
                Some(e) => errors.insert(e.to_string(), n),
                None => o.insert(k.clone(), n),
            };
        }
        o.insert("errors".into(), errors.into());
        println!("{}", serde_json::Value::Object(o));
    } else {
        let w = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in &pairs {
            println!("{k:w$}  {v}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `name=value` pairs, in order.
fn parse(text: &str) -> Result<Vec<(String, String)>> {
    text.split_whitespace()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| anyhow::anyhow!("{kv:?} is not NAME=VALUE"))
        })
        .collect()
}

fn getxattr(path: &Path, name: &str) -> std::io::Result<String> {
    let p = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let n = std::ffi::CString::new(name)?;
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: both strings are NUL-terminated; `buf` is writable for its length.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if len < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(len as usize);
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
