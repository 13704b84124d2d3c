//! Opening a checkpoint and decoding ranges of its tensors into caller
//! memory.
//!
//! A [`Reader`] is a safetensors file as the CLI would present it: its
//! parsed header (checked once, at open) and a [`Source`] of its bytes,
//! an opened archive (any kind `ckptfs::archive::open` reads), a plain
//! safetensors file read with `pread`, or bytes in memory.
//!
//! [`Reader::read_into`] turns every requested range into the archive's
//! pieces (`archive::plan`), groups them by block so that a block shared
//! by two ranges is decoded once, and decodes the blocks on rayon's pool,
//! each copied into its destinations and its buffer recycled: memory
//! beyond the destinations is a block per worker thread.

use crate::errors::{format, io, NativeError, Result};
use ckptfs::archive::{self, ArchiveView, BlockKey, PieceSource};
use ckptfs::format::safetensors::{header_len, Header};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Plain files are read in pieces of this size, in parallel.
const READ_PIECE: u64 = 8 << 20;

enum Source {
    Archive {
        a: Arc<dyn ArchiveView>,
        file: usize,
    },
    File(std::fs::File),
    Bytes(Vec<u8>),
}

pub struct Reader {
    /// How messages name what was opened (its path or URL).
    pub name: String,
    pub header: Header,
    /// Offset of the data section in the presented file.
    data_start: u64,
    source: Source,
    /// The local copy of an `s3://` object, removed when the reader is.
    _tmp: Option<tempfile::TempDir>,
}

/// One range to decode: bytes `[offset, offset + len)` of tensor
/// `tensor`'s data, into `len` bytes of memory at `addr`.
pub struct Target {
    pub tensor: usize,
    pub offset: u64,
    pub len: u64,
    pub addr: usize,
}

/// Memory at an address the caller owns, for the worker threads.
#[derive(Clone, Copy)]
struct Dst(usize);

impl Dst {
    /// # Safety
    /// `[self.0 + at, self.0 + at + len)` must be writable memory that no
    /// one else reads or writes during the call.
    unsafe fn slice<'a>(self, at: u64, len: usize) -> &'a mut [u8] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut((self.0 as u64 + at) as *mut u8, len) }
    }
}

impl Reader {
    pub fn open(path: &str) -> Result<Reader> {
        if let Some(url) = ckptfs::store::s3::S3Url::parse(path) {
            let url = url.map_err(NativeError::Format)?;
            let (tmp, local) = crate::s3::download(&url, path)?;
            let mut r = open_local(&local, path)?;
            r._tmp = Some(tmp);
            return Ok(r);
        }
        open_local(Path::new(path), path)
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Result<Reader> {
        let name = "<bytes>";
        let head = &bytes[..bytes.len().min(8)];
        if archive::Kind::detect(head).is_some() || archive::unsupported_kind(head).is_some() {
            let a = archive::from_bytes(bytes, Path::new(name))?;
            return from_archive(a, name, None);
        }
        let len = bytes.len() as u64;
        let (header, data_start) = parse_header(name, len, &mut |at, buf| {
            buf.copy_from_slice(&bytes[at as usize..at as usize + buf.len()]);
            Ok(())
        })?;
        Ok(Reader {
            name: name.into(),
            header,
            data_start,
            source: Source::Bytes(bytes),
            _tmp: None,
        })
    }

    pub fn kind_name(&self) -> &'static str {
        match &self.source {
            Source::Archive { a, .. } => a.kind().format_name(),
            Source::File(_) | Source::Bytes(_) => "safetensors",
        }
    }

    /// The presented file's byte range of each target, checked against
    /// its tensor's extent.
    fn ranges(&self, targets: &[Target]) -> Result<Vec<Range<u64>>> {
        targets
            .iter()
            .map(|t| {
                let e = self.header.tensors.get(t.tensor).ok_or_else(|| {
                    NativeError::Format(format!("{}: no tensor number {}", self.name, t.tensor))
                })?;
                let end = t.offset.checked_add(t.len).filter(|&end| end <= e.len());
                let start = self.data_start + e.begin + t.offset;
                match end {
                    Some(_) => Ok(start..start + t.len),
                    None => Err(NativeError::Format(format!(
                        "{}: tensor {:?}: bytes {}..+{} lie outside its {} bytes",
                        self.name,
                        e.name,
                        t.offset,
                        t.len,
                        e.len()
                    ))),
                }
            })
            .collect()
    }

