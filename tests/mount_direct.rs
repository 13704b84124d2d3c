//! O_DIRECT through the mount, including O_DIRECT cleared with
//! fcntl(F_SETFL) after open (GNU dd does that for its last partial
//! block): unaligned I/O must then work as on the backing filesystem.

use crate::common;

use common::{gauss_bf16, safetensors_file, Mount, Rng};
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::process::Command;

fn clear_direct(f: &std::fs::File) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        assert!(fl >= 0);
        assert_eq!(
            libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_DIRECT),
            0
        );
    }
}

#[test]
fn dd_oflag_direct_writes_whole_files() {
    let src = tempfile::tempdir().unwrap();
    let mut rng = Rng(9);
    // Not a multiple of the block size: dd's last block is partial.
    let model = safetensors_file(
        &[(
            "w",
            "BF16",
            vec![1001, 1023],
            gauss_bf16(&mut rng, 1001 * 1023, 0.02),
        )],
        None,
    );
    std::fs::write(src.path().join("model.safetensors"), &model).unwrap();
    let config = b"{\"architectures\": [\"Test\"], \"pad\": \"xxxxxxxxxxxxxxxx\"}\n".repeat(300);
    std::fs::write(src.path().join("config.json"), &config).unwrap();
    let m = Mount::new(|_| {}, &[]);
    for name in ["model.safetensors", "config.json"] {
        let out = Command::new("dd")
            .arg(format!("if={}", src.path().join(name).display()))
            .arg(format!("of={}", m.path(name).display()))
            .args(["oflag=direct", "bs=1M", "status=none"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "dd {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(std::fs::read(m.path("model.safetensors")).unwrap() == model);
    assert!(std::fs::read(m.path("config.json")).unwrap() == config);
    // And once compressed, still the same bytes.
    m.wait_committed(60);
    assert!(std::fs::read(m.path("model.safetensors")).unwrap() == model);
}

#[test]
fn o_direct_cleared_with_fcntl_allows_unaligned_io() {
    let m = Mount::new(
        |s| std::fs::write(s.join("plain.bin"), vec![7u8; 8192]).unwrap(),
        &[],
    );
    for name in ["plain.bin", "staged.safetensors"] {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(m.path(name))
            .unwrap();
        // Aligned I/O with O_DIRECT set.
        let mut buf = common::Aligned::new(4096);
        buf.as_mut().fill(3);
        f.write_all_at(buf.as_mut(), 0).unwrap();
        // Cleared: unaligned sizes and offsets work, as on ext4.
        clear_direct(&f);
        f.write_all_at(b"unaligned tail", 4096 + 3).unwrap();
        let mut small = [0u8; 14];
        f.read_exact_at(&mut small, 4096 + 3).unwrap();
        assert_eq!(&small, b"unaligned tail", "{name}");
        let mut one = [0u8; 1];
        f.read_exact_at(&mut one, 5).unwrap();
        assert_eq!(one[0], 3, "{name}");
        drop(f);
        let all = std::fs::read(m.path(name)).unwrap();
        assert_eq!(all.len(), 4096 + 3 + 14, "{name}");
        assert_eq!(&all[4099..], b"unaligned tail");
    }
    // A read-only O_DIRECT open, cleared, reads unaligned too.
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.path("plain.bin"))
        .unwrap();
    clear_direct(&f);
    let mut b = [0u8; 3];
    f.read_exact_at(&mut b, 1).unwrap();
    assert_eq!(b, [3, 3, 3]);
}
