//! `ckptfs info`: what an archive holds and how well it is compressed.

use super::{open_input, Global, Input, Result};
use crate::archive::{ArchiveView, ZstnArchive};
use crate::codec::plane::method_name;
use crate::format::frame::Frame;
use crate::format::zstn::{Layout, RecordKind};
use anyhow::Context as _;
use serde::Serialize;
use std::collections::BTreeMap;
use std::process::ExitCode;

#[derive(Debug, Serialize)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
    pub ratio: f64,
    pub record: &'static str,
    pub frame: String,
    pub methods: Vec<&'static str>,
    pub blocks: usize,
}

#[derive(Debug, Serialize)]
pub struct FileInfo {
    pub file: String,
    pub format: &'static str,
    pub tensors: usize,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
    pub ratio: f64,
    pub checksums: bool,
    pub dtypes: BTreeMap<String, usize>,
    pub frame_kinds: BTreeMap<String, usize>,
    pub plane_methods: BTreeMap<String, usize>,
    pub records: BTreeMap<String, usize>,
    pub tensor_list: Vec<TensorInfo>,
}

fn ratio(raw: u64, stored: u64) -> f64 {
    if stored == 0 {
        1.0
    } else {
        raw as f64 / stored as f64
    }
}

fn frame_desc(f: &Frame<'_>) -> (String, Vec<&'static str>) {
    (
        f.kind_tag(),
        f.plane_methods().into_iter().map(method_name).collect(),
    )
}

pub fn archive_info(a: &ZstnArchive) -> crate::archive::Result<FileInfo> {
    let mut info = FileInfo {
        file: a.path().display().to_string(),
        format: "ZSTN v3",
        tensors: 0,
        raw_bytes: a.len(),
        stored_bytes: a.stored_len(),
        ratio: ratio(a.len(), a.stored_len()),
        checksums: a.extension().is_some(),
        dtypes: BTreeMap::new(),
        frame_kinds: BTreeMap::new(),
        plane_methods: BTreeMap::new(),
        records: BTreeMap::new(),
        tensor_list: Vec::new(),
    };
    if let Some(h) = a.header() {
        info.tensors = h.tensors.len();
        for t in &h.tensors {
            *info.dtypes.entry(t.dtype.clone()).or_default() += 1;
        }
    }
    let count = |info: &mut FileInfo, f: &Frame<'_>| {
        *info.frame_kinds.entry(f.kind_tag()).or_default() += 1;
        for m in f.plane_methods() {
            *info
                .plane_methods
                .entry(method_name(m).to_string())
                .or_default() += 1;
        }
    };
    match &a.container().layout {
        Layout::Opaque { frame_len, .. } => {
            let f = a.frame(0)?;
            count(&mut info, &f);
            *info.records.entry("opaque".into()).or_default() += 1;
            let (frame, methods) = frame_desc(&f);
            info.tensor_list.push(TensorInfo {
                name: "<whole data buffer>".into(),
                dtype: "-".into(),
                shape: vec![],
                raw_bytes: a.container().data_len,
                stored_bytes: *frame_len,
                ratio: ratio(a.container().data_len, *frame_len),
                record: "OPAQUE",
                frame,
                methods,
                blocks: 1,
            });
        }
        Layout::Indexed { records, .. } => {
            // One map, not a search of the header per record.
            let entries: std::collections::HashMap<&str, &crate::format::safetensors::TensorEntry> =
                a.header()
                    .map(|h| h.tensors.iter().map(|t| (t.name.as_str(), t)).collect())
                    .unwrap_or_default();
            for (i, r) in records.iter().enumerate() {
                let entry = entries.get(a.record_name(i));
                let (dtype, shape) =
                    entry.map_or(("?".into(), vec![]), |e| (e.dtype.clone(), e.shape.clone()));
                let unit = a.unit_of_record(i);
                let f = a.frame(unit)?;
                let (frame, methods) = frame_desc(&f);
                let (record, stored) = match r.kind {
                    RecordKind::Frame { len, .. } => {
                        count(&mut info, &f);
                        ("FRAME", len)
                    }
                    RecordKind::Ref(_) => ("REF", 0),
                };
                *info.records.entry(record.into()).or_default() += 1;
                info.tensor_list.push(TensorInfo {
                    name: a.record_name(i).to_string(),
                    dtype,
                    shape,
                    raw_bytes: r.len(),
                    stored_bytes: stored,
                    ratio: ratio(r.len(), stored),
                    record,
                    frame,
                    methods,
                    blocks: a.grid(unit)?.blocks(),
                });
            }
        }
    }
    Ok(info)
}

