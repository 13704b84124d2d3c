//! z4ai's plain XOR delta frame, `Z4DL` version 2 (`z4ai.compress_delta`,
//! doc/FORMAT.md "z4ai deltas (read)"):
//!
//! ```text
//! [4] "Z4DL" ; u8 version = 2 ; u8 flags ; u16 reserved ; u64 ref_len ;
//! [16] BLAKE2b (digest_size=16) of the reference ;
//! one codec frame (Z4AI / ZSP1 / ZPL1) of  current XOR reference, to the end
//! ```
//!
//! [`Z4dl::parse`] checks the header and the inner frame's structure (the
//! frame must decode to exactly `ref_len` bytes) without decoding or
//! allocating anything; [`Z4dl::parse_header`] checks the header alone (for
//! a reader that reads the frame later, as ckptfs's delta archive does for
//! its DELTA records); [`Z4dl::check_reference`] checks a reference's
//! length and digest. Decoding (inner frame, then XOR with the reference) is
//! the caller's: the frame decoder lives in `codec`, which `format` may not
//! use. An empty reference decodes to an empty output whatever the frame.

use crate::error::CodecError;
use crate::frame::Frame;
use crate::z4digest::{reference_digest, Z4Digest, REF_DIGEST_LEN};
use thiserror::Error;

pub const MAGIC: &[u8; 4] = b"Z4DL";
/// The only version z4ai 0.2.0 writes and reads.
pub const VERSION: u8 = 2;
/// Bytes before the inner frame.
pub const HEADER_LEN: usize = 32;

/// Why a `Z4DL` cannot be read, or not against a given reference.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Z4dlError {
    #[error("not a z4ai XOR delta (magic {0:?}, expected \"Z4DL\")")]
    Magic(String),
    #[error("Z4DL header truncated: {0} bytes, the header is 32")]
    Truncated(u64),
    #[error("unsupported Z4DL version {0} (ckptfs reads version 2)")]
    Version(u8),
    #[error("Z4DL inner frame: {0}")]
    Frame(CodecError),
    #[error("Z4DL inner frame decodes to {frame} bytes but the reference is {ref_len} bytes")]
    FrameLength { frame: u64, ref_len: u64 },
    #[error("reference is {got} bytes but the delta was built against {expected} bytes")]
    RefLength { expected: u64, got: u64 },
    #[error("reference digest mismatch: the delta was built against another reference (BLAKE2b-16 {expected}, this one has {got})")]
    RefDigest { expected: String, got: String },
}

/// A parsed `Z4DL` delta frame.
#[derive(Debug, Clone)]
pub struct Z4dl<'a> {
    pub version: u8,
    pub flags: u8,
    /// Length of the reference, and so of the decoded output.
    pub ref_len: u64,
    /// BLAKE2b-16 of the reference.
    pub ref_digest: [u8; REF_DIGEST_LEN],
    /// The inner codec frame's bytes (`current XOR reference`).
    pub frame: &'a [u8],
}

