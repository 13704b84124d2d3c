//! How backing names in STORE map to the names the mount presents.
//!
//! - a regular file `X.zstn` is presented as `X.safetensors`;
//! - a regular file `X.safetensors.zstn` is presented as `X.safetensors` too
//!   (and wins over `X.zstn` if both exist);
//! - a regular file `N.zsame` (a `.zstn` archive whose name is kept: a
//!   file with safetensors content written under any other name, such as
//!   the Hugging Face cache's `blobs/<sha256>`) is presented as `N`,
//!   exactly (`N` not empty, `.` or `..`);
//! - a regular file `X.z4dm` (a ckptfs delta against a base archive) is
//!   presented as `X.safetensors` (after `X.safetensors.zstn` and `X.zstn`);
//! - a regular file `X.blz` (a whole model directory) is presented as a
//!   read-only directory `X` (its contents are served by `CheckpointFs`);
//! - a plain entry wins over any archive presenting the same name; of the
//!   archives, `X.safetensors.zstn`, then `X.zstn`, then `N.zsame`, then
//!   `N.blz` (the order of [`archive_candidates`]): the loser is shadowed and a warning is
//!   logged (once per backing path);
//! - everything else (directories, symlinks, other files, and a `.zstn`
//!   that is not a regular file) is presented under its own name.
//!
//! Pure functions over names and file types; no I/O. `lookup` and
//! `readdir` both go through [`resolve_dir`]/[`archive_candidates`] so the two
//! never disagree.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

pub const ARCHIVE_SUFFIX: &[u8] = b".zstn";
pub const PRESENTED_SUFFIX: &[u8] = b".safetensors";
pub const BLZ_SUFFIX: &[u8] = b".blz";
/// A delta archive `X.z4dm`, presented as `X.safetensors`.
pub const DELTA_SUFFIX: &[u8] = b".z4dm";
/// A `.zstn` archive presented under its own name less this suffix.
pub const KEPT_SUFFIX: &[u8] = b".zsame";

/// The stem of `N.zsame` (the name it presents), if `name` is one.
fn kept_stem(name: &OsStr) -> Option<&[u8]> {
    name.as_bytes()
        .strip_suffix(KEPT_SUFFIX)
        .filter(|stem| !stem.is_empty() && *stem != b"." && *stem != b"..")
}

/// True when `name` is a `.blz` model archive name (`X.blz`, `X` not
/// empty, `.` or `..`: `..blz` would be presented as the directory `.`).
pub fn is_blz_name(name: &OsStr) -> bool {
    name.as_bytes()
        .strip_suffix(BLZ_SUFFIX)
        .is_some_and(|stem| !stem.is_empty() && stem != b"." && stem != b"..")
}