fn frame_info(path: &std::path::Path, bytes: &[u8]) -> Result<FileInfo> {
    let f = Frame::parse(bytes).with_context(|| path.display().to_string())?;
    let raw = f.decoded_len();
    let (frame, methods) = frame_desc(&f);
    let mut info = FileInfo {
        file: path.display().to_string(),
        format: "z4ai frame",
        tensors: 1,
        raw_bytes: raw,
        stored_bytes: bytes.len() as u64,
        ratio: ratio(raw, bytes.len() as u64),
        checksums: false,
        dtypes: BTreeMap::new(),
        frame_kinds: BTreeMap::from([(frame.clone(), 1)]),
        plane_methods: BTreeMap::new(),
        records: BTreeMap::new(),
        tensor_list: vec![],
    };
    for m in &methods {
        *info.plane_methods.entry(m.to_string()).or_default() += 1;
    }
    info.tensor_list.push(TensorInfo {
        name: "<frame>".into(),
        dtype: "-".into(),
        shape: vec![],
        raw_bytes: raw,
        stored_bytes: bytes.len() as u64,
        ratio: info.ratio,
        record: "FRAME",
        frame,
        methods,
        blocks: 1,
    });
    Ok(info)
}

fn hist(m: &BTreeMap<String, usize>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} ×{v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_human(i: &FileInfo, per_tensor: bool) {
    println!("{}", i.file);
    println!(
        "  format        {}{}",
        i.format,
        if i.checksums { " + CKX1 checksums" } else { "" }
    );
    println!("  tensors       {}", i.tensors);
    println!("  dtypes        {}", hist(&i.dtypes));
    println!("  raw bytes     {}", i.raw_bytes);
    println!("  stored bytes  {}", i.stored_bytes);
    println!("  ratio         {:.4}", i.ratio);
    println!("  records       {}", hist(&i.records));
    println!("  frame kinds   {}", hist(&i.frame_kinds));
    println!("  plane methods {}", hist(&i.plane_methods));
    if per_tensor {
        println!(
            "  {:<48} {:>8} {:>14} {:>14} {:>7} {:>6}  frame / planes",
            "tensor", "dtype", "raw", "stored", "ratio", "blocks"
        );
        for t in &i.tensor_list {
            println!(
                "  {:<48} {:>8} {:>14} {:>14} {:>7.3} {:>6}  {}{} [{}]",
                t.name,
                t.dtype,
                t.raw_bytes,
                t.stored_bytes,
                t.ratio,
                t.blocks,
                if t.record == "REF" { "REF -> " } else { "" },
                t.frame,
                t.methods.join(",")
            );
        }
    }
}

pub fn run(_g: Global, a: crate::cli::InfoArgs) -> Result<ExitCode> {
    let mut infos = Vec::new();
    let mut failed = false;
    for path in &a.files {
        if super::blz::is_blz(path) {
            if let Err(e) = super::blz::info(path, a.json) {
                eprintln!("ckptfs: {e}");
                failed = true;
            }
            continue;
        }
        let r = match open_input(path) {
            // Archives other than .blz are ZSTN: opened again as such for
            // the container-level details only a .zstn has.
            Ok(Input::Archive(_)) => ZstnArchive::open(path)
                .and_then(|ar| archive_info(&ar))
                .map_err(|e| e.into()),
            Ok(Input::Frame(map)) => frame_info(path, &map),
            Err(e) => Err(e),
        };
        match r {
            Ok(i) => infos.push(i),
            Err(e) => {
                eprintln!("ckptfs: {e}");
                failed = true;
            }
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&infos)?);
    } else {
        for i in &infos {
            print_human(i, !a.summary);
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
