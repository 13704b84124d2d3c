//! The Prometheus endpoint of a mount (`ckptfs mount --metrics-addr
//! ADDR`): `GET /metrics` on ADDR answers the daemon's counters
//! (`fs::stats::Snapshot`, the same ones `ckptfs stats` prints) in
//! Prometheus's text format, encoded by `prometheus-client`: counters as
//! `ckptfs_NAME_total`, levels as `ckptfs_NAME`, errors as
//! `ckptfs_errors_total{errno="ENOENT"}`.
//!
//! Off unless asked for, and only the address given is listened on (bind
//! 127.0.0.1 to keep it on the machine). The server is one thread that
//! answers one connection at a time: a scrape every few seconds needs no
//! more, and a client that stalls is cut off after 5 s. The HTTP it
//! speaks is the part a scraper uses (a request line, headers read and
//! ignored, one response, the connection closed), so no HTTP crate.

use crate::stats::Snapshot;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// Where the counters come from at each scrape.
pub type Source = Arc<dyn Fn() -> Snapshot + Send + Sync>;

/// Listens on `addr` and serves scrapes on a thread of its own until the
/// process exits. Fails (before anything is served) when `addr` cannot be
/// bound.
pub fn serve(addr: SocketAddr, source: Source) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("ckptfs-metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(c) => {
                        if let Err(e) = answer(c, &source) {
                            log::debug!("metrics: {e}");
                        }
                    }
                    Err(e) => log::debug!("metrics: accept: {e}"),
                }
            }
        })?;
    Ok(bound)
}

fn answer(conn: TcpStream, source: &Source) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    // A request line and headers of at most 16 KiB.
    let mut r = BufReader::new(std::io::Read::take(&conn, 16 << 10));
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    let path = target.split('?').next().unwrap_or("");
    let (status, kind, body) = match (method, path) {
        ("GET", "/metrics") | ("HEAD", "/metrics") => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            render(&source()),
        ),
        ("GET", _) | ("HEAD", _) => ("404 Not Found", "text/plain", "try /metrics\n".into()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_string(),
        ),
    };
    let mut w = &conn;
    write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if method != "HEAD" {
        w.write_all(body.as_bytes())?;
    }
    w.flush()
}

/// The snapshot in Prometheus's (OpenMetrics) text format.
pub fn render(s: &Snapshot) -> String {
    let mut reg = Registry::with_prefix("ckptfs");
    reg.register_collector(Box::new(Counters(s.clone())));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    out
}

#[derive(Debug)]
struct Counters(Snapshot);

impl Collector for Counters {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for m in &self.0.metrics {
            if m.counter && m.nanos {
                let c = ConstCounter::new(m.as_f64());
                c.encode(enc.encode_descriptor(m.name, m.help, None, c.metric_type())?)?;
            } else if m.counter {
                let c = ConstCounter::new(m.value);
                c.encode(enc.encode_descriptor(m.name, m.help, None, c.metric_type())?)?;
            } else {
                let g = ConstGauge::new(m.value as i64);
                g.encode(enc.encode_descriptor(m.name, m.help, None, g.metric_type())?)?;
            }
        }
        let kind = ConstCounter::new(0u64).metric_type();
        let mut family = enc.encode_descriptor(
            "errors",
            "Errors answered to the kernel, by errno",
            None,
            kind,
        )?;
        for (name, n) in &self.0.errors {
            let labels = [("errno", name.as_str())];
            ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Metric;
    use std::io::Read;

    fn snapshot() -> Snapshot {
        Snapshot {
            metrics: vec![
                Metric::counter("bytes_served", "Bytes served", 1234),
                Metric::seconds("decode_seconds", "Decoding", 1_500_000_000),
                Metric::gauge("cache_bytes", "Cached", 77),
            ],
            errors: vec![("ENOENT".into(), 3), ("EIO".into(), 1)],
        }
    }

    #[test]
    fn counters_render_in_prometheus_text_format() {
        let t = render(&snapshot());
        for want in [
            "# TYPE ckptfs_bytes_served counter\n",
            "ckptfs_bytes_served_total 1234\n",
            "ckptfs_decode_seconds_total 1.5\n",
            "# TYPE ckptfs_cache_bytes gauge\n",
            "ckptfs_cache_bytes 77\n",
            "ckptfs_errors_total{errno=\"ENOENT\"} 3\n",
            "ckptfs_errors_total{errno=\"EIO\"} 1\n",
            "# EOF\n",
        ] {
            assert!(t.contains(want), "{want:?} not in:\n{t}");
        }
    }

    fn get(addr: SocketAddr, req: &str) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn the_endpoint_answers_scrapes_over_loopback_and_nothing_else() {
        let addr = serve("127.0.0.1:0".parse().unwrap(), Arc::new(snapshot)).unwrap();
        let r = get(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n",
        );
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(
            r.contains("\r\n\r\n# HELP ckptfs_bytes_served Bytes served"),
            "{r}"
        );
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert!(get(addr, "GET / HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(get(addr, "POST /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 405 "));
        // A client that sends nothing does not stop the next one.
        let _idle = TcpStream::connect(addr).unwrap();
        let r = get(addr, "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(r.contains("ckptfs_cache_bytes 77"), "{r}");
    }
}
