//! How backing names in STORE map to the names the mount presents.
//!
//! - a regular file `X.zstn` is presented as `X.safetensors`;
//! - a regular file `X.safetensors.zstn` is presented as `X.safetensors` too
//!   (and wins over `X.zstn` if both exist);
//! - a plain `X.safetensors` wins over either archive: the archive is
//!   shadowed and a warning is logged (once per backing path);
//! - everything else (directories, symlinks, other files, and a `.zstn`
//!   that is not a regular file) is presented under its own name.
//!
//! Pure functions over names and file types; no I/O. `lookup` and
//! `readdir` both go through [`resolve_dir`]/[`lookup_candidates`] so the two
//! never disagree.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

pub const ARCHIVE_SUFFIX: &[u8] = b".zstn";
pub const PRESENTED_SUFFIX: &[u8] = b".safetensors";

/// The name a backing archive `X.zstn` / `X.safetensors.zstn` is shown as,
/// or `None` if `name` is not an archive name.
pub fn presented_name(name: &OsStr) -> Option<OsString> {
    let stem = name.as_bytes().strip_suffix(ARCHIVE_SUFFIX)?;
    if stem.is_empty() || stem == PRESENTED_SUFFIX {
        return None;
    }
    let mut out = stem.to_vec();
    if !stem.ends_with(PRESENTED_SUFFIX) {
        out.extend_from_slice(PRESENTED_SUFFIX);
    }
    Some(OsString::from_vec(out))
}

/// True when `name` names an archive (if it is a regular file).
pub fn is_archive_name(name: &OsStr) -> bool {
    presented_name(name).is_some()
}

/// Backing archive names that could present as `name`, best first.
pub fn archive_candidates(name: &OsStr) -> Vec<OsString> {
    let Some(stem) = name.as_bytes().strip_suffix(PRESENTED_SUFFIX) else {
        return Vec::new();
    };
    if stem.is_empty() {
        return Vec::new();
    }
    let mut long = name.as_bytes().to_vec();
    long.extend_from_slice(ARCHIVE_SUFFIX);
    let mut short = stem.to_vec();
    short.extend_from_slice(ARCHIVE_SUFFIX);
    vec![OsString::from_vec(long), OsString::from_vec(short)]
}

/// One presented directory entry and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub presented: OsString,
    pub backing: OsString,
    pub archive: bool,
}

/// A backing entry that is hidden because another one presents the same name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shadowed {
    pub hidden: OsString,
    pub shown: OsString,
}

/// Maps a backing directory listing (name, is a regular file) to the
/// presented listing, sorted by presented name.
pub fn resolve_dir(entries: &[(OsString, bool)]) -> (Vec<Resolved>, Vec<Shadowed>) {
    let mut by_name: HashMap<OsString, Resolved> = HashMap::new();
    let mut shadowed = Vec::new();
    // Plain entries first: they always win.
    for (name, regular) in entries {
        if *regular && is_archive_name(name) {
            continue;
        }
        by_name.insert(
            name.clone(),
            Resolved {
                presented: name.clone(),
                backing: name.clone(),
                archive: false,
            },
        );
    }
    let mut archives: Vec<(OsString, OsString)> = entries
        .iter()
        .filter(|(n, regular)| *regular && is_archive_name(n))
        .map(|(n, _)| (presented_name(n).expect("archive name"), n.clone()))
        .collect();
    // `X.safetensors.zstn` before `X.zstn` for the same presented name.
    archives.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())));
    for (presented, backing) in archives {
        match by_name.get(&presented) {
            Some(winner) => shadowed.push(Shadowed {
                hidden: backing,
                shown: winner.backing.clone(),
            }),
            None => {
                by_name.insert(
                    presented.clone(),
                    Resolved {
                        presented,
                        backing,
                        archive: true,
                    },
                );
            }
        }
    }
    let mut out: Vec<Resolved> = by_name.into_values().collect();
    out.sort_by(|a, b| a.presented.cmp(&b.presented));
    (out, shadowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> OsString {
        OsString::from(s)
    }

    #[test]
    fn archive_names_present_as_safetensors() {
        assert_eq!(presented_name(&os("m.zstn")), Some(os("m.safetensors")));
        assert_eq!(
            presented_name(&os("m.safetensors.zstn")),
            Some(os("m.safetensors"))
        );
        assert_eq!(presented_name(&os(".zstn")), None);
        assert_eq!(presented_name(&os("m.bin")), None);
        assert_eq!(
            archive_candidates(&os("m.safetensors")),
            vec![os("m.safetensors.zstn"), os("m.zstn")]
        );
        assert!(archive_candidates(&os("config.json")).is_empty());
    }

    #[test]
    fn plain_wins_and_long_archive_name_beats_short() {
        let entries = vec![
            (os("a.zstn"), true),
            (os("a.safetensors"), true),
            (os("b.zstn"), true),
            (os("b.safetensors.zstn"), true),
            (os("c.zstn"), false), // a directory named c.zstn
            (os("config.json"), true),
        ];
        let (list, shadowed) = resolve_dir(&entries);
        let names: Vec<_> = list
            .iter()
            .map(|r| (r.presented.clone(), r.backing.clone(), r.archive))
            .collect();
        assert_eq!(
            names,
            vec![
                (os("a.safetensors"), os("a.safetensors"), false),
                (os("b.safetensors"), os("b.safetensors.zstn"), true),
                (os("c.zstn"), os("c.zstn"), false),
                (os("config.json"), os("config.json"), false),
            ]
        );
        assert_eq!(
            shadowed,
            vec![
                Shadowed {
                    hidden: os("a.zstn"),
                    shown: os("a.safetensors")
                },
                Shadowed {
                    hidden: os("b.zstn"),
                    shown: os("b.safetensors.zstn")
                },
            ]
        );
    }
}
