//! Errors as Python sees them, and the guard every entry point runs in.
//!
//! Two kinds, raised as classes the Python half defines in
//! `ckptfs._errors` (so that they can inherit from two built-ins, which
//! classes made in Rust cannot): `FormatError` (a `ckptfs.Error` and a
//! `ValueError`: the bytes are damaged, truncated, hostile or of a kind
//! ckptfs does not read) and `StorageError` (a `ckptfs.Error` and an
//! `OSError`, with `errno` when there is one: the bytes could not be read
//! or written). The message is the CLI's one line, naming the file.

use ckptfs::archive::ArchiveError;
use pyo3::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

#[derive(Debug)]
pub enum NativeError {
    /// Damaged, truncated, hostile or unsupported input; a bad argument.
    Format(String),
    /// Reading or writing failed (the message, the OS error number).
    Io(String, Option<i32>),
}

pub type Result<T> = std::result::Result<T, NativeError>;

impl From<ArchiveError> for NativeError {
    fn from(e: ArchiveError) -> Self {
        let line = ckptfs::commands::one_line(&e);
        match &e {
            ArchiveError::Io { source, .. } => NativeError::Io(line, source.raw_os_error()),
            ArchiveError::Container { .. }
            | ArchiveError::Blz { .. }
            | ArchiveError::Blazex { .. }
            | ArchiveError::Frame { .. }
            | ArchiveError::Integrity { .. }
            | ArchiveError::Unrecognised { .. } => NativeError::Format(line),
        }
    }
}

/// An I/O error about `what` (a path, a URL).
pub fn io(what: &str, e: std::io::Error) -> NativeError {
    let code = e.raw_os_error();
    NativeError::Io(format!("{what}: {}", ckptfs::commands::one_line(&e)), code)
}

/// A format error about `what`.
pub fn format(what: &str, e: impl std::fmt::Display) -> NativeError {
    NativeError::Format(format!("{what}: {e}"))
}

fn to_py(py: Python<'_>, e: NativeError) -> PyErr {
    let raise = || -> PyResult<PyErr> {
        let m = py.import("ckptfs._errors")?;
        let (class, msg, code) = match e {
            NativeError::Format(msg) => ("FormatError", msg, None),
            NativeError::Io(msg, code) => ("StorageError", msg, code),
        };
        let value = m.getattr(class)?.call1((msg,))?;
        if let Some(code) = code {
            value.setattr("errno", code)?;
        }
        Ok(PyErr::from_value(value))
    };
    raise().unwrap_or_else(|e| e)
}

/// Runs `f` with the GIL released; its error, or a panic, comes back as a
/// `ckptfs.Error`.
pub fn guarded<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T> + Send) -> PyResult<T> {
    let r = py.detach(|| catch_unwind(AssertUnwindSafe(f)));
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(to_py(py, e)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            Err(to_py(
                py,
                NativeError::Format(format!("internal error (a bug in ckptfs): {what}")),
            ))
        }
    }
}