impl<'a> Z4dl<'a> {
    /// Parses the header and checks the inner frame's structure: unless the
    /// reference is empty, it must decode to `ref_len` bytes.
    pub fn parse(bytes: &'a [u8]) -> Result<Z4dl<'a>, Z4dlError> {
        let d = Z4dl::parse_header(bytes)?;
        if d.ref_len > 0 {
            let got = d.inner()?.decoded_len();
            if got != d.ref_len {
                return Err(Z4dlError::FrameLength {
                    frame: got,
                    ref_len: d.ref_len,
                });
            }
        }
        Ok(d)
    }

    /// Parses the [`HEADER_LEN`] bytes of the header (magic, version,
    /// reference length and digest), without reading the inner frame.
    pub fn parse_header(bytes: &'a [u8]) -> Result<Z4dl<'a>, Z4dlError> {
        if bytes.len() < 4 || &bytes[..4] != MAGIC {
            return Err(Z4dlError::Magic(
                String::from_utf8_lossy(&bytes[..bytes.len().min(4)]).into_owned(),
            ));
        }
        if bytes.len() < HEADER_LEN {
            return Err(Z4dlError::Truncated(bytes.len() as u64));
        }
        let version = bytes[4];
        if version != VERSION {
            return Err(Z4dlError::Version(version));
        }
        Ok(Z4dl {
            version,
            flags: bytes[5],
            ref_len: u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")),
            ref_digest: bytes[16..32].try_into().expect("16 bytes"),
            frame: &bytes[HEADER_LEN..],
        })
    }

    /// The parsed inner frame.
    pub fn inner(&self) -> Result<Frame<'a>, Z4dlError> {
        Frame::parse(self.frame).map_err(Z4dlError::Frame)
    }

    /// Length of the decoded output (that of the reference).
    pub fn decoded_len(&self) -> u64 {
        self.ref_len
    }

    /// Checks a reference's length, then its digest.
    pub fn check_reference(&self, reference: &[u8]) -> Result<(), Z4dlError> {
        self.check_ref_len(reference.len() as u64)?;
        self.check_ref_digest(&reference_digest(reference))
    }

    /// Checks a reference's length (before hashing it).
    pub fn check_ref_len(&self, len: u64) -> Result<(), Z4dlError> {
        if len != self.ref_len {
            return Err(Z4dlError::RefLength {
                expected: self.ref_len,
                got: len,
            });
        }
        Ok(())
    }

    /// Checks a digest computed by a streaming [`Z4Digest::reference`].
    pub fn check_ref_digest(&self, digest: &[u8]) -> Result<(), Z4dlError> {
        if digest != self.ref_digest {
            return Err(Z4dlError::RefDigest {
                expected: hex(&self.ref_digest),
                got: hex(digest),
            });
        }
        Ok(())
    }

    /// A fresh streaming hasher for this frame's reference.
    pub fn hasher() -> Z4Digest {
        Z4Digest::reference()
    }
}

/// Lower-case hex, for messages.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Writes a `Z4DL` header (tests and fixtures build frames with it).
pub fn render_header(ref_len: u64, ref_digest: &[u8; REF_DIGEST_LEN]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&[VERSION, 0, 0, 0]);
    v.extend_from_slice(&ref_len.to_le_bytes());
    v.extend_from_slice(ref_digest);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{render_z4ai, Transform};

    /// A Z4DL whose inner frame stores `diff` opaquely (method 0 = stored).
    fn z4dl(reference: &[u8], diff: &[u8]) -> Vec<u8> {
        let mut v = render_header(reference.len() as u64, &reference_digest(reference));
        v.extend(render_z4ai(Transform::Opaque, &[], &[stored_plane(diff)]));
        v
    }

    fn stored_plane(b: &[u8]) -> crate::frame::PlaneOut {
        crate::frame::PlaneOut {
            method: 0,
            orig_len: b.len() as u64,
            payload: b.to_vec(),
        }
    }

    #[test]
    fn parses_and_checks_the_reference() {
        let r = b"reference bytes!";
        let blob = z4dl(r, &[0u8; 16]);
        let d = Z4dl::parse(&blob).unwrap();
        assert_eq!(d.ref_len, 16);
        assert_eq!(d.decoded_len(), 16);
        d.check_reference(r).unwrap();
        assert!(matches!(
            d.check_reference(b"reference bytes?"),
            Err(Z4dlError::RefDigest { .. })
        ));
        assert!(matches!(
            d.check_reference(b"short"),
            Err(Z4dlError::RefLength {
                expected: 16,
                got: 5
            })
        ));
    }

    #[test]
    fn refuses_bad_headers() {
        let blob = z4dl(b"abcd", b"\0\0\0\0");
        assert!(matches!(Z4dl::parse(b"Z4D"), Err(Z4dlError::Magic(_))));
        assert!(matches!(
            Z4dl::parse(&blob[..20]),
            Err(Z4dlError::Truncated(20))
        ));
        let mut v = blob.clone();
        v[4] = 1;
        assert_eq!(Z4dl::parse(&v).unwrap_err(), Z4dlError::Version(1));
        // A frame of the wrong length for the reference.
        let mut v = render_header(5, &reference_digest(b"abcde"));
        v.extend(render_z4ai(Transform::Opaque, &[], &[stored_plane(b"ab")]));
        assert_eq!(
            Z4dl::parse(&v).unwrap_err(),
            Z4dlError::FrameLength {
                frame: 2,
                ref_len: 5
            }
        );
        // Every truncation is an error, never a panic.
        for n in 0..blob.len() {
            assert!(Z4dl::parse(&blob[..n]).is_err(), "prefix {n}");
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(tail in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let mut v = MAGIC.to_vec();
            v.extend(tail);
            let _ = Z4dl::parse(&v);
        }
    }
}
