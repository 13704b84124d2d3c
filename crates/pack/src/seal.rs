//! Sealing: adds ckptfs's CKX1 checksum block to a z4ai-written `.zstn`,
//! which has no checksums, without re-encoding anything.
//!
//! The block goes exactly where ckptfs's writer puts it ([`super::zstn`]):
//! between the last frame and the index (`contiguous = 1`), or after the
//! frame (`contiguous = 0`). Every other byte keeps its offset and value:
//! the head, the frames and the index are copied, and only the footer's
//! `index_offset` moves past the block. So z4ai reads the sealed file as
//! before (it follows the footer and ignores unreferenced bytes), and
//! ckptfs's reader treats it exactly like a file it wrote. The block's
//! `flags` carry [`ckx::FLAG_SEALED`], which only `ckptfs info` reads.
//!
//! The digests certify the content as it decodes now: every block of the
//! input is decoded (the reader's own grid and decoder) and hashed, and
//! nothing is written unless all of it decodes, the header agrees with the
//! index, and, when the caller gives one, the sha256 of the whole presented
//! `.safetensors` matches. A file whose frames leave bytes unreferenced is
//! refused: no digest would cover them.
//!
//! [`Seal::prepare`] and [`Seal::write`] work on an opened archive and any
//! writer; [`seal_file`] replaces a file atomically (temporary sibling,
//! fsync, rename, fsync of the directory) after checking what it wrote.

use ckptfs_archive::{blocks_of, ArchiveError, ArchiveView, BlockKey, Grid, ZstnArchive};
use ckptfs_format::ckx;
use ckptfs_format::digest::xxh3_64;
use ckptfs_format::digest::Xxh3;
use ckptfs_format::frame::{block_grid, Frame};
use ckptfs_format::fsutil;
use ckptfs_format::zstn::{self, Layout, RecordKind, FOOTER_LEN};
use rayon::prelude::*;
use sha2::{Digest as _, Sha256};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum SealError {
    /// The input does not open or decode (the message names the file).
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("{path}: {what}; not sealed")]
    Unsealable { path: PathBuf, what: String },
    #[error(
        "{path}: the presented .safetensors has sha256 {actual}, expected {expected}; not sealed"
    )]
    Sha256Mismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("{path}: {links} hard links: replacing it would leave the others unsealed (use --force to seal this name anyway)")]
    HardLinks { path: PathBuf, links: u64 },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

