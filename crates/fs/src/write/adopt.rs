//! Files with safetensors content under any name.
//!
//! A plain file written through the mount (the Hugging Face cache's
//! `blobs/<sha256>`, written as `<sha256>.<random>.incomplete` and renamed;
//! git-lfs objects; any name that is not `X.safetensors`) is checked when
//! its last writer closes: if its header is one the writer accepts (the
//! checks of `format::safetensors::split_file`: header length, JSON, every
//! tensor's dtype, shape and offsets against the file's size), it is staged
//! (`stage::stage_plain`) and queued like a `.safetensors`; the commit
//! validates it again and stores it as `N.zsame` (doc/FORMAT.md §4), or
//! puts it back as a plain file. Anything else stays a plain file, at the
//! cost of one 8-byte read at close (and of the header, when the first 8
//! bytes give a length that fits the file).
//!
//! Only the header is read, into a buffer bounded by the file's real size
//! and by `MAX_HEADER_LEN`. The move into the spool is checked as the
//! process that opened the file for writing (with `--allow-other`), as
//! every other move into the spool is.

use crate::inode::{Identity, NodeKind};
use crate::CheckpointFs;
use ckptfs_format::safetensors::{header_len, Header};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};

impl CheckpointFs {
    /// The last writer of plain file `ino` (backing `identity`) closed:
    /// stages and queues it if its content is safetensors.
    pub(crate) fn adopt_if_safetensors(&self, ino: u64, identity: Identity) {
        let Some(spool) = &self.spool else { return };
        if self.read_only || self.writer_count(identity) > 0 {
            return;
        }
        let Ok(inode) = self.inode(ino) else { return };
        if inode.kind() != NodeKind::Plain || inode.identity() != identity {
            return;
        }
        let Ok(rel) = self.rel(&inode) else { return };
        let Ok(file) = self.store.open_file(&rel, libc::O_RDONLY, 0) else {
            return;
        };
        match is_safetensors(&file, identity) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                log::debug!(
                    "{}: not checked for safetensors content: {e}",
                    rel.display()
                );
                return;
            }
        }
        drop(file);
        match self.stage_plain(spool, &inode) {
            Ok(_) => {
                log::debug!(
                    "{}: safetensors content, staged for compression under its own name",
                    rel.display()
                );
                self.handle_closed(identity);
            }
            // Renamed or replaced since it was checked: nothing to adopt.
            Err(crate::FsError::Stale) => {}
            Err(e) => log::warn!(
                "{}: safetensors content but not staged ({e}); kept as a plain file",
                self.store.path().join(&rel).display()
            ),
        }
    }
}

/// Whether `file` (backing `identity`) is a regular file whose header the
/// writer accepts, reading the header only.
pub(crate) fn is_safetensors(file: &File, identity: Identity) -> io::Result<bool> {
    let m = file.metadata()?;
    if !m.is_file() || (m.dev(), m.ino()) != identity || m.len() < 8 {
        return Ok(false);
    }
    let len = m.len();
    let mut prefix = [0u8; 8];
    file.read_exact_at(&mut prefix, 0)?;
    // At most MAX_HEADER_LEN and at most the bytes the file has.
    let Ok(n) = header_len(&prefix, len) else {
        return Ok(false);
    };
    let mut raw = Vec::new();
    raw.try_reserve_exact(n as usize)
        .map_err(io::Error::other)?;
    raw.resize(n as usize, 0);
    match file.read_exact_at(&mut raw, 8) {
        Ok(()) => {}
        // Truncated meanwhile by someone else.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e),
    }
    Ok(Header::parse(&raw, len - 8 - n).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn check(bytes: &[u8]) -> bool {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        let m = f.metadata().unwrap();
        is_safetensors(&f, (m.dev(), m.ino())).unwrap()
    }

    fn st(header: &str, data: usize) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.resize(v.len() + data, 7);
        v
    }

    #[test]
    fn accepts_what_the_writer_accepts_and_nothing_else() {
        let h = r#"{"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}"#;
        assert!(check(&st(h, 8)));
        assert!(check(&st("{}", 0)));
        // Data shorter than the header says; longer is accepted, as the
        // writer accepts gaps (they round-trip through an opaque frame).
        assert!(!check(&st(h, 7)));
        assert!(check(&st(h, 9)));
        // A header length past the end, JSON, text, empty.
        assert!(!check(&st(h, 8)[..20]));
        assert!(!check(br#"{"architectures": ["BertModel"]}"#));
        assert!(!check(b"version https://git-lfs.github.com/spec/v1\n"));
        assert!(!check(b""));
        assert!(!check(&u64::MAX.to_le_bytes()));
        // A bad dtype.
        assert!(!check(&st(
            r#"{"w":{"dtype":"X9","shape":[2],"data_offsets":[0,2]}}"#,
            2
        )));
    }
}
