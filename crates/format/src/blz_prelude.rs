//! The 20-byte prelude that opens both `.blz` archives ckptfs reads: its
//! own (`format::blz`, magic `CKPTBLZ\0`) and BLAZE-X's (`format::blazex`,
//! magic `BLAZXPK\n`), which share the layout:
//!
//! ```text
//! [8] magic  [u32 version]  [u64 header_len]  [header JSON]  [DATA]
//! ```
//!
//! [`parse`] checks the file's length, the magic and the version, and reads
//! the header length; [`render`] writes a prelude. What a header length may
//! be (the limit, and which of a too-large and a past-the-end length is
//! reported first) and every error's words stay each format's: the formats
//! map [`PreludeError`] to their own errors. Pure: no I/O.

/// Magic, version, header length.
pub const LEN: u64 = 20;

/// A parsed prelude.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prelude {
    /// Length of the header JSON that follows the prelude (not yet checked
    /// against the file).
    pub header_len: u64,
}

/// Why a prelude cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreludeError {
    /// The file is shorter than a prelude (its length).
    TooShort(u64),
    /// Another magic (its bytes, lossily as text).
    BadMagic(String),
    /// Another version (the one found).
    Version(u32),
}

/// Reads the prelude at the start of `bytes` (the whole file), which must
/// open with `magic` and `version`.
pub fn parse(bytes: &[u8], magic: &[u8; 8], version: u32) -> Result<Prelude, PreludeError> {
    if (bytes.len() as u64) < LEN {
        return Err(PreludeError::TooShort(bytes.len() as u64));
    }
    if &bytes[..8] != magic {
        return Err(PreludeError::BadMagic(
            String::from_utf8_lossy(&bytes[..8]).into_owned(),
        ));
    }
    let found = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if found != version {
        return Err(PreludeError::Version(found));
    }
    Ok(Prelude {
        header_len: u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes")),
    })
}

impl Prelude {
    /// Whether the header runs past the end of a file of `file_len` bytes.
    pub fn past_end(&self, file_len: u64) -> bool {
        self.header_len > file_len.saturating_sub(LEN)
    }

    /// Where DATA starts, once the header is known to fit the file.
    pub fn data_start(&self) -> u64 {
        LEN + self.header_len
    }
}

/// The prelude of a header of `header_len` bytes.
pub fn render(magic: &[u8; 8], version: u32, header_len: u64) -> [u8; 20] {
    let mut p = [0u8; 20];
    p[..8].copy_from_slice(magic);
    p[8..12].copy_from_slice(&version.to_le_bytes());
    p[12..20].copy_from_slice(&header_len.to_le_bytes());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses() {
        let p = render(b"CKPTBLZ\0", 1, 7);
        let got = parse(&p, b"CKPTBLZ\0", 1).unwrap();
        assert_eq!(got.header_len, 7);
        assert_eq!(got.data_start(), 27);
        assert!(!got.past_end(27) && got.past_end(26));
        assert_eq!(
            parse(&p[..19], b"CKPTBLZ\0", 1),
            Err(PreludeError::TooShort(19))
        );
        assert!(matches!(
            parse(&p, b"BLAZXPK\n", 1),
            Err(PreludeError::BadMagic(_))
        ));
        assert_eq!(parse(&p, b"CKPTBLZ\0", 2), Err(PreludeError::Version(1)));
    }
}