#[derive(Debug, Clone, Copy, Default)]
pub struct SealOptions {
    /// The sha256 the presented `.safetensors` must have.
    pub expect_sha256: Option<[u8; 32]>,
    /// Seal a file with several hard links (only the named link changes).
    pub force: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SealOutcome {
    /// The file already has a CKX1 block; nothing was written.
    AlreadySealed {
        /// Sealed earlier (else written by ckptfs).
        sealed: bool,
    },
    Sealed(SealStats),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SealStats {
    /// Frames (units) the block covers.
    pub frames: usize,
    pub blocks: usize,
    /// Size of the CKX1 block, the only bytes added.
    pub added_bytes: u64,
    pub stored_bytes: u64,
}

/// What sealing an opened archive writes: the archive's bytes with the
/// CKX1 block inserted at `insert_at` and, for `contiguous = 1`, a new
/// footer.
#[derive(Debug)]
pub struct Seal {
    insert_at: u64,
    block: Vec<u8>,
    footer: Option<[u8; FOOTER_LEN as usize]>,
    pub stats: SealStats,
}

/// Parses a sha256 written as 64 hex digits (either case).
pub fn parse_sha256(hex: &str) -> Result<[u8; 32], String> {
    let h = hex.trim();
    if h.len() != 64 || !h.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("{hex:?} is not a sha256 (64 hex digits)"));
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    Ok(out)
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decoded bytes held at once while hashing.
const WINDOW: u64 = 64 << 20;

impl Seal {
    /// Decodes every block of `a` and computes its CKX1 block. `None` when
    /// `a` already has one. `progress` receives presented bytes as they are
    /// done.
    pub fn prepare(
        a: &ZstnArchive,
        expect_sha256: Option<&[u8; 32]>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<Option<Seal>, SealError> {
        if a.extension().is_some() {
            return Ok(None);
        }
        let unsealable = |what: String| SealError::Unsealable {
            path: a.path().to_path_buf(),
            what,
        };
        let bytes = a.stored_bytes();
        let file_len = bytes.len() as u64;
        if let Layout::Indexed {
            records,
            frames_start,
            index_offset,
            ..
        } = &a.container().layout
        {
            if let Some(gap) = uncovered(records, *frames_start, *index_offset) {
                return Err(unsealable(format!(
                    "{} bytes at offset {} belong to no frame, and no checksum would cover them",
                    gap.1, gap.0
                )));
            }
        }
        a.verify_structure()?;
        let mut sha = expect_sha256.map(|_| Sha256::new());
        let data = block_digests(a, sha.as_mut(), progress)?;
        if let (Some(want), Some(sha)) = (expect_sha256, sha) {
            let got: [u8; 32] = sha.finalize().into();
            if &got != want {
                return Err(SealError::Sha256Mismatch {
                    path: a.path().to_path_buf(),
                    expected: hex(want),
                    actual: hex(&got),
                });
            }
        }
        let mut units = Vec::with_capacity(data.len());
        for (u, data) in data.into_iter().enumerate() {
            let grid = a.grid(u as u32)?;
            let frame_bytes = a.frame_bytes(u as u32);
            let frame = Frame::parse(frame_bytes).map_err(|e| a.frame_error(u as u32, e))?;
            let decoded_len = *grid.bounds.last().expect("a grid has two bounds");
            let (bounds, eb, access) =
                block_grid(&frame, decoded_len).map_err(|e| a.frame_error(u as u32, e))?;
            if bounds != grid.bounds {
                return Err(unsealable(format!(
                    "internal check failed: {} has two block grids",
                    a.unit_label(u as u32)
                )));
            }
            units.push(ckx::unit_digests_from(
                frame_bytes,
                access.as_ref(),
                &bounds,
                eb,
                &data,
            ));
        }
        let counts: Vec<usize> = units.iter().map(|u| u.blocks.len()).collect();
        let added = ckx::encoded_len(&counts) as u64;
        let (insert_at, head_end, footer, index_digest) = match &a.container().layout {
            Layout::Indexed {
                frames_start,
                index_offset,
                index_len,
                ..
            } => {
                let footer = zstn::render_footer(index_offset + added, *index_len);
                let mut h = Xxh3::new();
                h.update(&bytes[*index_offset as usize..(file_len - FOOTER_LEN) as usize]);
                h.update(&footer);
                (*index_offset, *frames_start, Some(footer), h.digest())
            }
            Layout::Opaque { frame_offset, .. } => (file_len, *frame_offset, None, xxh3_64(&[])),
        };
        let block = ckx::render_with_flags(
            ckx::FLAG_SEALED,
            xxh3_64(&bytes[..head_end as usize]),
            index_digest,
            &units,
        );
        debug_assert_eq!(block.len() as u64, added);
        Ok(Some(Seal {
            insert_at,
            block,
            footer,
            stats: SealStats {
                frames: units.len(),
                blocks: counts.iter().sum(),
                added_bytes: added,
                stored_bytes: file_len + added,
            },
        }))
    }

    /// Writes the sealed file: `a`'s bytes with the block inserted.
    pub fn write(&self, a: &ZstnArchive, out: &mut dyn Write) -> io::Result<()> {
        let bytes = a.stored_bytes();
        let at = self.insert_at as usize;
        out.write_all(&bytes[..at])?;
        out.write_all(&self.block)?;
        match &self.footer {
            Some(footer) => {
                out.write_all(&bytes[at..bytes.len() - FOOTER_LEN as usize])?;
                out.write_all(footer)
            }
            None => out.write_all(&bytes[at..]),
        }
    }
}

/// The first stretch of `[frames_start, index_offset)` that no FRAME
/// record covers, as (offset, length).
fn uncovered(
    records: &[zstn::IndexRecord],
    frames_start: u64,
    index_offset: u64,
) -> Option<(u64, u64)> {
    let mut frames: Vec<(u64, u64)> = records
        .iter()
        .filter_map(|r| match r.kind {
            RecordKind::Frame { offset, len } => Some((offset, offset + len)),
            RecordKind::Ref(_) => None,
        })
        .collect();
    frames.sort_unstable();
    let mut pos = frames_start;
    for (start, end) in frames {
        if start > pos {
            return Some((pos, start - pos));
        }
        pos = pos.max(end);
    }
    (pos < index_offset).then(|| (pos, index_offset - pos))
}

/// Decodes every block of every unit and returns, for each unit, the
/// xxh3 of each of its blocks. Blocks go in presented-file order, so
/// that `sha` (when given) hashes the whole presented file on the way; a
/// unit shared by two records (REF) is decoded again only for `sha`.
fn block_digests(
    a: &ZstnArchive,
    mut sha: Option<&mut Sha256>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<Vec<u64>>, ArchiveError> {
    let grids: Vec<Arc<Grid>> = (0..a.units() as u32)
        .map(|u| a.grid(u))
        .collect::<Result<_, _>>()?;
    let mut digests: Vec<Vec<Option<u64>>> = grids.iter().map(|g| vec![None; g.blocks()]).collect();
    let prefix = a.prefix(0)?;
    if let Some(h) = sha.as_deref_mut() {
        h.update(prefix);
    }
    progress(prefix.len() as u64);
    let mut keys = blocks_of(a, 0)?;
    // Units no presented byte comes from (empty tensors) still get digests.
    let shown = keys.len();
    for (u, g) in grids.iter().enumerate() {
        for block in 0..g.blocks() as u32 {
            keys.push(BlockKey {
                unit: u as u32,
                block,
            });
        }
    }
    let mut k = 0;
    while k < keys.len() {
        let mut j = k;
        let mut bytes = 0;
        while j < keys.len() && (j == k || bytes < WINDOW) {
            bytes += grids[keys[j].unit as usize]
                .span(keys[j].block as usize)
                .end
                - grids[keys[j].unit as usize]
                    .span(keys[j].block as usize)
                    .start;
            j += 1;
        }
        let todo: Vec<usize> = (k..j)
            .filter(|&i| {
                (sha.is_some() && i < shown)
                    || digests[keys[i].unit as usize][keys[i].block as usize].is_none()
            })
            .collect();
        let decoded: Vec<(usize, Vec<u8>, u64)> = todo
            .par_iter()
            .map(|&i| {
                let d = a.decode_block(keys[i])?;
                let h = xxh3_64(&d);
                Ok((i, d, h))
            })
            .collect::<Result<_, ArchiveError>>()?;
        let mut decoded = decoded.into_iter().peekable();
        for (i, key) in keys.iter().enumerate().take(j).skip(k) {
            let span = grids[key.unit as usize].span(key.block as usize);
            let len = span.end - span.start;
            if let Some((_, d, h)) = decoded.next_if(|(at, _, _)| *at == i) {
                if i < shown {
                    if let Some(s) = sha.as_deref_mut() {
                        s.update(&d);
                    }
                }
                digests[key.unit as usize][key.block as usize] = Some(h);
            }
            if i < shown {
                progress(len);
            }
        }
        k = j;
    }
    Ok(digests
        .into_iter()
        .map(|d| d.into_iter().map(|h| h.expect("every block")).collect())
        .collect())
}

/// Seals the `.zstn` at `path` in place (a symlink: its target), unless it
/// already has a CKX1 block. The file is replaced atomically and keeps its
/// mode; what was written is read back (structure and every frame's digest)
/// before it replaces the original, and a file that changed meanwhile is
/// left alone.
pub fn seal_file(
    path: &Path,
    opts: SealOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SealOutcome, SealError> {
    let io_err = |source| SealError::Io {
        path: path.to_path_buf(),
        source,
    };
    let target = std::fs::canonicalize(path).map_err(io_err)?;
    let file = std::fs::File::open(&target).map_err(io_err)?;
    let before = file.metadata().map_err(io_err)?;
    let a = ZstnArchive::from_source(
        ckptfs_archive::source::map_file(&file).map_err(io_err)?,
        path,
    )?;
    if let Some(ext) = a.extension() {
        return Ok(SealOutcome::AlreadySealed {
            sealed: ext.sealed(),
        });
    }
    if before.nlink() > 1 && !opts.force {
        return Err(SealError::HardLinks {
            path: path.to_path_buf(),
            links: before.nlink(),
        });
    }
    let Some(seal) = Seal::prepare(&a, opts.expect_sha256.as_ref(), progress)? else {
        unreachable!("checked above: no CKX1 block");
    };
    fsutil::replace_atomic(&target, |w| {
        seal.write(&a, w)?;
        w.flush()?;
        check_written(w.get_ref(), path, seal.stats.frames).map_err(io::Error::other)?;
        let now = std::fs::metadata(&target)?;
        let same = |m: &std::fs::Metadata| (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec());
        if same(&now) != same(&before) {
            return Err(io::Error::other("changed while it was being sealed"));
        }
        Ok(())
    })
    .map_err(io_err)?;
    Ok(SealOutcome::Sealed(seal.stats))
}

/// Opens what was written as an archive: its CKX1 block is found and
/// marked sealed, the head and index digests match, and so does every
/// frame's digest (so the frames copied are the frames that were decoded).
fn check_written(file: &std::fs::File, path: &Path, frames: usize) -> Result<(), ArchiveError> {
    let io = |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    };
    let a = ZstnArchive::from_source(ckptfs_archive::source::map_file(file).map_err(io)?, path)?;
    if !a.extension().is_some_and(|e| e.sealed()) || a.units() != frames {
        return Err(a.integrity(
            "internal check failed: the sealed file reads back without its checksum block".into(),
        ));
    }
    (0..frames as u32)
        .into_par_iter()
        .try_for_each(|u| a.verify_unit(u, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_hex_is_parsed_and_checked() {
        let h = "00ff".repeat(16);
        let d = parse_sha256(&h.to_uppercase()).unwrap();
        assert_eq!(hex(&d), h);
        assert!(parse_sha256("abc").is_err());
        assert!(parse_sha256(&"g".repeat(64)).is_err());
    }

    #[test]
    fn unreferenced_bytes_between_frames_are_found() {
        let rec = |offset, len| zstn::IndexRecord {
            name_at: 0,
            name_len: 0,
            begin: 0,
            end: 0,
            kind: RecordKind::Frame { offset, len },
        };
        assert_eq!(uncovered(&[rec(10, 5), rec(15, 5)], 10, 20), None);
        assert_eq!(uncovered(&[rec(15, 5), rec(10, 5)], 10, 20), None);
        assert_eq!(uncovered(&[], 10, 10), None);
        assert_eq!(uncovered(&[rec(10, 4), rec(15, 5)], 10, 20), Some((14, 1)));
        assert_eq!(uncovered(&[rec(11, 9)], 10, 20), Some((10, 1)));
        assert_eq!(uncovered(&[rec(10, 5)], 10, 20), Some((15, 5)));
    }
}
