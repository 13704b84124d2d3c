//! Extended attributes through a real mount (issue 16, item 4): `user.*`
//! attributes of plain and staged files are the backing file's, so
//! `cp --preserve=xattr` into the mount works; an archive's
//! `user.ckptfs.*` are answered by name but not listed, so `cp -a` out of
//! the mount does not copy them onto the decoded file.
//!
//! Needs root and /dev/fuse, as the other mount tests.

use crate::common;

use common::{populate_store, Mount};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn set(p: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let n = CString::new(name).unwrap();
    // SAFETY: NUL-terminated path and name; `value` readable for its length.
    let r = unsafe {
        libc::setxattr(
            c(p).as_ptr(),
            n.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn get(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: NUL-terminated path and name; `buf` writable for its length.
    let r = unsafe {
        libc::getxattr(
            c(p).as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

fn list(p: &Path) -> Vec<String> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: NUL-terminated path; `buf` writable for its length.
    let r = unsafe {
        libc::listxattr(
            c(p).as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
        )
    };
    assert!(
        r >= 0,
        "listxattr {}: {}",
        p.display(),
        io::Error::last_os_error()
    );
    buf.truncate(r as usize);
    buf.split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

fn remove(p: &Path, name: &str) -> io::Result<()> {
    let n = CString::new(name).unwrap();
    // SAFETY: NUL-terminated path and name.
    if unsafe { libc::removexattr(c(p).as_ptr(), n.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[test]
fn user_xattrs_round_trip_on_plain_and_staged_files() {
    let m = Mount::new(|_| {}, &[]);
    let plain = m.path("notes.txt");
    std::fs::write(&plain, b"hello").unwrap();
    set(&plain, "user.origin", b"hub").unwrap();
    assert_eq!(get(&plain, "user.origin").unwrap(), b"hub");
    assert_eq!(list(&plain), ["user.origin"]);
    // The backing file holds it.
    assert_eq!(
        get(&m.store.join("notes.txt"), "user.origin").unwrap(),
        b"hub"
    );
    remove(&plain, "user.origin").unwrap();
    assert_eq!(
        get(&plain, "user.origin").unwrap_err().raw_os_error(),
        Some(libc::ENODATA)
    );
    // Only user.* is passed through.
    assert_eq!(
        set(&plain, "trusted.x", b"1").unwrap_err().raw_os_error(),
        Some(libc::ENOTSUP)
    );

    let dir = m.path("d");
    std::fs::create_dir(&dir).unwrap();
    set(&dir, "user.tag", b"v").unwrap();
    assert_eq!(get(&dir, "user.tag").unwrap(), b"v");

    // A staged .safetensors: held open, so it stays staged (not compressed).
    let staged = m.path("w.safetensors");
    let f = std::fs::File::create(&staged).unwrap();
    set(&staged, "user.step", b"1000").unwrap();
    assert_eq!(get(&staged, "user.step").unwrap(), b"1000");
    assert_eq!(list(&staged), ["user.step"]);
    drop(f);
}

#[test]
fn cp_preserve_xattr_into_the_mount_succeeds() {
    let m = Mount::new(|_| {}, &[]);
    let src = m.dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a.txt"), b"a").unwrap();
    std::fs::write(src.join("sub/b.txt"), b"b").unwrap();
    set(&src.join("a.txt"), "user.k", b"v").unwrap();
    let out = Command::new("cp")
        .arg("-r")
        .arg("--preserve=xattr")
        .arg(&src)
        .arg(m.path("dst"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(get(&m.path("dst/a.txt"), "user.k").unwrap(), b"v");
}

#[test]
fn archive_xattrs_answer_by_name_but_are_not_copied() {
    let m = Mount::new(
        |s| {
            populate_store(s);
        },
        &[],
    );
    let x = m.path("packed_bf16_dense.safetensors");
    assert!(!get(&x, "user.ckptfs.ratio").unwrap().is_empty());
    assert!(list(&x).is_empty());
    assert_eq!(
        set(&x, "user.k", b"v").unwrap_err().raw_os_error(),
        Some(libc::ENOTSUP)
    );
    let out_path = m.dir.path().join("out.safetensors");
    let out = Command::new("cp")
        .arg("-a")
        .arg(&x)
        .arg(&out_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(list(&out_path)
        .iter()
        .all(|n| !n.starts_with("user.ckptfs.")));
    assert!(get(&x, "user.ckptfs.ratio").is_ok());
}

#[test]
fn ckptfs_info_prints_the_attributes_of_a_mounted_archive() {
    let m = Mount::new(
        |s| {
            populate_store(s);
        },
        &[],
    );
    let x = m.path("packed_bf16_dense.safetensors");
    let out = common::ckptfs(&["info", x.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let ratio = String::from_utf8(get(&x, "user.ckptfs.ratio").unwrap()).unwrap();
    for name in [
        "user.ckptfs.format",
        "user.ckptfs.stored_size",
        "user.ckptfs.checksums",
    ] {
        assert!(text.contains(name), "{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.contains("user.ckptfs.ratio") && l.ends_with(&ratio)),
        "{text}"
    );
}
