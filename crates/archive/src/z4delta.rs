//! Reading z4ai's deltas against their base: a `Z4DM` model delta
//! ([`Z4dmReader`]) or a `Z4DL` XOR delta ([`Z4dlReader`]), decoded into
//! any writer, tensor by tensor.
//!
//! The base ([`Base`]) is a plain file (a `.safetensors`, or any reference
//! bytes for a `Z4DL`) or the presented file of any archive ckptfs reads
//! (`archive::open`). Opening a reader checks everything that can be
//! checked before the first output byte: the delta's structure (every
//! record, every frame's header and decoded length), that every tensor a
//! record takes from the base exists there with the right length, and the
//! digest z4ai recorded of the base (BLAKE2b-8 of its data buffer for a
//! `Z4DM`, BLAKE2b-16 of the whole reference for a `Z4DL`). A wrong base is
//! therefore an error naming both files before anything is written.
//!
//! Memory: the output streams; a COPY moves through a chunk of
//! [`CHUNK`] bytes, a frame is decoded one block of its grid at a time (a
//! z4ai frame that cannot be cut is one block of its tensor, bounded by
//! `format::frame::MAX_BLOCK_BYTES`), and a DELTA block is XORed with the
//! base read in chunks. Nothing is allocated from a length in the delta
//! beyond what the frame decoder bounds.
//!
//! This module depends on `format`, `codec` and `archive`; commands use it.

use crate::{ArchiveView, BlockKey};
use ckptfs_codec::xor_delta::xor_into;
use ckptfs_format::frame::Frame;
use ckptfs_format::safetensors::{header_len, Header};
use ckptfs_format::z4digest::Z4Digest;
use ckptfs_format::z4dl::{hex, Z4dl, Z4dlError};
use ckptfs_format::z4dm::{RecordKind, Z4dm, Z4dmError};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

/// Base bytes read or hashed at once.
pub const CHUNK: usize = 8 << 20;

/// The most target bytes a `Z4DM` may leave to no record (written as
/// zeros): real safetensors files have no holes, and this keeps a lying
/// `data_len` from making the output arbitrarily large.
pub const MAX_HOLE_BYTES: u64 = 1 << 30;

#[derive(Debug, Error)]
pub enum DeltaError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {source}")]
    Z4dm { path: PathBuf, source: Z4dmError },
    #[error("{path}: {source}")]
    Z4dl { path: PathBuf, source: Z4dlError },
    #[error(transparent)]
    Archive(#[from] crate::ArchiveError),
    /// The base cannot serve as this delta's base (not a safetensors file,
    /// a tensor missing or of another length).
    #[error("{delta}: base {base}: {what}")]
    Base {
        delta: PathBuf,
        base: PathBuf,
        what: String,
    },
    /// The digest z4ai recorded does not match the base given.
    #[error("{delta}: {base} is not the base this delta was built against ({what})")]
    WrongBase {
        delta: PathBuf,
        base: PathBuf,
        what: String,
    },
    #[error("{path}: tensor {tensor:?}: {what}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        what: String,
    },
    #[error("writing the output: {0}")]
    Write(io::Error),
}

pub type Result<T> = std::result::Result<T, DeltaError>;

/// The bytes of a base: a plain file, mapped, or the one presented file of
/// an archive, decoded on demand.
pub struct Base {
    path: PathBuf,
    src: BaseSrc,
}

enum BaseSrc {
    /// `None` for an empty file (which cannot be mapped).
    Mapped(Option<memmap2::Mmap>),
    Archive {
        archive: Arc<dyn ArchiveView>,
        /// The last block decoded, so that chunked reads decode a block
        /// once even when a chunk boundary cuts it.
        last: Mutex<Option<(BlockKey, Arc<Vec<u8>>)>>,
    },
}

