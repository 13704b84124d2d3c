//! Command-line types (clap derive). Doc comments here are the `--help` text.

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// ckptfs: compressed model checkpoints, served as ordinary safetensors files.
#[derive(Debug, Parser)]
#[command(name = "ckptfs", version, about, propagate_version = true)]
pub struct Cli {
    /// Worker threads for parallel work (default: all cores).
    #[arg(long, global = true, value_name = "N")]
    pub threads: Option<usize>,

    /// Never show progress bars.
    #[arg(long, short, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Restore the original .safetensors from a .zstn (or a raw file from a .z4ai frame).
    Unpack(UnpackArgs),
    /// Summarise archives: tensors, dtypes, sizes, ratio, frame kinds and plane methods.
    Info(InfoArgs),
    /// Decode everything and check all structure and checksums; one verdict line per file.
    Verify(VerifyArgs),
}

#[derive(Debug, clap::Args)]
pub struct UnpackArgs {
    /// The archive to unpack.
    pub input: PathBuf,
    /// Output path (default: the input name without .zstn, ending in .safetensors).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Replace an existing output file.
    #[arg(short, long)]
    pub force: bool,
}

#[derive(Debug, clap::Args)]
pub struct InfoArgs {
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Machine-readable JSON output.
    #[arg(long)]
    pub json: bool,
    /// Only the summary, without the per-tensor table.
    #[arg(long)]
    pub summary: bool,
}

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}
