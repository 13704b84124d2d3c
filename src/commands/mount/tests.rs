use super::*;

#[test]
fn dev_fuse_errors_name_the_device_and_what_to_do() {
    let denied = dev_fuse_error(&std::io::Error::from_raw_os_error(libc::EACCES));
    assert!(
        denied.starts_with("cannot open /dev/fuse (Permission denied"),
        "{denied}"
    );
    assert!(denied.contains("chmod 0666 /dev/fuse"), "{denied}");
    let missing = dev_fuse_error(&std::io::Error::from_raw_os_error(libc::ENOENT));
    assert!(missing.contains("modprobe fuse"), "{missing}");
}

#[test]
fn sizes() {
    assert_eq!(parse_size("2G").unwrap(), 2 << 30);
    assert_eq!(parse_size("512M").unwrap(), 512 << 20);
    assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
    assert_eq!(parse_size("4096").unwrap(), 4096);
    assert!(parse_size("lots").is_err());
    assert!(parse_size("3X").is_err());
}