    pub fn read_into(&self, targets: &[Target]) -> Result<()> {
        let ranges = self.ranges(targets)?;
        match &self.source {
            Source::Archive { a, file } => read_archive(&**a, *file, targets, &ranges),
            Source::File(f) => {
                let mut pieces = Vec::new();
                for (t, r) in targets.iter().zip(&ranges) {
                    let mut at = 0;
                    while at < t.len {
                        let n = READ_PIECE.min(t.len - at);
                        pieces.push((r.start + at, n, Dst(t.addr), at));
                        at += n;
                    }
                }
                pieces.into_par_iter().try_for_each(|(pos, n, dst, at)| {
                    // SAFETY: `dst` is the target's memory (`Target`'s
                    // contract); pieces of a target are disjoint.
                    let buf = unsafe { dst.slice(at, n as usize) };
                    f.read_exact_at(buf, pos).map_err(|e| io(&self.name, e))
                })
            }
            Source::Bytes(b) => {
                for (t, r) in targets.iter().zip(&ranges) {
                    // SAFETY: as above.
                    let buf = unsafe { Dst(t.addr).slice(0, t.len as usize) };
                    buf.copy_from_slice(&b[r.start as usize..r.end as usize]);
                }
                Ok(())
            }
        }
    }
}

/// Decodes `ranges` of file `file` into the targets: each block once, on
/// the pool, copied into every target it covers.
fn read_archive(
    a: &dyn ArchiveView,
    file: usize,
    targets: &[Target],
    ranges: &[Range<u64>],
) -> Result<()> {
    let mut blocks: BTreeMap<BlockKey, Vec<(Range<u64>, Dst, u64)>> = BTreeMap::new();
    for (t, r) in targets.iter().zip(ranges) {
        if r.is_empty() {
            continue;
        }
        a.check_range(file, r.clone())?;
        for p in archive::plan(a, file, r.clone())? {
            let len = p.within.end - p.within.start;
            match p.source {
                PieceSource::Prefix => {
                    let prefix = a.prefix(file)?;
                    // SAFETY: `Target`'s contract; `plan` keeps pieces
                    // inside the range.
                    let dst = unsafe { Dst(t.addr).slice(p.out_offset, len as usize) };
                    dst.copy_from_slice(&prefix[p.within.start as usize..p.within.end as usize]);
                }
                PieceSource::Block(key) => {
                    blocks
                        .entry(key)
                        .or_default()
                        .push((p.within, Dst(t.addr), p.out_offset));
                }
            }
        }
    }
    // Start reading every unit's stored bytes (a cold page cache reads
    // ahead of the decoders).
    let mut last = None;
    for key in blocks.keys() {
        if last != Some(key.unit) {
            a.will_need(key.unit);
            last = Some(key.unit);
        }
    }
    blocks
        .into_par_iter()
        .try_for_each(|(key, dests)| -> Result<()> {
            let d = a.decode_block(key)?;
            for (within, dst, at) in dests {
                let src = d
                    .get(within.start as usize..within.end as usize)
                    .ok_or_else(|| {
                        format(
                            &a.path().display().to_string(),
                            "a block is shorter than its grid says",
                        )
                    })?;
                // SAFETY: `Target`'s contract; the pieces of one target
                // are disjoint (`plan`), and targets do not overlap.
                unsafe { dst.slice(at, src.len()) }.copy_from_slice(src);
            }
            ckptfs::codec::buffers::recycle(d);
            Ok(())
        })
}

/// Reads and checks a safetensors header through `read` (exact reads at
/// an offset) of a file of `len` bytes: the header and where data starts.
fn parse_header(
    name: &str,
    len: u64,
    read: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
) -> Result<(Header, u64)> {
    let mut prefix = [0u8; 8];
    let have = len.min(8) as usize;
    read(0, &mut prefix[..have])?;
    let n = header_len(&prefix[..have], len).map_err(|e| format(name, e))?;
    let mut raw = vec![0u8; n as usize];
    read(8, &mut raw)?;
    let data_start = 8 + n;
    let header = Header::parse(&raw, len - data_start).map_err(|e| format(name, e))?;
    Ok((header, data_start))
}