impl Base {
    /// Opens `path`: an archive ckptfs reads (by its magic), else a plain
    /// file taken as it is.
    pub fn open(path: &Path) -> Result<Base> {
        use std::io::Read;
        let io = |source| DeltaError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = std::fs::File::open(path).map_err(io)?;
        let mut head = [0u8; 8];
        let n = f.read(&mut head).map_err(io)?;
        let src = if crate::Kind::detect(&head[..n]).is_some() {
            let a = crate::open(path)?;
            if a.files() != 1 {
                return Err(DeltaError::Io {
                    path: path.to_path_buf(),
                    source: io::Error::other(format!(
                        "an archive of {} files: a base must be one file",
                        a.files()
                    )),
                });
            }
            BaseSrc::Archive {
                archive: a,
                last: Mutex::new(None),
            }
        } else if f.metadata().map_err(io)?.len() == 0 {
            BaseSrc::Mapped(None)
        } else {
            // SAFETY: a read-only private map of a file we only read; a
            // base changed under us gives wrong digests, never UB in Rust
            // terms beyond what every mmap reader accepts.
            BaseSrc::Mapped(Some(unsafe { memmap2::Mmap::map(&f) }.map_err(io)?))
        };
        Ok(Base {
            path: path.to_path_buf(),
            src,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Length of the base (the presented file's, for an archive).
    pub fn len(&self) -> u64 {
        match &self.src {
            BaseSrc::Mapped(m) => m.as_ref().map_or(0, |m| m.len() as u64),
            BaseSrc::Archive { archive, .. } => archive.logical_len(0),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads `buf.len()` bytes at `offset` (within the base).
    pub fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > self.len()) {
            return Err(DeltaError::Io {
                path: self.path.clone(),
                source: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("read of {} bytes at {offset} past the end", buf.len()),
                ),
            });
        }
        match &self.src {
            BaseSrc::Mapped(m) => {
                if let Some(m) = m {
                    buf.copy_from_slice(&m[offset as usize..offset as usize + buf.len()]);
                }
                Ok(())
            }
            BaseSrc::Archive { archive, last } => {
                let mut fetch = |k: BlockKey| -> std::result::Result<_, crate::ArchiveError> {
                    let mut last = last.lock();
                    if let Some((key, b)) = &*last {
                        if *key == k {
                            return Ok(b.clone());
                        }
                    }
                    let b = Arc::new(archive.decode_block(k)?);
                    *last = Some((k, b.clone()));
                    Ok(b)
                };
                crate::read_with(&**archive, 0, offset, buf, &mut fetch)?;
                Ok(())
            }
        }
    }

    /// Calls `f` with the bytes of `range`, in order, in pieces of at most
    /// [`CHUNK`] bytes (a mapped base hands out its own slices).
    pub fn for_each_chunk(
        &self,
        range: Range<u64>,
        f: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        if let BaseSrc::Mapped(m) = &self.src {
            if range.is_empty() {
                return Ok(());
            }
            let Some(m) = m.as_ref().filter(|m| range.end <= m.len() as u64) else {
                return self.read_exact_at(range.start, &mut [0u8; 1]);
            };
            for c in m[range.start as usize..range.end as usize].chunks(CHUNK) {
                f(c)?;
            }
            return Ok(());
        }
        let mut buf = vec![0u8; CHUNK.min((range.end - range.start) as usize)];
        let mut pos = range.start;
        while pos < range.end {
            let n = ((range.end - pos) as usize).min(CHUNK);
            self.read_exact_at(pos, &mut buf[..n])?;
            f(&buf[..n])?;
            pos += n as u64;
        }
        Ok(())
    }

    /// The streaming BLAKE2b of `range`.
    fn digest(&self, mut d: Z4Digest, range: Range<u64>) -> Result<Vec<u8>> {
        self.for_each_chunk(range, &mut |c| {
            d.update(c);
            Ok(())
        })?;
        Ok(d.finish())
    }
}

/// A writer that XORs what it is given with base bytes `[at, ...)` before
/// passing it on: the output side of a DELTA.
struct XorWriter<'a> {
    base: &'a Base,
    at: u64,
    scratch: Vec<u8>,
    out: &'a mut dyn Write,
}

impl Write for XorWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(CHUNK);
        self.scratch.clear();
        self.scratch.resize(n, 0);
        self.base
            .read_exact_at(self.at, &mut self.scratch)
            .map_err(io::Error::other)?;
        xor_into(&mut self.scratch, &buf[..n]);
        self.out.write_all(&self.scratch)?;
        self.at += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Decodes a bare codec frame into `w` block by block; `label` names it in
/// errors.
fn write_frame(frame: &[u8], label: String, w: &mut dyn Write) -> Result<()> {
    crate::write_frame(frame, Path::new(&label), w).map_err(|e| match e {
        crate::WriteError::Archive(e) => DeltaError::Archive(e),
        crate::WriteError::Write(e) => match e.downcast::<DeltaError>() {
            Ok(d) => d,
            Err(e) => DeltaError::Write(e),
        },
    })?;
    Ok(())
}

/// Per-kind counts and stored bytes of a `Z4DM`'s records.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct KindStats {
    pub records: u64,
    /// Bytes of the target these records fill.
    pub target_bytes: u64,
    /// Frame bytes stored for them (0 for COPY).
    pub stored_bytes: u64,
}

/// What `info` shows of a `Z4DM`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Z4dmSummary {
    pub target_len: u64,
    pub header_len: u64,
    pub data_len: u64,
    pub base_digest: String,
    pub full: KindStats,
    pub delta: KindStats,
    pub copy: KindStats,
}

