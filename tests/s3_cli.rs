//! `ckptfs pack -r DIR -o s3://...` and `info`/`verify`/`unpack` of
//! `s3://` URLs, against moto's server on 127.0.0.1 (`tests/s3_server.py`).

mod common;

use common::s3::S3Server;
use common::{bin, vectors_dir};
use std::process::{Command, Output};

fn run(server: &S3Server, args: &[&str], cwd: &std::path::Path) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .env("AWS_ENDPOINT_URL", server.endpoint())
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn pack_to_a_bucket_then_info_verify_unpack_from_it() {
    let server = S3Server::start();
    server.put("cli", &[]);
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for s in ["bf16_dense", "fp32_dense"] {
        std::fs::copy(
            vectors_dir().join(format!("{s}.safetensors")),
            model.join(format!("{s}.safetensors")),
        )
        .unwrap();
    }
    std::fs::write(model.join("config.json"), b"{\"a\": 1}\n").unwrap();
    let m = model.to_str().unwrap();
    ok(&run(
        &server,
        &["pack", "-r", m, "-o", "s3://cli/store"],
        dir.path(),
    ));

    let url = "s3://cli/store/bf16_dense.zstn";
    let info = ok(&run(&server, &["info", url, "--json"], dir.path()));
    assert!(info.contains("tensors") || info.contains('{'), "{info}");
    ok(&run(&server, &["verify", url], dir.path()));
    ok(&run(&server, &["unpack", url], dir.path()));
    assert_eq!(
        std::fs::read(dir.path().join("bf16_dense.safetensors")).unwrap(),
        std::fs::read(model.join("bf16_dense.safetensors")).unwrap()
    );
    let out = dir.path().join("fp32.safetensors");
    ok(&run(
        &server,
        &[
            "unpack",
            "s3://cli/store/fp32_dense.zstn",
            "-o",
            out.to_str().unwrap(),
        ],
        dir.path(),
    ));
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(model.join("fp32_dense.safetensors")).unwrap()
    );

    // Errors name the object, in one line, exit code 1.
    let o = run(
        &server,
        &["info", "s3://cli/store/missing.zstn"],
        dir.path(),
    );
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("s3://cli/store/missing.zstn") && e.contains("no such object"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
}
