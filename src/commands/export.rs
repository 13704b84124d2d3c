//! `ckptfs export MODEL -o OUT --to safetensors|pytorch|raw|gguf [--cast
//! T]`: the CLI over `crate::export` (progress bar, summary line).

use super::{progress, Global, Result};
use crate::cli::{ExportArgs, ExportCast, ExportTarget};
use crate::export::{self, Cast, Options, Target};
use crate::model::Model;
use std::process::ExitCode;
use std::time::Instant;

pub fn run(g: Global, a: ExportArgs) -> Result<ExitCode> {
    let t0 = Instant::now();
    let m = Model::open(&a.input)?;
    let opts = Options {
        target: match a.target {
            ExportTarget::Safetensors => Target::Safetensors,
            ExportTarget::Pytorch => Target::Pytorch,
            ExportTarget::Raw => Target::Raw,
            ExportTarget::Gguf => Target::Gguf,
        },
        cast: a.cast.map(cast_of),
        force: a.force,
    };
    let pb = progress(g, export::source_bytes(&m), "export");
    let s = export::export(&m, &a.output, &opts, &|n| pb.inc(n))?;
    pb.finish_and_clear();
    if !g.quiet {
        for n in &s.notes {
            eprintln!("{}: {n}", a.output.display());
        }
        let secs = t0.elapsed().as_secs_f64();
        eprintln!(
            "{} -> {}: {}, {}, {} -> {} bytes, {:.0} MB/s",
            a.input.display(),
            a.output.display(),
            super::plural(s.files, "file", "files"),
            super::plural(s.tensors, "tensor", "tensors"),
            s.source_bytes,
            s.written_bytes,
            s.source_bytes as f64 / 1e6 / secs.max(1e-9)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The export cast a `--cast`/`--gguf` value names.
pub(crate) fn cast_of(c: ExportCast) -> Cast {
    match c {
        ExportCast::F32 => Cast::F32,
        ExportCast::F16 => Cast::F16,
        ExportCast::Bf16 => Cast::BF16,
        ExportCast::Q8_0 => Cast::Q8_0,
        ExportCast::Q4_0 => Cast::Q4_0,
        ExportCast::Q4K => Cast::Q4K,
    }
}
