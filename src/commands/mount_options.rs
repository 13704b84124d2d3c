//! `-o OPTIONS`: mount(8)'s form of `ckptfs mount`'s flags, so that a line
//! of `/etc/fstab` (`STORE MNT fuse.ckptfs ro,allow_other,cache_size=4G 0 0`)
//! mounts a store.
//!
//! mount(8) hands a `fuse.ckptfs` line to fuse3's `mount.fuse3`, which runs
//! `ckptfs STORE MNT -o OPTIONS` (main.rs reads that form as `ckptfs mount`)
//! after dropping the options only mount(8) acts on (`nofail`, `_netdev`,
//! `x-systemd.*`, `noauto`, ...). They are accepted here too, so the same
//! line can be given to ckptfs directly. Each option is one of:
//!
//! - a flag of `ckptfs mount`, with `_` or `-`: `cache_size=4G`,
//!   `delta=auto`, `compat=z4ai`, `read_only`, `metrics_addr=127.0.0.1:9100`, `threads=8`;
//! - a generic option with its mount(8) meaning: `ro`, `rw` (the last one
//!   wins, as in mount(8)), `allow_other`, `nonempty`,
//!   `default_permissions` (always on: ckptfs checks modes in the kernel);
//! - a kernel flag passed to the FUSE mount: `noexec`, `exec`, `noatime`,
//!   `atime`, `sync`, `async`, `dirsync` (`nodev` and `nosuid` are always
//!   set; `dev` and `suid`, which mount(8) adds for root, are accepted and
//!   have no effect: a checkpoint store has no device or set-user-ID files
//!   to honour);
//! - ignored as mount(8) expects of a helper: `defaults`, `auto`,
//!   `noauto`, `user`, `users`, `nouser`, `owner`, `group`, `nofail`,
//!   `_netdev`, `relatime`, `strictatime`, `nodiratime`, `lazytime`,
//!   `comment=...` and every `x-...` (`x-systemd.automount`, ...).
//!
//! Anything else is refused with one line naming the option, before
//! anything is mounted.

use crate::cli::{CompatArg, DeltaMode, ExportCast, MountArgs};
use clap::ValueEnum;
use fuser::MountOption;

/// Applies every `-o` list of `a` to its fields and keeps in `a.options`
/// only the kernel flags (so that the daemon, re-executed with them, sees
/// the same thing). Returns the `threads=` value, if any.
pub fn apply(a: &mut MountArgs) -> Result<Option<usize>, String> {
    let mut threads = None;
    let mut kernel = Vec::new();
    for opt in a
        .options
        .iter()
        .flat_map(|o| o.split(','))
        .map(str::trim)
        .filter(|o| !o.is_empty())
        .map(str::to_string)
        .collect::<Vec<_>>()
    {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n.replace('-', "_"), Some(v.to_string())),
            None => (opt.replace('-', "_"), None),
        };
        let bad = |why: &str| format!("-o {opt}: {why}");
        let need = || {
            value
                .clone()
                .ok_or_else(|| bad("needs a value (NAME=VALUE)"))
        };
        let no_value = || {
            value
                .is_none()
                .then_some(())
                .ok_or_else(|| bad("takes no value"))
        };
        let flag = |on: &mut bool| no_value().map(|()| *on = true);
        match name.as_str() {
            "ro" | "read_only" => flag(&mut a.read_only)?,
            "rw" => {
                no_value()?;
                a.read_only = false;
            }
            "allow_other" => flag(&mut a.allow_other)?,
            "nonempty" | "allow_nonempty" => flag(&mut a.allow_nonempty)?,
            "require_checksums" => flag(&mut a.require_checksums)?,
            "foreground" => flag(&mut a.foreground)?,
            "default_permissions" | "dev" | "suid" | "nodev" | "nosuid" => no_value()?,
            "noexec" | "exec" | "noatime" | "atime" | "sync" | "async" | "dirsync" => {
                no_value()?;
                kernel.push(name);
            }
            "defaults" | "auto" | "noauto" | "user" | "users" | "nouser" | "owner" | "group"
            | "nofail" | "_netdev" | "relatime" | "strictatime" | "nodiratime" | "lazytime"
            | "comment" => {}
            n if n.starts_with("x_") => {}
            "cache_size" => a.cache_size = Some(size(need()?).map_err(|e| bad(&e))?),
            "disk_cache_size" => a.disk_cache_size = Some(size(need()?).map_err(|e| bad(&e))?),
            "log_level" => a.log_level = Some(need()?),
            "log_file" => a.log_file = Some(need()?.into()),
            "cache_dir" => a.cache_dir = Some(need()?.into()),
            "endpoint_url" => a.endpoint_url = Some(need()?),
            "metrics_addr" => {
                let v = need()?;
                v.parse::<std::net::SocketAddr>()
                    .map_err(|_| bad("not an address like 127.0.0.1:9100"))?;
                a.metrics_addr = Some(v);
            }
            "gguf" => {
                a.gguf = Some(ExportCast::from_str(&need()?, true).map_err(|e| bad(&e))?);
            }
            "delta" => {
                a.delta = Some(DeltaMode::from_str(&need()?, true).map_err(|e| bad(&e))?);
            }
            "family_depth" => {
                let d: u32 = need()?
                    .parse()
                    .ok()
                    .filter(|d| (1..=4).contains(d))
                    .ok_or_else(|| bad("not a depth from 1 to 4"))?;
                a.family_depth = Some(d);
            }
            "compat" => a.compat = CompatArg::from_str(&need()?, true).map_err(|e| bad(&e))?,
            "metadata_ttl" => a.metadata_ttl = seconds(&need()?).map_err(|e| bad(&e))?,
            "request_timeout" => a.request_timeout = seconds(&need()?).map_err(|e| bad(&e))?,
            "read_timeout" => a.read_timeout = Some(seconds(&need()?).map_err(|e| bad(&e))?),
            "threads" => {
                let n: usize = need()?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| bad("not a positive number of threads"))?;
                threads = Some(n);
            }
            _ => return Err(bad("unknown mount option (see `ckptfs mount --help`)")),
        }
    }
    a.options = if kernel.is_empty() {
        Vec::new()
    } else {
        vec![kernel.join(",")]
    };
    Ok(threads)
}