/// The name a backing archive `X.zstn` / `X.safetensors.zstn` / `N.zsame`
/// / `X.blz` is shown as, or `None` if `name` is not an archive name.
pub fn presented_name(name: &OsStr) -> Option<OsString> {
    if let Some(stem) = kept_stem(name) {
        return Some(OsString::from_vec(stem.to_vec()));
    }
    if is_blz_name(name) {
        let stem = name.as_bytes().strip_suffix(BLZ_SUFFIX)?;
        return Some(OsString::from_vec(stem.to_vec()));
    }
    if let Some(stem) = name.as_bytes().strip_suffix(DELTA_SUFFIX) {
        if stem.is_empty() || stem == b"." || stem == b".." {
            return None;
        }
        let mut out = stem.to_vec();
        out.extend_from_slice(PRESENTED_SUFFIX);
        return Some(OsString::from_vec(out));
    }
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

/// True when a regular file `name` written through the mount is staged and
/// compressed: `X.safetensors` with `X` not empty.
pub fn is_staging_name(name: &OsStr) -> bool {
    name.as_bytes()
        .strip_suffix(PRESENTED_SUFFIX)
        .is_some_and(|stem| !stem.is_empty())
}

/// The archive name a staged file `name` with safetensors content is
/// committed as when no archive presents it yet: `X.zstn` for
/// `X.safetensors`, `N.zsame` for any other name `N`.
pub fn archive_name_for(name: &OsStr) -> OsString {
    if is_staging_name(name) {
        zstn_name_for(name)
    } else {
        kept_name_for(name)
    }
}

/// `N.zsame`: the archive presenting `name` under its own name.
pub fn kept_name_for(name: &OsStr) -> OsString {
    let mut out = name.as_bytes().to_vec();
    out.extend_from_slice(KEPT_SUFFIX);
    OsString::from_vec(out)
}

/// The archive name a staged `X.safetensors` is committed as: `X.zstn`.
pub fn zstn_name_for(name: &OsStr) -> OsString {
    let stem = name
        .as_bytes()
        .strip_suffix(PRESENTED_SUFFIX)
        .unwrap_or(name.as_bytes());
    let mut out = stem.to_vec();
    out.extend_from_slice(ARCHIVE_SUFFIX);
    OsString::from_vec(out)
}

/// The delta archive name of a staged `X.safetensors`: `X.z4dm`.
pub fn delta_name_for(name: &OsStr) -> OsString {
    let stem = name
        .as_bytes()
        .strip_suffix(PRESENTED_SUFFIX)
        .unwrap_or(name.as_bytes());
    let mut out = stem.to_vec();
    out.extend_from_slice(DELTA_SUFFIX);
    OsString::from_vec(out)
}

/// Backing archive names that could present as `name`, best first.
pub fn archive_candidates(name: &OsStr) -> Vec<OsString> {
    let mut out = Vec::new();
    if let Some(stem) = name.as_bytes().strip_suffix(PRESENTED_SUFFIX) {
        if !stem.is_empty() {
            let mut long = name.as_bytes().to_vec();
            long.extend_from_slice(ARCHIVE_SUFFIX);
            let mut short = stem.to_vec();
            short.extend_from_slice(ARCHIVE_SUFFIX);
            let mut delta = stem.to_vec();
            delta.extend_from_slice(DELTA_SUFFIX);
            out.push(OsString::from_vec(long));
            out.push(OsString::from_vec(short));
            out.push(OsString::from_vec(delta));
        }
    }
    if !name.is_empty() && name.as_bytes() != b"." && name.as_bytes() != b".." {
        out.push(kept_name_for(name));
        let mut blz = name.as_bytes().to_vec();
        blz.extend_from_slice(BLZ_SUFFIX);
        out.push(OsString::from_vec(blz));
    }
    out
}

/// Priority of backing archive `backing` for presented name `presented`
/// (lower wins), following [`archive_candidates`].
fn rank(presented: &OsStr, backing: &OsStr) -> usize {
    archive_candidates(presented)
        .iter()
        .position(|c| c == backing)
        .unwrap_or(usize::MAX)
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
    // `X.safetensors.zstn` before `X.zstn` before `X.safetensors.zsame`
    // before `X.safetensors.blz` for the same presented name.
    archives.sort_by(|a, b| a.0.cmp(&b.0).then(rank(&a.0, &a.1).cmp(&rank(&b.0, &b.1))));
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
            vec![
                os("m.safetensors.zstn"),
                os("m.zstn"),
                os("m.z4dm"),
                os("m.safetensors.zsame"),
                os("m.safetensors.blz")
            ]
        );
        assert_eq!(
            archive_candidates(&os("config.json")),
            vec![os("config.json.zsame"), os("config.json.blz")]
        );
        assert_eq!(presented_name(&os("m.z4dm")), Some(os("m.safetensors")));
        for n in [".z4dm", "..z4dm"] {
            assert_eq!(presented_name(&os(n)), None, "{n}");
        }
        assert_eq!(presented_name(&os("model.blz")), Some(os("model")));
        assert_eq!(presented_name(&os(".blz")), None);
        assert!(is_blz_name(&os("model.blz")) && !is_blz_name(&os(".blz")));
        // A stem of `.` or `..` would present the entries `.` and `..`.
        for n in ["..blz", "...blz"] {
            assert!(!is_blz_name(&os(n)), "{n}");
            assert_eq!(presented_name(&os(n)), None, "{n}");
        }
        assert_eq!(presented_name(&os("....blz")), Some(os("...")));
    }

    #[test]
    fn kept_archives_present_under_their_stem_exactly() {
        let sha = "7c4a0b7d2c1e5f3a9b8e6d4c2a0f1e3d5b7a9c8e6f4d2b0a1c3e5f7a9b8d6c4e";
        assert_eq!(presented_name(&os(&format!("{sha}.zsame"))), Some(os(sha)));
        assert_eq!(
            presented_name(&os("m.safetensors.zsame")),
            Some(os("m.safetensors"))
        );
        assert_eq!(presented_name(&os("x.zstn.zsame")), Some(os("x.zstn")));
        for bad in [".zsame", "..zsame", "...zsame", "m.zsame.x"] {
            assert_eq!(presented_name(&os(bad)), None, "{bad}");
        }
        assert_eq!(presented_name(&os("....zsame")), Some(os("...")));
        assert!(is_archive_name(&os("a.bin.zsame")));
        assert_eq!(archive_name_for(&os("a.safetensors")), os("a.zstn"));
        assert_eq!(archive_name_for(&os(sha)), os(&format!("{sha}.zsame")));
        assert_eq!(
            archive_name_for(&os("x.safetensors.incomplete")),
            os("x.safetensors.incomplete.zsame")
        );
    }

    #[test]
    fn plain_beats_kept_archive_and_zstn_beats_kept() {
        let entries = vec![
            (os("a.zsame"), true),
            (os("a"), true),
            (os("b.zsame"), true),
            (os("b.blz"), true),
            (os("m.safetensors.zsame"), true),
            (os("m.zstn"), true),
            (os("d.zsame"), false), // a directory: shown as itself
        ];
        let (list, shadowed) = resolve_dir(&entries);
        let names: Vec<_> = list
            .iter()
            .map(|r| (r.presented.clone(), r.backing.clone(), r.archive))
            .collect();
        assert_eq!(
            names,
            vec![
                (os("a"), os("a"), false),
                (os("b"), os("b.zsame"), true),
                (os("d.zsame"), os("d.zsame"), false),
                (os("m.safetensors"), os("m.zstn"), true),
            ]
        );
        assert_eq!(shadowed.len(), 3);
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
            (os("model.blz"), true),
            (os("d.blz"), true),
            (os("d"), false), // a directory d hides d.blz
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
                (os("d"), os("d"), false),
                (os("model"), os("model.blz"), true),
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
                Shadowed {
                    hidden: os("d.blz"),
                    shown: os("d")
                },
            ]
        );
    }
}
