//! `ckptfs._native`: the Rust half of the `ckptfs` Python package.
//!
//! Owns opening what the CLI reads (a `.zstn`, a delta with its base, a
//! plain `.safetensors`, a safetensors member of a `.blz`, an `s3://`
//! object) as a [`Reader`], decoding byte ranges of its tensors straight
//! into memory the caller allocated (a numpy array's or a torch tensor's),
//! and writing an archive from tensors in memory. The Python half
//! (`python/ckptfs/`) owns dtypes, shapes, slicing and the framework types.
//!
//! Invariants:
//! - every entry point runs under [`guarded`]: a Rust panic becomes a
//!   `ckptfs.Error`, never a `PanicException` or an abort;
//! - decoding runs with the GIL released, on rayon's pool, each block
//!   decoded once per call and copied into its destinations (no buffer of
//!   a whole tensor in between);
//! - destinations are raw addresses the Python half took from arrays it
//!   allocated and keeps alive for the duration of the call; the ranges
//!   written are checked against the tensor's extent here, and distinct
//!   destinations never overlap (the Python half allocates one per range).
//!
//! Depends on the `ckptfs` library only through its public API
//! (`archive`, `format::safetensors`, `pack`, `fsutil`, `store::s3`).

mod errors;
mod reader;
mod s3;
mod writer;

use errors::guarded;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use reader::{Reader as Inner, Target};

/// An opened checkpoint: its tensors' table and a way to decode them.
#[pyclass(module = "ckptfs._native", frozen)]
struct Reader {
    inner: Inner,
}

#[pymethods]
impl Reader {
    /// The tensors in header order: (name, dtype, shape, begin, end),
    /// offsets relative to the data section.
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items: Vec<_> = self
            .inner
            .header
            .tensors
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    t.dtype.as_str(),
                    t.shape.clone(),
                    t.begin,
                    t.end,
                )
            })
            .collect();
        PyList::new(py, items)
    }

    /// `__metadata__` as a dict, or None.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(m) = &self.inner.header.metadata else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        for (k, v) in m {
            d.set_item(k, v)?;
        }
        Ok(Some(d))
    }

    /// What was opened: `safetensors` or the archive's format name.
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind_name()
    }

    /// The name messages use.
    #[getter]
    fn name(&self) -> String {
        self.inner.name.clone()
    }

    /// Decodes ranges of tensor data into caller memory: each target is
    /// (tensor index, offset within the tensor's bytes, length, address).
    fn read_into(&self, py: Python<'_>, targets: Vec<(usize, u64, u64, usize)>) -> PyResult<()> {
        let targets: Vec<Target> = targets
            .into_iter()
            .map(|(tensor, offset, len, addr)| Target {
                tensor,
                offset,
                len,
                addr,
            })
            .collect();
        guarded(py, || self.inner.read_into(&targets))
    }
}

/// Opens `path`: a file, a member of a `.blz` as `ARCHIVE.blz/MEMBER`, or
/// an `s3://BUCKET/KEY` URL.
#[pyfunction]
fn open(py: Python<'_>, path: String) -> PyResult<Reader> {
    let inner = guarded(py, || Inner::open(&path))?;
    Ok(Reader { inner })
}

/// Opens a checkpoint held in memory (an archive or a plain safetensors
/// file's bytes).
#[pyfunction]
fn open_bytes(py: Python<'_>, data: &Bound<'_, PyBytes>) -> PyResult<Reader> {
    let bytes = data.as_bytes().to_vec();
    let inner = guarded(py, || Inner::from_bytes(bytes))?;
    Ok(Reader { inner })
}

/// The files an archive presents (relative paths; one empty path for a
/// single-file archive), with their sizes.
#[pyfunction]
fn members(py: Python<'_>, path: String) -> PyResult<Vec<(String, u64)>> {
    guarded(py, || reader::members(&path))
}

/// Writes member `member` of the archive at `path` to `dest`
/// (atomically, replacing it).
#[pyfunction]
fn extract(py: Python<'_>, path: String, member: String, dest: String) -> PyResult<()> {
    guarded(py, || reader::extract(&path, &member, &dest))
}

/// Packs tensors into an archive: each item is (name, dtype, shape,
/// address, byte length) of contiguous little-endian memory. Writes `path`
/// atomically, or returns the archive's bytes when `path` is None.
#[pyfunction]
#[pyo3(signature = (items, metadata, level, path, compat="ckptfs"))]
fn save<'py>(
    py: Python<'py>,
    items: Vec<(String, String, Vec<u64>, usize, u64)>,
    metadata: Option<Vec<(String, String)>>,
    level: i32,
    path: Option<String>,
    compat: &str,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let items: Vec<writer::Item> = items
        .into_iter()
        .map(|(name, dtype, shape, addr, len)| writer::Item {
            name,
            dtype,
            shape,
            addr,
            len,
        })
        .collect();
    let out = guarded(py, || {
        writer::save(&items, metadata.as_deref(), level, compat, path.as_deref())
    })?;
    Ok(out.map(|b| PyBytes::new(py, &b)))
}

/// Whether a file starting with `head` is one ckptfs opens as an archive
/// (or a z4ai kind it names and refuses), as opposed to a plain
/// safetensors file.
#[pyfunction]
fn is_archive(head: &[u8]) -> bool {
    reader::is_archive(head)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    ckptfs::tune_allocator();
    m.add_class::<Reader>()?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(open_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(members, m)?)?;
    m.add_function(wrap_pyfunction!(extract, m)?)?;
    m.add_function(wrap_pyfunction!(save, m)?)?;
    m.add_function(wrap_pyfunction!(is_archive, m)?)?;
    Ok(())
}
