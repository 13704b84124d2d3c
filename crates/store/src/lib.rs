//! **ckptfs-store**: object storage. Depends on `ckptfs-format` only (its
//! durable writes and digests); the archive readers above fetch through it.
//!
//! Where a store's bytes come from when it is not a local directory:
//! object storage through the S3 API.
//!
//! - [`s3`]: `s3://BUCKET/PREFIX` URLs and the blocking client (bounded
//!   retries and timeouts) over `object_store`;
//! - [`aws_config`]: credentials, region and endpoint from the AWS shared
//!   files (`~/.aws/credentials`, `~/.aws/config`, profiles);
//! - [`credentials`]: which credentials a profile's settings give (keys,
//!   a process, a role, SSO), kept until they are about to expire;
//! - [`credential_process`]: credentials printed by a profile's
//!   `credential_process` command;
//! - [`sts`]: credentials of a role assumed with STS `AssumeRole`;
//! - [`sso`]: credentials from IAM Identity Center after `aws sso login`;
//! - [`deadline`]: the one deadline of a mount request's waits for the
//!   server (`--read-timeout`);
//! - [`ranges`]: byte-range sets (pure);
//! - [`source`]: the [`source::ByteSource`] trait every archive reader
//!   reads through (a local map, memory, a remote copy), and
//!   [`source::Sources`], which gives an open file of a store its source;
//! - [`read_ahead`]: the one read-ahead policy of fetched sources;
//! - [`remote`]: a sparse local copy of one object version, filled on
//!   demand with ranged conditional GETs;
//! - [`mirror`]: the directory of such copies that a mount of an
//!   `s3://` store serves as its STORE, refreshed from the listing, and
//!   through which a writable mount changes the bucket; it is the mount's
//!   `Sources`;
//! - [`budget`]: the byte limit of the disk cache and its eviction order;
//! - [`lease`]: the lock object that keeps one writable daemon per prefix.
//!
//! Nothing here depends on `fs` or on FUSE.

pub mod aws_config;
pub mod budget;
pub mod credential_process;
pub mod credentials;
pub mod deadline;
pub mod lease;
pub mod mirror;
pub mod ranges;
pub mod read_ahead;
pub mod remote;
pub mod s3;
pub mod source;
pub mod sso;
pub mod sts;
pub mod traffic;
