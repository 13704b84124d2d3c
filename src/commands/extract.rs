//! `ckptfs extract MODEL --tensor T... -o DIR [--safetensors]`: chosen
//! tensors of any model ckptfs reads, as raw `.bin` files or one
//! `.safetensors`, decoding only the blocks they cover and streaming them
//! (a tensor is never held whole). Every output is written atomically.

use super::{Global, Result};
use crate::cli::ExtractArgs;
use crate::fsutil::write_atomic;
use crate::model::{self, Model, ModelError};
use anyhow::Context as _;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

pub fn run(g: Global, a: ExtractArgs) -> Result<ExitCode> {
    let m = Model::open(&a.input)?;
    let picked: Vec<usize> = a
        .tensors
        .iter()
        .map(|s| m.find_tensor(s))
        .collect::<std::result::Result<_, _>>()?;
    std::fs::create_dir_all(&a.output).with_context(|| a.output.display().to_string())?;
    if a.safetensors {
        let stem = a
            .input
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "tensors".into());
        let p = a.output.join(format!("{stem}.safetensors"));
        let mut header = serde_json::Map::new();
        let mut off = 0u64;
        for &k in &picked {
            let t = &m.tensors()[k];
            if header.contains_key(&t.name) {
                anyhow::bail!("{}: tensor {:?} named twice", a.input.display(), t.name);
            }
            header.insert(
                t.name.clone(),
                serde_json::json!({
                    "dtype": t.dtype,
                    "shape": t.shape,
                    "data_offsets": [off, off + t.len],
                }),
            );
            off += t.len;
        }
        let mut h = serde_json::to_vec(&header)?;
        while !h.len().is_multiple_of(8) {
            h.push(b' ');
        }
        write_output(&p, a.force, |w| {
            w.write_all(&(h.len() as u64).to_le_bytes())
                .map_err(ModelError::Output)?;
            w.write_all(&h).map_err(ModelError::Output)?;
            for &k in &picked {
                m.stream_tensor(k, 1, &mut |b| w.write_all(b))?;
            }
            Ok(())
        })?;
        if !g.quiet {
            eprintln!(
                "{}: {}",
                p.display(),
                super::plural(picked.len(), "tensor", "tensors")
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    for &k in &picked {
        let t = &m.tensors()[k];
        let p = a
            .output
            .join(format!("{}.bin", crate::model::bin_name(&t.name)));
        write_output(&p, a.force, |w| {
            m.stream_tensor(k, 1, &mut |b| w.write_all(b))
        })?;
        if !g.quiet {
            eprintln!("{}: {} {:?} {} bytes", p.display(), t.dtype, t.shape, t.len);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `path` atomically (see [`write_atomic`]) through `fill`, which
/// reads the model: an error reading it comes back as it is (it names the
/// model), an error writing names `path`. Nothing is left at `path` on
/// failure.
pub(super) fn write_output(
    path: &Path,
    force: bool,
    fill: impl FnOnce(&mut std::io::BufWriter<&std::fs::File>) -> model::Result<()>,
) -> Result<()> {
    let mut failed = None;
    let r = write_atomic(path, force, |w| {
        fill(w).map_err(|e| match e {
            ModelError::Output(e) => e,
            e => {
                failed = Some(e);
                std::io::Error::other("reading the model failed")
            }
        })
    });
    if let Some(e) = failed {
        return Err(e.into());
    }
    r.with_context(|| path.display().to_string())
}