/// Walks a `Z4DM`'s records (no base needed) and sums them by kind.
pub fn summarize_z4dm(path: &Path, bytes: &[u8]) -> Result<Z4dmSummary> {
    let err = |source| DeltaError::Z4dm {
        path: path.to_path_buf(),
        source,
    };
    let dm = Z4dm::parse(bytes).map_err(err)?;
    let mut s = Z4dmSummary {
        target_len: dm.target_len().unwrap_or(u64::MAX),
        header_len: dm.header_json.len() as u64,
        data_len: dm.data_len,
        base_digest: hex(&dm.base_digest),
        ..Default::default()
    };
    for r in dm.records() {
        let r = r.map_err(err)?;
        let k = match r.kind {
            RecordKind::Full => &mut s.full,
            RecordKind::Delta => &mut s.delta,
            RecordKind::Copy => &mut s.copy,
        };
        k.records += 1;
        k.target_bytes += r.len();
        k.stored_bytes += r.frame.len() as u64;
    }
    Ok(s)
}

/// A `Z4DM` checked against its base, ready to be written out.
pub struct Z4dmReader<'a> {
    path: PathBuf,
    dm: Z4dm<'a>,
    base: &'a Base,
    /// Start of the base's data buffer in the base file.
    base_data: u64,
    /// Base tensors by name: span in the base file.
    base_tensors: HashMap<String, Range<u64>>,
}

