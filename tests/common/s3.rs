//! An S3-compatible server for the S3 tests (`tests/s3_server.py`: moto's
//! server on 127.0.0.1 counting the GETs it answers, behind a TCP proxy
//! that a test stops and starts to cut the network).

use super::venv_python;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3_server.py")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn_ready(args: &[String]) -> Child {
    let mut c = Command::new(venv_python())
        .arg(script())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start tests/s3_server.py");
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "s3_server.py {args:?} did not start");
    c
}

pub struct S3Server {
    server: Child,
    pub port: u16,
    proxy: Option<Child>,
    pub proxy_port: u16,
}

impl S3Server {
    /// Starts the server and its proxy; the credentials the clients use
    /// come from the environment, set here.
    pub fn start() -> S3Server {
        std::env::set_var("AWS_ACCESS_KEY_ID", "test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
        std::env::set_var("AWS_REGION", "us-east-1");
        let port = free_port();
        let server = spawn_ready(&["server".into(), port.to_string()]);
        let mut s = S3Server {
            server,
            port,
            proxy: None,
            proxy_port: free_port(),
        };
        s.start_proxy();
        s
    }

    /// The endpoint clients use (through the proxy).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.proxy_port)
    }

    /// The server directly (for uploads and counters).
    pub fn direct(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Cuts the network: connections to the endpoint are refused, and
    /// those open are reset.
    pub fn stop_proxy(&mut self) {
        if let Some(mut p) = self.proxy.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }

    pub fn start_proxy(&mut self) {
        assert!(self.proxy.is_none());
        self.proxy = Some(spawn_ready(&[
            "proxy".into(),
            self.proxy_port.to_string(),
            self.port.to_string(),
        ]));
    }

    fn call(&self, path: &str) -> String {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(c, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        s.split_once("\r\n\r\n")
            .map(|x| x.1.to_string())
            .unwrap_or_default()
    }

    /// (object GETs, bytes they returned) since the last reset.
    pub fn gets(&self) -> (u64, u64) {
        let v: serde_json::Value = serde_json::from_str(&self.call("/__stats")).unwrap();
        (
            v["gets"].as_u64().unwrap(),
            v["get_bytes"].as_u64().unwrap(),
        )
    }

    /// Bytes object GETs returned since the last reset, by object
    /// (`/BUCKET/KEY`).
    pub fn get_bytes_by_key(&self) -> Vec<(String, u64)> {
        let v: serde_json::Value = serde_json::from_str(&self.call("/__stats")).unwrap();
        let mut keys: Vec<(String, u64)> = v["keys"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, n)| (k.clone(), n.as_u64().unwrap()))
            .collect();
        keys.sort();
        keys
    }

    pub fn reset(&self) {
        self.call("/__reset");
    }

    /// Makes the server behave as s3s-fs 0.14 does: it ignores conditional
    /// headers (If-Match, If-None-Match, If-Unmodified-Since) and lists
    /// objects without ETags.
    pub fn like_s3s_fs(&self) {
        self.call("/__mode?like_s3s_fs=1");
    }

    /// Makes the server answer 503 to every upload but the writer lock's
    /// (`fail`), or work again.
    pub fn fail_uploads(&self, fail: bool) {
        self.call(&format!("/__mode?fail_uploads={}", fail as u8));
    }

    /// Freezes the server (SIGSTOP): connections are accepted, nothing is
    /// answered, as in an outage that does not reset connections.
    pub fn pause(&self) {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.server.id() as i32, libc::SIGSTOP) };
    }

    /// Undoes [`Self::pause`].
    pub fn resume(&self) {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.server.id() as i32, libc::SIGCONT) };
    }

    /// The multipart uploads in progress in `bucket`: (key, upload id).
    pub fn uploads(&self, bucket: &str) -> Vec<(String, String)> {
        let out = Command::new(venv_python())
            .arg(script())
            .args(["uploads", &self.direct(), bucket])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "uploads: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (k, id) = l.rsplit_once(' ')?;
                Some((k.to_string(), id.to_string()))
            })
            .collect()
    }

    /// Creates `bucket` if needed and uploads each (key, file).
    pub fn put(&self, bucket: &str, objects: &[(String, &Path)]) {
        let mut cmd = Command::new(venv_python());
        cmd.arg(script()).arg("put").arg(self.direct()).arg(bucket);
        for (k, p) in objects {
            cmd.arg(format!("{k}={}", p.display()));
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Downloads object `key` of `bucket` to `dest`.
    pub fn get(&self, bucket: &str, key: &str, dest: &Path) {
        let out = Command::new(venv_python())
            .arg(script())
            .args(["get", &self.direct(), bucket])
            .arg(format!("{key}={}", dest.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "get {key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The keys under `prefix` of `bucket` and their sizes, sorted.
    pub fn list(&self, bucket: &str, prefix: &str) -> Vec<(String, u64)> {
        let out = Command::new(venv_python())
            .arg(script())
            .args(["list", &self.direct(), bucket, prefix])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "list: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut v: Vec<(String, u64)> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (k, n) = l.rsplit_once(' ')?;
                Some((k.to_string(), n.parse().ok()?))
            })
            .collect();
        v.sort();
        v
    }

    /// Uploads every regular file below `dir` under `prefix`.
    pub fn put_tree(&self, bucket: &str, prefix: &str, dir: &Path) {
        fn walk(root: &Path, d: &Path, out: &mut Vec<(String, std::path::PathBuf)>) {
            for e in std::fs::read_dir(d).unwrap() {
                let e = e.unwrap();
                let t = e.file_type().unwrap();
                if t.is_dir() {
                    walk(root, &e.path(), out);
                } else if t.is_file() {
                    let rel = e
                        .path()
                        .strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned();
                    out.push((rel, e.path()));
                }
            }
        }
        let mut files = Vec::new();
        walk(dir, dir, &mut files);
        let objs: Vec<(String, &Path)> = files
            .iter()
            .map(|(r, p)| (format!("{prefix}/{r}"), p.as_path()))
            .collect();
        self.put(bucket, &objs);
    }
}

/// Writes at `path` a safetensors file of `mib` MiB (a multiple of 8) of
/// fp32 tensors of 8 MiB each, pseudo-random values of a checkpoint's
/// magnitudes from `seed` (random mantissas: they compress little, as
/// real weights' do). Streamed: memory stays at one tensor.
pub fn write_big_safetensors(path: &Path, mib: usize, seed: u64) {
    let per = 8u64 << 20;
    let n = mib.div_ceil(8);
    let mut header = String::from("{");
    for i in 0..n as u64 {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"layers.{i}.weight\":{{\"dtype\":\"F32\",\"shape\":[{},1024],\"data_offsets\":[{},{}]}}",
            per / 4096,
            i * per,
            (i + 1) * per
        ));
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    w.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    w.write_all(header.as_bytes()).unwrap();
    let mut rng = super::Rng(seed);
    let mut b = Vec::with_capacity(per as usize);
    for _ in 0..n {
        b.clear();
        for _ in 0..per / 8 {
            let r = rng.next();
            for half in [r as u32, (r >> 32) as u32] {
                // Sign, an exponent in 2^-8..2^-1, a random mantissa.
                let bits =
                    (half & 0x8000_0000) | ((119 + (half >> 23) % 8) << 23) | (half & 0x7f_ffff);
                b.extend_from_slice(&bits.to_le_bytes());
            }
        }
        w.write_all(&b).unwrap();
    }
    w.flush().unwrap();
}

/// Whether files `a` and `b` hold the same bytes (read in pieces).
pub fn same_file(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    if fa.metadata().unwrap().len() != fb.metadata().unwrap().len() {
        return false;
    }
    let (mut x, mut y) = (vec![0u8; 4 << 20], vec![0u8; 4 << 20]);
    loop {
        let n = read_full(&mut fa, &mut x);
        let m = read_full(&mut fb, &mut y);
        if n != m || x[..n] != y[..m] {
            return false;
        }
        if n == 0 {
            return true;
        }
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop_proxy();
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}
