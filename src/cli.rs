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
    /// Compress a .safetensors file into a .zstn (or a model directory into a store with -r).
    Pack(PackArgs),
    /// Restore the original .safetensors from a .zstn (or a raw file from a .z4ai frame).
    Unpack(UnpackArgs),
    /// Summarise archives: tensors, dtypes, sizes, ratio, frame kinds and plane methods.
    Info(InfoArgs),
    /// Decode everything and check all structure and checksums; one verdict line per file.
    Verify(VerifyArgs),
    /// Mount a store of .zstn archives read-only, presenting them as .safetensors files.
    Mount(MountArgs),
    /// Unmount a ckptfs mount.
    Umount(UmountArgs),
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

#[derive(Debug, clap::Args)]
pub struct PackArgs {
    /// A .safetensors file, or with -r a model directory.
    pub input: PathBuf,
    /// Output .zstn (default: INPUT with .safetensors replaced by .zstn); with -r the store directory.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Pack a whole directory tree: every .safetensors becomes a .zstn, every other file is copied.
    #[arg(short, long)]
    pub recursive: bool,
    /// zstd level for opaque (integer, bool, fp8) tensors.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=19))]
    pub level: i32,
    /// Replace existing output files.
    #[arg(short, long)]
    pub force: bool,
}

#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// The store directory (archives and any other files).
    pub store: PathBuf,
    /// Where to present it.
    pub mountpoint: PathBuf,
    /// Stay attached to the terminal (for systemd and debugging).
    #[arg(short, long)]
    pub foreground: bool,
    /// Memory for decoded blocks, e.g. 2G or 512M (default: 1/8 of RAM, 256M..4G).
    #[arg(long, value_name = "SIZE")]
    pub cache_size: Option<String>,
    /// Let other users access the mount (needs user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    pub allow_other: bool,
    /// error, warn, info, debug or trace (or a RUST_LOG filter); RUST_LOG also works.
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Log file of the background daemon (default: ~/.local/state/ckptfs/mount-<mountpoint>.log).
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct UmountArgs {
    pub mountpoint: PathBuf,
    /// Detach now even if files are open; the daemon exits when they close.
    #[arg(short, long)]
    pub lazy: bool,
}