impl<'a> Z4dmReader<'a> {
    /// Parses the delta at `path` (`bytes`), walks and checks every record
    /// against the base, then checks the base's digest. Nothing is decoded.
    pub fn open(path: &Path, bytes: &'a [u8], base: &'a Base) -> Result<Z4dmReader<'a>> {
        let err = |source| DeltaError::Z4dm {
            path: path.to_path_buf(),
            source,
        };
        let dm = Z4dm::parse(bytes).map_err(err)?;
        let base_err = |what: String| DeltaError::Base {
            delta: path.to_path_buf(),
            base: base.path().to_path_buf(),
            what,
        };
        // The base's safetensors header, as z4ai reads it (leniently).
        let mut len8 = [0u8; 8];
        if base.len() < 8 {
            return Err(base_err(format!(
                "not a safetensors file ({} bytes)",
                base.len()
            )));
        }
        base.read_exact_at(0, &mut len8)?;
        let hlen = header_len(&len8, base.len())
            .map_err(|e| base_err(format!("not a safetensors file: {e}")))?;
        let mut raw = vec![0u8; hlen as usize];
        base.read_exact_at(8, &mut raw)?;
        let header = Header::parse_entries(&raw)
            .map_err(|e| base_err(format!("not a safetensors file: {e}")))?;
        let base_data = 8 + hlen;
        let data_len = base.len() - base_data;
        let mut base_tensors = HashMap::with_capacity(header.tensors.len());
        for t in header.tensors {
            // A span outside the data buffer is only an error if a record
            // uses it (z4ai slices leniently).
            if t.begin <= t.end && t.end <= data_len {
                base_tensors.insert(t.name, base_data + t.begin..base_data + t.end);
            }
        }
        let tensor = |name: &str, what: String| DeltaError::Tensor {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            what,
        };
        // Every record, before anything is written.
        let mut covered = 0u64;
        for r in dm.records() {
            let r = r.map_err(err)?;
            covered += r.len();
            let from_base = match r.kind {
                RecordKind::Full => {
                    let f = Frame::parse(r.frame).map_err(|e| tensor(r.name, e.to_string()))?;
                    if f.decoded_len() != r.len() {
                        return Err(tensor(
                            r.name,
                            format!(
                                "frame decodes to {} bytes, the span [{}, {}) is {}",
                                f.decoded_len(),
                                r.begin,
                                r.end,
                                r.len()
                            ),
                        ));
                    }
                    None
                }
                RecordKind::Delta => {
                    let d = Z4dl::parse(r.frame).map_err(|e| tensor(r.name, e.to_string()))?;
                    if d.ref_len != r.len() {
                        return Err(tensor(
                            r.name,
                            format!(
                                "Z4DL decodes to {} bytes, the span [{}, {}) is {}",
                                d.ref_len,
                                r.begin,
                                r.end,
                                r.len()
                            ),
                        ));
                    }
                    Some(d.ref_len)
                }
                RecordKind::Copy => Some(r.len()),
            };
            if let Some(want) = from_base {
                let Some(span) = base_tensors.get(r.name) else {
                    return Err(base_err(format!(
                        "has no tensor {:?}, which the delta's {} record needs",
                        r.name,
                        r.kind.name()
                    )));
                };
                if span.end - span.start != want {
                    return Err(base_err(format!(
                        "tensor {:?} is {} bytes, the delta's {} record needs {want}",
                        r.name,
                        span.end - span.start,
                        r.kind.name()
                    )));
                }
            }
        }
        if dm.data_len - covered > MAX_HOLE_BYTES {
            return Err(err(Z4dmError::Header(
                ckptfs_format::error::CodecError::invalid(
                    "data length",
                    format!(
                        "{} bytes of the {}-byte data buffer belong to no record (limit {MAX_HOLE_BYTES})",
                        dm.data_len - covered,
                        dm.data_len
                    ),
                ),
            )));
        }
        let got = base.digest(Z4Digest::base_data(), base_data..base.len())?;
        if got != dm.base_digest {
            return Err(DeltaError::WrongBase {
                delta: path.to_path_buf(),
                base: base.path().to_path_buf(),
                what: format!(
                    "BLAKE2b-8 of its data buffer is {}, the delta records {}",
                    hex(&got),
                    hex(&dm.base_digest)
                ),
            });
        }
        Ok(Z4dmReader {
            path: path.to_path_buf(),
            dm,
            base,
            base_data,
            base_tensors,
        })
    }

    /// Length of the output.
    pub fn target_len(&self) -> u64 {
        8 + self.dm.header_json.len() as u64 + self.dm.data_len
    }

    /// Offset of the base's data buffer in the base file.
    pub fn base_data_offset(&self) -> u64 {
        self.base_data
    }

    /// Writes the target: `u64le(hlen) ‖ header ‖ data`, tensor by tensor.
    /// `progress` gets each written length.
    pub fn write_to(&self, w: &mut dyn Write, progress: &dyn Fn(u64)) -> Result<()> {
        let wr = DeltaError::Write;
        let prefix = self.dm.prefix();
        w.write_all(&prefix).map_err(wr)?;
        progress(prefix.len() as u64);
        let mut pos = 0u64;
        for r in self.dm.records() {
            let r = r.map_err(|source| DeltaError::Z4dm {
                path: self.path.clone(),
                source,
            })?;
            write_zeros(w, r.begin - pos).map_err(wr)?;
            progress(r.begin - pos);
            let label = format!("{}: tensor {:?}", self.path.display(), r.name);
            // Present for DELTA and COPY, checked at open.
            let span = self.base_tensors.get(r.name).cloned().unwrap_or(0..0);
            match r.kind {
                RecordKind::Copy => self.base.for_each_chunk(span, &mut |c| {
                    w.write_all(c).map_err(wr)?;
                    progress(c.len() as u64);
                    Ok(())
                })?,
                RecordKind::Full => write_frame(r.frame, label, w)?,
                RecordKind::Delta => {
                    let d = Z4dl::parse(r.frame).map_err(|source| DeltaError::Z4dl {
                        path: PathBuf::from(&label),
                        source,
                    })?;
                    let got = self.base.digest(Z4dl::hasher(), span.clone())?;
                    d.check_ref_digest(&got)
                        .map_err(|source| DeltaError::WrongBase {
                            delta: PathBuf::from(&label),
                            base: self.base.path().to_path_buf(),
                            what: source.to_string(),
                        })?;
                    if d.ref_len > 0 {
                        let mut x = XorWriter {
                            base: self.base,
                            at: span.start,
                            scratch: Vec::new(),
                            out: w,
                        };
                        write_frame(d.frame, label, &mut x)?;
                    }
                }
            }
            if r.kind != RecordKind::Copy {
                progress(r.len());
            }
            pos = r.end;
        }
        write_zeros(w, self.dm.data_len - pos).map_err(wr)?;
        progress(self.dm.data_len - pos);
        Ok(())
    }
}

