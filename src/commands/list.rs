//! `ckptfs list MODEL [--filter S] [--json]`: the tensors of any model
//! ckptfs reads (an archive of any kind, a `.safetensors` file, a model
//! directory), from the safetensors headers only: no tensor is decoded.

use super::{Global, Result};
use crate::cli::ListArgs;
use crate::model::Model;
use std::io::Write;
use std::process::ExitCode;

pub fn run(_g: Global, a: ListArgs) -> Result<ExitCode> {
    let m = Model::open(&a.input)?;
    let picked = m.tensors().iter().filter(|t| {
        a.filter
            .as_ref()
            .is_none_or(|s| t.name.contains(s.as_str()))
    });
    let mut out = std::io::stdout().lock();
    if a.json {
        let v: Vec<serde_json::Value> = picked
            .map(|t| {
                serde_json::json!({
                    "name": t.name,
                    "dtype": t.dtype,
                    "shape": t.shape,
                    "bytes": t.len,
                    "file": m.files()[t.file].path,
                })
            })
            .collect();
        let r = writeln!(out, "{}", serde_json::to_string_pretty(&v)?);
        return Ok(ended(r));
    }
    for t in picked {
        let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        let r = writeln!(
            out,
            "{:<64} {:>8} {:>20} {:>12}  {}",
            t.name,
            t.dtype,
            format!("[{}]", shape.join(", ")),
            t.len,
            m.files()[t.file].path
        );
        if r.is_err() {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A closed pipe (`| head`) ends the listing quietly.
fn ended(_r: std::io::Result<()>) -> ExitCode {
    ExitCode::SUCCESS
}
