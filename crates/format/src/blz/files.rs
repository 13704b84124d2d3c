//! The files of a `.blz` directory: the checked [`FileEntry`] (its content
//! one of the kinds the format has) and the [`FileRecord`] the header JSON
//! writes, with the conversions between them ([`parse`](super::parse)
//! checks a record's fields for its kind; rendering goes back through serde).

use super::{BlzError, Digest, FileKind, Result, TensorEntry};
use serde::{Deserialize, Serialize};

/// One file of the directory, checked: its content is one of the kinds
/// the format has. Written as a [`FileRecord`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(into = "FileRecord")]
pub struct FileEntry {
    /// Relative, `/`-separated, no `.`/`..`/empty components.
    pub path: String,
    /// Size of the file when unpacked.
    pub size: u64,
    pub content: Content,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    /// A plain file: the xxh3 of its bytes, and where they are.
    Plain { xxh3: Digest, stored: Stored },
    /// A safetensors shard.
    Shard(Shard),
}

/// Where a plain file's bytes are.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored {
    /// Embedded in the header as UTF-8 text.
    Text(String),
    /// Embedded in the header as base64 (standard alphabet, padded).
    Base64(String),
    /// In DATA, as a blob.
    Blob(u32),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    /// The original header JSON, verbatim (padding included).
    pub header: String,
    pub header_xxh3: Digest,
    /// Length of the data buffer.
    pub data_length: u64,
    /// Shards whose tensors do not tile the data buffer: the blob holding
    /// the whole buffer (the tensors then have no blob of their own).
    pub data_blob: Option<u32>,
    /// Tensors in data-buffer order.
    pub tensors: Vec<TensorEntry>,
}

impl FileEntry {
    pub fn kind(&self) -> FileKind {
        match self.content {
            Content::Plain { .. } => FileKind::File,
            Content::Shard(_) => FileKind::Safetensors,
        }
    }
    /// The shard's tensors (none for a plain file).
    pub fn tensors(&self) -> &[TensorEntry] {
        match &self.content {
            Content::Shard(s) => &s.tensors,
            Content::Plain { .. } => &[],
        }
    }
    pub fn shard(&self) -> Option<&Shard> {
        match &self.content {
            Content::Shard(s) => Some(s),
            Content::Plain { .. } => None,
        }
    }
}

impl From<FileEntry> for FileRecord {
    fn from(f: FileEntry) -> FileRecord {
        let mut r = FileRecord {
            path: f.path,
            kind: FileKind::File,
            size: f.size,
            xxh3: None,
            text: None,
            base64: None,
            blob: None,
            safetensors_header: None,
            safetensors_header_xxh3: None,
            data_length: None,
            data_blob: None,
            tensors: None,
        };
        match f.content {
            Content::Plain { xxh3, stored } => {
                r.xxh3 = Some(xxh3);
                match stored {
                    Stored::Text(t) => r.text = Some(t),
                    Stored::Base64(b) => r.base64 = Some(b),
                    Stored::Blob(b) => r.blob = Some(b),
                }
            }
            Content::Shard(s) => {
                r.kind = FileKind::Safetensors;
                r.safetensors_header = Some(s.header);
                r.safetensors_header_xxh3 = Some(s.header_xxh3);
                r.data_length = Some(s.data_length);
                r.data_blob = s.data_blob;
                r.tensors = Some(s.tensors);
            }
        }
        r
    }
}

impl TryFrom<FileRecord> for FileEntry {
    type Error = BlzError;
    /// Checks that the record has exactly the fields its kind needs.
    fn try_from(r: FileRecord) -> Result<FileEntry> {
        let bad = |what: &str| {
            Err(BlzError::File {
                path: r.path.clone(),
                what: what.to_string(),
            })
        };
        let content = match r.kind {
            FileKind::File => {
                if r.safetensors_header.is_some()
                    || r.safetensors_header_xxh3.is_some()
                    || r.data_length.is_some()
                    || r.data_blob.is_some()
                    || r.tensors.is_some()
                {
                    return bad("a plain file has shard fields");
                }
                let Some(xxh3) = r.xxh3 else {
                    return bad("has no xxh3");
                };
                let stored = match (r.text, r.base64, r.blob) {
                    (Some(t), None, None) => Stored::Text(t),
                    (None, Some(b), None) => Stored::Base64(b),
                    (None, None, Some(i)) => Stored::Blob(i),
                    _ => return bad("needs exactly one of text, base64, blob"),
                };
                Content::Plain { xxh3, stored }
            }
            FileKind::Safetensors => {
                if r.xxh3.is_some() || r.text.is_some() || r.base64.is_some() || r.blob.is_some() {
                    return bad("a shard has plain-file fields");
                }
                let (Some(header), Some(header_xxh3), Some(data_length), Some(tensors)) = (
                    r.safetensors_header,
                    r.safetensors_header_xxh3,
                    r.data_length,
                    r.tensors,
                ) else {
                    return bad(
                        "a shard needs safetensors_header, safetensors_header_xxh3, data_length and tensors",
                    );
                };
                Content::Shard(Shard {
                    header,
                    header_xxh3,
                    data_length,
                    data_blob: r.data_blob,
                    tensors,
                })
            }
        };
        Ok(FileEntry {
            path: r.path,
            size: r.size,
            content,
        })
    }
}

/// One file of the directory as the header JSON writes it: which fields
/// are present depends on `kind` ([`FileEntry`] is the checked form).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileRecord {
    /// Relative, `/`-separated, no `.`/`..`/empty components.
    pub path: String,
    pub kind: FileKind,
    /// Size of the file when unpacked.
    pub size: u64,
    /// Plain files: xxh3 of the content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xxh3: Option<Digest>,
    /// Plain files embedded as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Plain files embedded as base64 (standard alphabet, padded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
    /// Plain files stored in DATA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob: Option<u32>,
    /// Shards: the original header JSON, verbatim (padding included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safetensors_header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safetensors_header_xxh3: Option<Digest>,
    /// Shards: length of the data buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_length: Option<u64>,
    /// Shards whose tensors do not tile the data buffer: the whole buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_blob: Option<u32>,
    /// Shards: tensors in data-buffer order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensors: Option<Vec<TensorEntry>>,
}