fn write_zeros(w: &mut dyn Write, mut n: u64) -> io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        w.write_all(&ZEROS[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// A `Z4DL` checked against its reference, ready to be written out.
pub struct Z4dlReader<'a> {
    path: PathBuf,
    dl: Z4dl<'a>,
    base: &'a Base,
}

impl<'a> Z4dlReader<'a> {
    /// Parses the delta at `path` (`bytes`) and checks the reference's
    /// length and BLAKE2b-16 digest. Nothing is decoded.
    pub fn open(path: &Path, bytes: &'a [u8], base: &'a Base) -> Result<Z4dlReader<'a>> {
        let dl = Z4dl::parse(bytes).map_err(|source| DeltaError::Z4dl {
            path: path.to_path_buf(),
            source,
        })?;
        let wrong = |what: String| DeltaError::WrongBase {
            delta: path.to_path_buf(),
            base: base.path().to_path_buf(),
            what,
        };
        dl.check_ref_len(base.len())
            .map_err(|e| wrong(e.to_string()))?;
        let got = base.digest(Z4dl::hasher(), 0..base.len())?;
        dl.check_ref_digest(&got)
            .map_err(|e| wrong(e.to_string()))?;
        Ok(Z4dlReader {
            path: path.to_path_buf(),
            dl,
            base,
        })
    }

    /// Length of the output (the reference's).
    pub fn target_len(&self) -> u64 {
        self.dl.ref_len
    }

    /// Writes `frame XOR reference`, one frame block at a time.
    pub fn write_to(&self, w: &mut dyn Write) -> Result<()> {
        if self.dl.ref_len == 0 {
            return Ok(());
        }
        let mut x = XorWriter {
            base: self.base,
            at: 0,
            scratch: Vec::new(),
            out: w,
        };
        write_frame(self.dl.frame, self.path.display().to_string(), &mut x)
    }
}

/// Which z4ai delta a file's first bytes announce, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaKind {
    Z4dm,
    Z4dl,
}

impl DeltaKind {
    pub fn detect(head: &[u8]) -> Option<DeltaKind> {
        if head.starts_with(ckptfs_format::z4dm::MAGIC) {
            Some(DeltaKind::Z4dm)
        } else if head.starts_with(ckptfs_format::z4dl::MAGIC) {
            Some(DeltaKind::Z4dl)
        } else {
            None
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            DeltaKind::Z4dm => "a z4ai model delta (Z4DM)",
            DeltaKind::Z4dl => "a z4ai XOR delta frame (Z4DL)",
        }
    }
}
