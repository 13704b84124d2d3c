//! Where committed files go beyond STORE: the commit interface of a store
//! that is a copy of a remote one (an `s3://` mount's mirror).
//!
//! A local store has no sink: a commit is the rename into STORE. With a
//! sink, every change of a file in STORE is made remotely first, and the
//! local change only follows a remote success:
//!
//! - a commit (of a compressed `X.zstn`, or of a staged file put back
//!   plain) is [`Sink::publish`]ed from the spool, then renamed into
//!   STORE and reported with [`Sink::published`]; until the publish
//!   succeeds the staged copy presents the file, and a failed publish is
//!   retried (`queue`);
//! - removing a file of STORE is [`Sink::remove`] first;
//! - renaming one is [`Sink::copy`] first, the local rename, then
//!   [`Sink::moved`] (which removes the old object);
//! - a file whose bytes are about to leave STORE or change (staging it)
//!   is made whole locally first ([`Sink::fill`]).
//!
//! With a sink every regular file written through the mount is staged,
//! whatever its name, so that it is committed (uploaded) after its last
//! close and recovered from the spool after a crash.

use std::io;
use std::path::Path;

pub trait Sink: Send + Sync {
    /// Makes the finished file `local` the remote copy of STORE path `rel`,
    /// whole or not at all. Returns the new version's tag.
    fn publish(&self, local: &Path, rel: &Path) -> io::Result<String>;
    /// The file published as `rel` (version `tag`) is now in STORE at
    /// `rel` (absolute path `local`).
    fn published(&self, rel: &Path, local: &Path, tag: &str);
    /// Gives up a publish whose result was not committed (superseded):
    /// the remote copy of `rel` is removed unless STORE has `rel`.
    fn unpublish(&self, rel: &Path);
    /// Removes the remote copy of `rel` (absent is not an error; a name
    /// with neither a local file nor a known remote copy costs nothing).
    fn remove(&self, rel: &Path) -> io::Result<()>;
    /// Copies the remote copy of `from` to `to`, before a local rename.
    fn copy(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// The local rename `from` -> `to` (absolute `local`) was done:
    /// removes the remote `from`.
    fn moved(&self, from: &Path, to: &Path, local: &Path);
    /// Makes the local file `local` (STORE path `rel`) hold all its bytes,
    /// for good: it is about to be moved out of STORE (into the spool), so
    /// no cache may free any of them after this.
    fn fill(&self, rel: &Path, local: &Path) -> io::Result<()>;
    /// How messages name the remote copy of STORE path `rel` (a URL).
    fn describe(&self, rel: &Path) -> String {
        rel.display().to_string()
    }
}
