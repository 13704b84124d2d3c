//! An index of a model-directory archive's file paths, so that the
//! mount's lookups and listings inside a `.blz` do not scan every file.
//!
//! A `.blz` of 10^6 files made each lookup in its directory scan all the
//! paths (and rebuild, sort and copy the list of directories): about 145
//! ms a lookup. [`PathIndex`] is built once per opened archive (on first
//! use: a `.blz` only listed never pays for it) and holds the file indices
//! sorted by path, the sorted directories and the sum of the file sizes:
//! a lookup is a binary search, a listing walks only the entries under its
//! directory (contiguous in path order). Its vectors are sized by the
//! archive, so they are allocated fallibly ([`ckptfs_format::memory`]); when that
//! fails the caller falls back to scanning, correct but slow.
//!
//! Pure over the archive's paths (a closure from file index to path):
//! nothing here knows the archive's kind.

use ckptfs_format::memory::{try_vec, OutOfMemory};

#[derive(Debug)]
pub struct PathIndex {
    /// File indices, sorted by path (byte order).
    by_path: Vec<u32>,
    /// Every directory that holds a file, sorted, each once.
    dirs: Vec<String>,
    /// The sum of the files' sizes.
    total_len: u64,
}

impl PathIndex {
    /// Indexes `files` files whose paths and sizes `path` and `len` give.
    pub fn build<'a>(
        files: usize,
        path: impl Fn(usize) -> &'a str,
        len: impl Fn(usize) -> u64,
    ) -> Result<PathIndex, OutOfMemory> {
        let mut by_path = try_vec(files)?;
        by_path.extend(0..files as u32);
        by_path.sort_unstable_by(|&a, &b| path(a as usize).cmp(path(b as usize)));
        let mut dirs: Vec<String> = Vec::new();
        let mut total_len = 0u64;
        // The paths under a directory are contiguous in path order, so a
        // directory is new exactly where it differs from the previous
        // path's directory at the same depth.
        let mut prev = "";
        for &i in &by_path {
            let p = path(i as usize);
            total_len = total_len.saturating_add(len(i as usize));
            for (k, _) in p.match_indices('/') {
                let d = &p[..k];
                if prev.get(..k) == Some(d) && prev.as_bytes().get(k) == Some(&b'/') {
                    continue;
                }
                dirs.try_reserve(1).map_err(|_| OutOfMemory {
                    bytes: d.len() as u64,
                })?;
                dirs.push(d.to_string());
            }
            prev = p;
        }
        dirs.sort_unstable();
        dirs.dedup();
        Ok(PathIndex {
            by_path,
            dirs,
            total_len,
        })
    }

    /// The index of the file at `target`.
    pub fn find<'a>(&self, path: impl Fn(usize) -> &'a str, target: &str) -> Option<usize> {
        self.by_path
            .binary_search_by(|&i| path(i as usize).cmp(target))
            .ok()
            .map(|k| self.by_path[k] as usize)
    }

    pub fn directories(&self) -> &[String] {
        &self.dirs
    }

    pub fn is_dir(&self, target: &str) -> bool {
        self.dirs
            .binary_search_by(|x| x.as_str().cmp(target))
            .is_ok()
    }

    pub fn total_len(&self) -> u64 {
        self.total_len
    }

    /// The entries directly in directory `dir` ("" for the root): (name,
    /// is a directory), sorted by name.
    pub fn children<'a>(&self, path: impl Fn(usize) -> &'a str, dir: &str) -> Vec<(String, bool)> {
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let child = |p: &str| -> Option<String> {
            let rest = p.strip_prefix(&prefix)?;
            (!rest.is_empty() && !rest.contains('/')).then(|| rest.to_string())
        };
        let lo = self
            .by_path
            .partition_point(|&i| path(i as usize) < prefix.as_str());
        let files = self.by_path[lo..]
            .iter()
            .map(|&i| path(i as usize))
            .take_while(|p| p.starts_with(&prefix))
            .filter_map(|p| child(p).map(|n| (n, false)));
        let lo = self.dirs.partition_point(|d| d.as_str() < prefix.as_str());
        let dirs = self.dirs[lo..]
            .iter()
            .take_while(|d| d.starts_with(&prefix))
            .filter_map(|d| child(d).map(|n| (n, true)));
        let mut kids: Vec<(String, bool)> = files.chain(dirs).collect();
        kids.sort();
        kids
    }
}

/// [`PathIndex::children`] by a scan of every path (when no index could
/// be allocated).
pub fn scan_children<'a>(paths: impl Iterator<Item = &'a str>, dir: &str) -> Vec<(String, bool)> {
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    let mut kids: Vec<(String, bool)> = paths
        .filter_map(|p| {
            let rest = p.strip_prefix(&prefix)?;
            match rest.split_once('/') {
                Some((d, _)) => Some((d.to_string(), true)),
                None => (!rest.is_empty()).then(|| (rest.to_string(), false)),
            }
        })
        .collect();
    kids.sort();
    kids.dedup();
    kids
}

/// [`PathIndex::directories`] by a scan of every path.
pub fn scan_directories<'a>(paths: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut dirs: Vec<String> = paths
        .flat_map(|p| p.match_indices('/').map(move |(k, _)| p[..k].to_string()))
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_and_listings_agree_with_a_scan() {
        let paths = [
            "b/x",
            "a",
            "b/c/d",
            "b/c/e",
            "config.json",
            "b/y",
            "ba/z",
            "b0",
        ];
        let ix = PathIndex::build(paths.len(), |i| paths[i], |i| i as u64 + 1).unwrap();
        for (i, p) in paths.iter().enumerate() {
            assert_eq!(ix.find(|i| paths[i], p), Some(i));
        }
        assert_eq!(ix.find(|i| paths[i], "b"), None);
        assert_eq!(ix.find(|i| paths[i], "b/c"), None);
        assert_eq!(ix.directories(), ["b", "b/c", "ba"]);
        assert!(ix.is_dir("b/c") && !ix.is_dir("b/x") && !ix.is_dir("c"));
        assert_eq!(ix.total_len(), 36);
        let names = |d: &str| -> Vec<(String, bool)> { ix.children(|i| paths[i], d) };
        let own = |v: &[(&str, bool)]| -> Vec<(String, bool)> {
            v.iter().map(|(n, d)| (n.to_string(), *d)).collect()
        };
        assert_eq!(
            names(""),
            own(&[
                ("a", false),
                ("b", true),
                ("b0", false),
                ("ba", true),
                ("config.json", false)
            ])
        );
        assert_eq!(names("b"), own(&[("c", true), ("x", false), ("y", false)]));
        assert_eq!(names("b/c"), own(&[("d", false), ("e", false)]));
        assert_eq!(names("ba"), own(&[("z", false)]));
        assert!(names("nope").is_empty());
        for d in ["", "b", "b/c", "ba", "nope"] {
            assert_eq!(scan_children(paths.iter().copied(), d), names(d), "{d}");
        }
        assert_eq!(scan_directories(paths.iter().copied()), ix.directories());
    }
}