fn size(v: String) -> Result<String, String> {
    super::mount::parse_size(&v).map(|_| v)
}

fn seconds(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .ok_or_else(|| format!("{v:?} is not a number of seconds"))
}

/// The kernel flags `apply` kept, as fuser's mount options.
pub fn kernel_flags(options: &[String]) -> Vec<MountOption> {
    options
        .iter()
        .flat_map(|o| o.split(','))
        .filter_map(|o| match o {
            "noexec" => Some(MountOption::NoExec),
            "exec" => Some(MountOption::Exec),
            "noatime" => Some(MountOption::NoAtime),
            "atime" => Some(MountOption::Atime),
            "sync" => Some(MountOption::Sync),
            "async" => Some(MountOption::Async),
            "dirsync" => Some(MountOption::DirSync),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn args(o: &[&str]) -> MountArgs {
        let mut v = vec!["ckptfs", "mount", "/s", "/m"];
        for x in o {
            v.extend(["-o", x]);
        }
        match Cli::parse_from(v).command {
            Command::Mount(a) => *a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn every_flag_of_mount_has_an_option() {
        let mut a = args(&[
            "ro,allow_other,nonempty,require_checksums,cache_size=4G,disk_cache_size=20G",
            "log-level=debug,log_file=/var/log/ck.log,cache_dir=/var/cache/ck,endpoint_url=http://h:9000",
            "gguf=q8_0,delta=auto,family_depth=4,compat=z4ai,metadata_ttl=5,request_timeout=2.5,read_timeout=9",
            "metrics_addr=127.0.0.1:9100,threads=3,foreground",
        ]);
        let threads = apply(&mut a).unwrap();
        assert_eq!(threads, Some(3));
        assert!(a.read_only && a.allow_other && a.allow_nonempty && a.require_checksums);
        assert!(a.foreground);
        assert_eq!(a.cache_size.as_deref(), Some("4G"));
        assert_eq!(a.disk_cache_size.as_deref(), Some("20G"));
        assert_eq!(a.log_level.as_deref(), Some("debug"));
        assert_eq!(
            a.log_file.as_deref(),
            Some(std::path::Path::new("/var/log/ck.log"))
        );
        assert_eq!(
            a.cache_dir.as_deref(),
            Some(std::path::Path::new("/var/cache/ck"))
        );
        assert_eq!(a.endpoint_url.as_deref(), Some("http://h:9000"));
        assert!(matches!(a.gguf, Some(ExportCast::Q8_0)));
        assert!(matches!(a.delta, Some(DeltaMode::Auto)));
        assert_eq!(a.family_depth, Some(4));
        assert_eq!(a.compat, CompatArg::Z4ai);
        assert_eq!((a.metadata_ttl, a.request_timeout), (5.0, 2.5));
        assert_eq!(a.read_timeout, Some(9.0));
        assert_eq!(a.metrics_addr.as_deref(), Some("127.0.0.1:9100"));
        assert!(a.options.is_empty());
    }

    #[test]
    fn generic_options_are_honoured_or_ignored_as_mount_expects() {
        let mut a = args(&[
            "ro,rw,default_permissions,nofail,_netdev,x-systemd.automount,x-systemd.after=network-online.target",
            "noauto,user,users,nouser,owner,group,defaults,auto,dev,suid,nodev,nosuid,relatime,comment=x",
            "noexec,noatime,dirsync",
        ]);
        assert_eq!(apply(&mut a).unwrap(), None);
        // rw after ro: the last one wins.
        assert!(!a.read_only);
        assert_eq!(a.options, vec!["noexec,noatime,dirsync".to_string()]);
        assert_eq!(
            kernel_flags(&a.options),
            vec![
                MountOption::NoExec,
                MountOption::NoAtime,
                MountOption::DirSync
            ]
        );
        // Applying the kept flags again changes nothing (the daemon does).
        let kept = a.options.clone();
        apply(&mut a).unwrap();
        assert_eq!(a.options, kept);
    }

    #[test]
    fn unknown_and_malformed_options_are_refused_in_one_line() {
        for (o, want) in [
            ("bogus", "-o bogus: unknown mount option"),
            ("cache_size", "-o cache_size: needs a value"),
            (
                "cache_size=lots",
                "-o cache_size=lots: \"lots\": not a size",
            ),
            ("ro=1", "-o ro=1: takes no value"),
            ("noexec=1", "-o noexec=1: takes no value"),
            ("delta=sometimes", "-o delta=sometimes: invalid variant"),
            (
                "family_depth=9",
                "-o family_depth=9: not a depth from 1 to 4",
            ),
            ("threads=0", "-o threads=0: not a positive number"),
            (
                "metrics_addr=0.0.0.0",
                "-o metrics_addr=0.0.0.0: not an address",
            ),
            (
                "request_timeout=-1",
                "-o request_timeout=-1: \"-1\" is not a number of seconds",
            ),
        ] {
            let e = apply(&mut args(&[o])).unwrap_err();
            assert!(e.starts_with(want), "{o}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