fn from_archive(a: Arc<dyn ArchiveView>, shown: &str, member: Option<&str>) -> Result<Reader> {
    let file = match member {
        Some(m) => a.find(m).ok_or_else(|| {
            NativeError::Io(
                format!("{shown}: no file {m:?} in this archive"),
                Some(libc_enoent()),
            )
        })?,
        None if a.files() == 1 => 0,
        None => {
            let example = (0..a.files())
                .map(|i| a.file_path(i))
                .find(|p| p.ends_with(".safetensors"))
                .unwrap_or("NAME");
            return Err(NativeError::Format(format!(
                "{shown}: holds a model directory ({} files): open one of its files as {shown}/{example}",
                a.files()
            )));
        }
    };
    let name = match member {
        Some(m) => format!("{shown}/{m}"),
        None => shown.to_string(),
    };
    let len = a.logical_len(file);
    let (header, data_start) = parse_header(&name, len, &mut |at, buf| {
        let n = a.read_at(file, at, buf)?;
        if n != buf.len() {
            return Err(NativeError::Format(format!(
                "{name}: ends inside its header"
            )));
        }
        Ok(())
    })?;
    Ok(Reader {
        name,
        header,
        data_start,
        source: Source::Archive { a, file },
        _tmp: None,
    })
}

fn libc_enoent() -> i32 {
    std::io::Error::from(std::io::ErrorKind::NotFound)
        .raw_os_error()
        .unwrap_or(2)
}

/// Whether a file starting with `head` is an archive (or a z4ai kind the
/// archive layer names and refuses).
pub fn is_archive(head: &[u8]) -> bool {
    archive::Kind::detect(head).is_some() || archive::unsupported_kind(head).is_some()
}

fn head_of(f: &std::fs::File, shown: &str) -> Result<Vec<u8>> {
    let mut head = [0u8; 8];
    let mut n = 0;
    while n < 8 {
        match f.read_at(&mut head[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(shown, e)),
        }
    }
    Ok(head[..n].to_vec())
}

/// Opens a local path: a file (archive or plain safetensors), or a member
/// of an archive as `ARCHIVE/MEMBER`. `shown` names it in messages.
fn open_local(path: &Path, shown: &str) -> Result<Reader> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            return Err(NativeError::Io(
                format!("{shown}: is a directory (open one of its .safetensors or .zstn files)"),
                Some(21),
            ))
        }
        Ok(_) => {}
        Err(e) => {
            if let Some((archive_path, member)) = archive_member(path) {
                let a = archive::open(&archive_path)?;
                let shown_archive = archive_path.display().to_string();
                return from_archive(a, &shown_archive, Some(&member));
            }
            return Err(io(shown, e));
        }
    }
    let f = std::fs::File::open(path).map_err(|e| io(shown, e))?;
    let head = head_of(&f, shown)?;
    if is_archive(&head) {
        let a = archive::from_file(&f, path)?;
        return from_archive(a, shown, None);
    }
    let len = f.metadata().map_err(|e| io(shown, e))?.len();
    let (header, data_start) = parse_header(shown, len, &mut |at, buf| {
        f.read_exact_at(buf, at).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => format(shown, "ends inside its header"),
            _ => io(shown, e),
        })
    })?;
    Ok(Reader {
        name: shown.to_string(),
        header,
        data_start,
        source: Source::File(f),
        _tmp: None,
    })
}

/// For a path that does not exist: the archive file among its ancestors
/// and the member path below it (`model.blz/model.safetensors`).
fn archive_member(path: &Path) -> Option<(PathBuf, String)> {
    for anc in path.ancestors().skip(1) {
        if anc.as_os_str().is_empty() {
            break;
        }
        match std::fs::metadata(anc) {
            Ok(m) if m.is_file() => {
                let rel = path.strip_prefix(anc).ok()?;
                let member = rel.to_str()?.to_string();
                return Some((anc.to_path_buf(), member));
            }
            Ok(_) => return None,
            Err(_) => continue,
        }
    }
    None
}

/// An archive's files and sizes (the empty path for a single-file one).
pub fn members(path: &str) -> Result<Vec<(String, u64)>> {
    let a = archive::open(Path::new(path))?;
    Ok((0..a.files())
        .map(|i| (a.file_path(i).to_string(), a.logical_len(i)))
        .collect())
}

/// Writes member `member` of the archive at `path` to `dest`, atomically.
pub fn extract(path: &str, member: &str, dest: &str) -> Result<()> {
    let a = archive::open(Path::new(path))?;
    let file = a.find(member).ok_or_else(|| {
        NativeError::Io(
            format!("{path}: no file {member:?} in this archive"),
            Some(libc_enoent()),
        )
    })?;
    let mut failed = None;
    ckptfs::fsutil::write_atomic(Path::new(dest), true, |w| {
        archive::write_to(&*a, file, w, &|_| {}).map_err(|e| match e {
            archive::WriteError::Archive(e) => {
                failed = Some(NativeError::from(e));
                std::io::Error::other("archive")
            }
            archive::WriteError::Write(e) => e,
        })
    })
    .map_err(|e| failed.take().unwrap_or_else(|| io(dest, e)))
}
