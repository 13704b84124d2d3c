//! The daemon's log: env_logger's filters, written to stderr (the log
//! file, in the background) or to the system log, without fuser's noise
//! about replies to requests the kernel no longer has.

/// `--log-file syslog`: the daemon logs to the system log (journald
/// reads it), as a mount from /etc/fstab does by default.
pub(in crate::commands) const SYSLOG: &str = "syslog";

/// The daemon's logger: stderr (the log file in the background), or the
/// system log; a second call does nothing.
pub(in crate::commands) fn init_logger(level: Option<String>, syslog: bool) {
    // fuser logs a warning when the session, ended by an unmount, tries to
    // unmount again on exit (EINVAL): noise on every umount.
    let mut b = env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("info,fuser::session=error"),
    );
    if let Some(l) = level {
        b.parse_filters(&l);
    }
    let inner = b.build();
    let max = inner.filter();
    if syslog {
        // SAFETY: the identity is a static NUL-terminated string, which
        // openlog keeps a pointer to.
        unsafe { libc::openlog(c"ckptfs".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
    }
    if log::set_boxed_logger(Box::new(QuietGoneRequests { inner, syslog })).is_ok() {
        log::set_max_level(max);
    }
}

/// The daemon's logger: env_logger, without fuser's error for a reply to a
/// request the kernel no longer has (ENOENT from /dev/fuse: the request was
/// interrupted, or the connection ended during an unmount). Nothing was
/// lost: whoever asked is gone. Every other reply failure is still logged.
struct QuietGoneRequests {
    inner: env_logger::Logger,
    /// To the system log (env_logger still filters).
    syslog: bool,
}

impl log::Log for QuietGoneRequests {
    fn enabled(&self, m: &log::Metadata) -> bool {
        self.inner.enabled(m)
    }
    fn log(&self, r: &log::Record) {
        let gone = r.target() == "fuser::reply"
            && r.args().to_string().contains("No such file or directory");
        if gone || !self.inner.matches(r) {
            return;
        }
        if !self.syslog {
            self.inner.log(r);
            return;
        }
        let prio = match r.level() {
            log::Level::Error => libc::LOG_ERR,
            log::Level::Warn => libc::LOG_WARNING,
            log::Level::Info => libc::LOG_INFO,
            log::Level::Debug | log::Level::Trace => libc::LOG_DEBUG,
        };
        // One line per record: a NUL (never in a message worth keeping)
        // would end it early, so it is dropped.
        let line = format!("{}: {}", r.target(), r.args()).replace('\0', "");
        if let Ok(c) = std::ffi::CString::new(line) {
            // SAFETY: a constant format and one NUL-terminated argument.
            unsafe { libc::syslog(prio, c"%s".as_ptr(), c.as_ptr()) };
        }
    }
    fn flush(&self) {
        self.inner.flush();
    }
}
