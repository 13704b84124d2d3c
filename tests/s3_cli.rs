//! `ckptfs pack -r DIR -o s3://...` and `info`/`verify`/`unpack` of
//! `s3://` URLs, against moto's server on 127.0.0.1 (`tests/s3_server.py`).

use crate::common;

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

/// `ckptfs ARGS` with no AWS variable set but `extra`, and HOME at `home`.
fn run_clean_env(args: &[&str], home: &std::path::Path, extra: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    c.args(args).current_dir(home).env("HOME", home);
    for (k, _) in std::env::vars() {
        if k.starts_with("AWS_") {
            c.env_remove(k);
        }
    }
    c.envs(extra.iter().copied()).output().unwrap()
}

/// A server with `bucket/m/bf16_dense.zstn`, and an empty HOME with a
/// `.aws` directory for the shared files.
fn server_with_one_archive(bucket: &str) -> (S3Server, tempfile::TempDir) {
    let server = S3Server::start();
    server.put(
        bucket,
        &[(
            "m/bf16_dense.zstn".to_string(),
            &vectors_dir().join("bf16_dense.zstn"),
        )],
    );
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join(".aws")).unwrap();
    (server, home)
}

#[test]
fn credentials_region_and_endpoint_from_the_aws_files() {
    let (server, home) = server_with_one_archive("files");
    let aws = home.path().join(".aws");
    std::fs::write(
        aws.join("credentials"),
        "[default]\naws_access_key_id = test\naws_secret_access_key = test\n\n\
         [other]\naws_access_key_id = test\naws_secret_access_key = test\n",
    )
    .unwrap();
    let ep = server.endpoint();
    std::fs::write(
        aws.join("config"),
        format!(
            "[default]\nregion = us-east-1\nendpoint_url = {ep}\n\n\
             [profile other]\nregion = us-east-1\nendpoint_url = {ep}\n"
        ),
    )
    .unwrap();
    let url = "s3://files/m/bf16_dense.zstn";
    // Everything from ~/.aws: the default profile, then a named one.
    ok(&run_clean_env(&["verify", url], home.path(), &[]));
    ok(&run_clean_env(
        &["verify", url],
        home.path(),
        &[("AWS_PROFILE", "other")],
    ));
    // The files may live elsewhere.
    let elsewhere = tempfile::tempdir().unwrap();
    let (c, f) = (aws.join("credentials"), aws.join("config"));
    ok(&run_clean_env(
        &["verify", url],
        elsewhere.path(),
        &[
            ("AWS_SHARED_CREDENTIALS_FILE", c.to_str().unwrap()),
            ("AWS_CONFIG_FILE", f.to_str().unwrap()),
        ],
    ));
    // The environment wins over the files: a dead endpoint there fails.
    let dead = "http://127.0.0.1:9";
    let o = run_clean_env(&["info", url], home.path(), &[("AWS_ENDPOINT_URL", dead)]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "the environment's endpoint was not used"
    );
    // A profile neither file has, and a damaged file: one line naming it.
    let o = run_clean_env(&["verify", url], home.path(), &[("AWS_PROFILE", "nope")]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("\"nope\"") && e.contains("credentials"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    std::fs::write(
        aws.join("config"),
        "[default]\nregion = us-east-1\nnot a setting\n",
    )
    .unwrap();
    let o = run_clean_env(&["verify", url], home.path(), &[]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains(".aws/config:3:"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
}

#[test]
fn credentials_from_a_profiles_credential_process() {
    use std::os::unix::fs::PermissionsExt;
    let (server, home) = server_with_one_archive("proc");
    let aws = home.path().join(".aws");
    // A broker that logs its arguments and prints version-1 credentials;
    // another that prints an unknown version.
    let log = home.path().join("broker.log");
    let broker = home.path().join("broker dir");
    std::fs::create_dir(&broker).unwrap();
    for (name, version) in [("good", 1), ("newer", 2)] {
        let p = broker.join(name);
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\necho \"$@\" >> '{}'\n\
                 echo '{{\"Version\": {version}, \"AccessKeyId\": \"test\", \
                 \"SecretAccessKey\": \"test\", \"SessionToken\": \"tok\"}}'\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let ep = server.endpoint();
    let (good, newer) = (broker.join("good"), broker.join("newer"));
    std::fs::write(
        aws.join("config"),
        format!(
            "[default]\nregion = us-east-1\nendpoint_url = {ep}\n\
             credential_process = \"{}\" --role 'models reader'\n\n\
             [profile newer]\nregion = us-east-1\nendpoint_url = {ep}\n\
             credential_process = \"{}\"\n",
            good.display(),
            newer.display()
        ),
    )
    .unwrap();
    let url = "s3://proc/m/bf16_dense.zstn";
    ok(&run_clean_env(&["verify", url], home.path(), &[]));
    let ran = std::fs::read_to_string(&log).unwrap();
    assert_eq!(ran.lines().next(), Some("--role models reader"), "{ran}");
    // Output the process contract does not allow: one line, exit 1,
    // naming the profile and what is wrong.
    let o = run_clean_env(&["verify", url], home.path(), &[("AWS_PROFILE", "newer")]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("\"newer\"") && e.contains("credential_process") && e.contains("Version"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
}

/// `tests/aws_auth_server.py` (a stand-in for STS and the SSO portal),
/// killed when dropped, and the log of the requests it saw.
struct AuthServer {
    child: std::process::Child,
    endpoint: String,
    log: std::path::PathBuf,
}

impl AuthServer {
    fn start(dir: &std::path::Path) -> AuthServer {
        use std::io::BufRead;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.join("auth.log");
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/aws_auth_server.py");
        let mut child = Command::new(common::venv_python())
            .arg(script)
            .arg(port.to_string())
            .arg(&log)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        AuthServer {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A profile that assumes a role with another profile's keys: ckptfs asks
/// STS (`AssumeRole`, signed with the source profile's key) and reads the
/// bucket; a profile using IAM Identity Center reads the token `aws sso
/// login` left and asks the portal for the role's credentials; an expired
/// login is one line saying to log in again.
#[test]
fn credentials_from_an_assumed_role_and_from_sso() {
    let (server, home) = server_with_one_archive("roles");
    let auth = AuthServer::start(home.path());
    let aws = home.path().join(".aws");
    let ep = server.endpoint();
    std::fs::write(
        aws.join("credentials"),
        "[base]\naws_access_key_id = AKIABASE\naws_secret_access_key = basesecret\n",
    )
    .unwrap();
    std::fs::write(
        aws.join("config"),
        format!(
            "[profile reader]\nregion = us-east-1\nendpoint_url = {ep}\n\
             role_arn = arn:aws:iam::123456789012:role/model-reader\nsource_profile = base\n\
             external_id = fleet-7\n\n\
             [profile sso]\nregion = us-east-1\nendpoint_url = {ep}\nsso_session = corp\n\
             sso_account_id = 123456789012\nsso_role_name = ModelReader\n\n\
             [sso-session corp]\nsso_start_url = https://corp.awsapps.com/start\n\
             sso_region = us-east-1\n"
        ),
    )
    .unwrap();
    let url = "s3://roles/m/bf16_dense.zstn";
    let with = |profile: &'static str| {
        [
            ("AWS_PROFILE", profile),
            ("AWS_ENDPOINT_URL_STS", auth.endpoint.as_str()),
            ("AWS_ENDPOINT_URL_SSO", auth.endpoint.as_str()),
        ]
    };
    ok(&run_clean_env(
        &["verify", url],
        home.path(),
        &with("reader"),
    ));
    let seen = auth.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["kind"], "sts");
    assert_eq!(seen[0]["form"]["Action"], "AssumeRole");
    assert_eq!(
        seen[0]["form"]["RoleArn"],
        "arn:aws:iam::123456789012:role/model-reader"
    );
    assert_eq!(seen[0]["form"]["ExternalId"], "fleet-7");
    let signed = seen[0]["auth"].as_str().unwrap();
    assert!(
        signed.starts_with("AWS4-HMAC-SHA256 Credential=AKIABASE/")
            && signed.contains("/us-east-1/sts/aws4_request"),
        "signed with the source profile's key for STS: {signed}"
    );

    // SSO: no login yet, then a valid token, then an expired one.
    let o = run_clean_env(&["verify", url], home.path(), &with("sso"));
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("\"sso\"") && e.contains("aws sso login"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    let cache = aws.join("sso/cache");
    std::fs::create_dir_all(&cache).unwrap();
    // botocore names the file by the SHA-1 of the session name.
    let token = cache.join("ee0bfd2552fbd840c02cc48b6e823320543c450f.json");
    let token_json = |at: &str| format!(r#"{{"accessToken": "good-token", "expiresAt": "{at}"}}"#);
    std::fs::write(&token, token_json("2099-01-01T00:00:00Z")).unwrap();
    ok(&run_clean_env(&["verify", url], home.path(), &with("sso")));
    let seen = auth.requests();
    let sso = seen.last().unwrap();
    assert_eq!(sso["kind"], "sso");
    assert_eq!(sso["token"], "good-token");
    assert_eq!(sso["query"]["account_id"], "123456789012");
    assert_eq!(sso["query"]["role_name"], "ModelReader");
    std::fs::write(&token, token_json("2020-01-01T00:00:00Z")).unwrap();
    let o = run_clean_env(&["verify", url], home.path(), &with("sso"));
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("expired") && e.contains("aws sso login"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    // Expired, but refreshable (as `aws sso login` with an sso-session
    // leaves it): refreshed through OIDC, in memory, file untouched.
    let refreshable = r#"{"accessToken": "stale", "expiresAt": "2020-01-01T00:00:00Z",
        "refreshToken": "good-refresh", "clientId": "cid", "clientSecret": "cs",
        "registrationExpiresAt": "2099-01-01T00:00:00Z"}"#;
    std::fs::write(&token, refreshable).unwrap();
    let mut with_oidc = with("sso").to_vec();
    with_oidc.push(("AWS_ENDPOINT_URL_SSO_OIDC", auth.endpoint.as_str()));
    ok(&run_clean_env(&["verify", url], home.path(), &with_oidc));
    let seen = auth.requests();
    let n = seen.len();
    assert_eq!(seen[n - 2]["kind"], "oidc");
    assert_eq!(seen[n - 2]["body"]["grantType"], "refresh_token");
    assert_eq!(seen[n - 2]["body"]["clientId"], "cid");
    assert_eq!(seen[n - 1]["token"], "refreshed-token");
    assert_eq!(std::fs::read_to_string(&token).unwrap(), refreshable);
}

/// `S3Client::get_ranges` hands each response body over as it arrives,
/// chunk by chunk at its offset, tells of each part once all its bytes
/// were written, and refuses a body shorter than asked and a GET of a
/// version that is no longer there (If-Match).
#[test]
fn get_ranges_streams_each_part_to_its_offset_and_checks_it() {
    use ckptfs::store::s3::{S3Client, S3Options, S3Url};
    use std::cell::RefCell;
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = common::Rng(7);
    let obj: Vec<u8> = (0..(5 << 20) + 123).map(|_| rng.next() as u8).collect();
    let src = dir.path().join("obj");
    std::fs::write(&src, &obj).unwrap();
    server.put("ranges", &[("p/obj".to_string(), &src)]);
    let opts = S3Options {
        endpoint: Some(server.endpoint()),
        ..Default::default()
    };
    let client = S3Client::new(S3Url::parse("s3://ranges/p").unwrap().unwrap(), &opts).unwrap();
    let head = client.head("obj").unwrap();
    assert!(!head.etag.is_empty(), "moto lists an ETag");
    let size = obj.len() as u64;
    let parts = vec![0..(1 << 20), (1 << 20)..(3 << 20) + 5, (3 << 20) + 5..size];
    let got = RefCell::new(vec![0u8; obj.len()]);
    let chunks = RefCell::new(Vec::new());
    let mut done = Vec::new();
    client
        .get_ranges(
            "obj",
            &parts,
            head.version(),
            2,
            &|at, b| {
                got.borrow_mut()[at as usize..at as usize + b.len()].copy_from_slice(b);
                chunks.borrow_mut().push(at..at + b.len() as u64);
                Ok(())
            },
            &mut |r| done.push(r.clone()),
        )
        .unwrap();
    assert!(
        got.into_inner() == obj,
        "the bytes written are the object's"
    );
    done.sort_by_key(|r| r.start);
    assert_eq!(done, parts, "each part is done once");
    // Every chunk lies within one part, and the chunks of a part cover it
    // exactly once.
    let mut chunks = chunks.into_inner();
    chunks.sort_by_key(|r| r.start);
    let mut at = 0;
    for c in &chunks {
        assert_eq!(c.start, at, "chunks tile the parts: {chunks:?}");
        assert!(
            parts.iter().any(|p| p.start <= c.start && c.end <= p.end),
            "chunk {c:?} crosses a part"
        );
        at = c.end;
    }
    assert_eq!(at, size);

    // A part past the end of the object: the server sends fewer bytes.
    let mut done = Vec::new();
    let e = client
        .get_ranges(
            "obj",
            &[size - 10..size + 10],
            head.version(),
            1,
            &|_, _| Ok(()),
            &mut |r| done.push(r.clone()),
        )
        .unwrap_err();
    assert!(done.is_empty(), "a short part is not done");
    assert!(e.to_string().contains("obj bytes"), "{e}");

    // Another version of the object: the conditional GET fails.
    std::fs::write(&src, b"another version").unwrap();
    server.put("ranges", &[("p/obj".to_string(), &src)]);
    let e = client
        .get_ranges(
            "obj",
            &parts[..1],
            head.version(),
            1,
            &|_, _| Ok(()),
            &mut |_| {},
        )
        .unwrap_err();
    assert!(e.to_string().contains("changed on the server"), "{e}");

    // A version known only by its time (a listing without ETags): the
    // current one reads, and once the object is replaced (a second later,
    // as HTTP dates count), the read is refused, whether or not the
    // server honours If-Unmodified-Since.
    let now = client.head("obj").unwrap();
    let by_time = ckptfs::store::s3::Version {
        etag: "",
        mtime: now.mtime,
    };
    let read = |v| client.get_ranges("obj", &[0..4], v, 1, &|_, _| Ok(()), &mut |_| {});
    read(by_time).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(&src, b"a third version").unwrap();
    server.put("ranges", &[("p/obj".to_string(), &src)]);
    let e = read(by_time).unwrap_err();
    assert!(e.to_string().contains("changed on the server"), "{e}");
}

/// A checkpoint of 300 MiB (every real one is over 64 MiB: uploaded in
/// parts) goes into a bucket with `pack -o s3://` and comes back
/// byte-identical with `unpack`; no incomplete upload is left. (Before:
/// exit 101, "there is no reactor running", from the upload.)
#[test]
fn pack_of_a_300_mib_checkpoint_uploads_in_parts_and_unpacks_identical() {
    let server = S3Server::start();
    server.put("big", &[]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("model.safetensors");
    common::s3::write_big_safetensors(&src, 300, 41);
    let o = run(
        &server,
        &[
            "pack",
            src.to_str().unwrap(),
            "-o",
            "s3://big/ckpt/model.zstn",
        ],
        dir.path(),
    );
    ok(&o);
    let listed = server.list("big", "ckpt/");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].0, "ckpt/model.zstn");
    assert!(listed[0].1 > 64 << 20, "uploaded in parts: {listed:?}");
    assert!(server.uploads("big").is_empty(), "no upload left behind");
    let out = dir.path().join("back.safetensors");
    ok(&run(
        &server,
        &[
            "unpack",
            "s3://big/ckpt/model.zstn",
            "-o",
            out.to_str().unwrap(),
        ],
        dir.path(),
    ));
    assert!(common::s3::same_file(&src, &out), "the bytes come back");
}

/// Errors and reports about an object name its URL, never the temporary
/// copy the command works on; a failed upload is one line naming the URL
/// and leaves no incomplete upload.
#[test]
fn messages_about_objects_name_their_urls() {
    let mut server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![7u8; 5000]).unwrap();
    server.put("names", &[("m/junk.zstn".to_string(), junk.as_path())]);
    for cmd in ["info", "verify", "unpack"] {
        let o = run(&server, &[cmd, "s3://names/m/junk.zstn"], dir.path());
        assert_eq!(o.status.code(), Some(1), "{cmd}");
        // (`verify` reports on stdout, the others on stderr.)
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stderr),
            String::from_utf8_lossy(&o.stdout)
        );
        assert!(all.contains("s3://names/m/junk.zstn"), "{cmd}: {all}");
        assert!(!all.contains("ckptfs-s3-"), "{cmd}: {all}");
        assert_eq!(all.trim().lines().count(), 1, "{cmd}: {all}");
    }
    // A valid archive: what `info` and `verify` print names the URL too.
    let model = dir.path().join("bf16_dense.safetensors");
    std::fs::copy(vectors_dir().join("bf16_dense.safetensors"), &model).unwrap();
    ok(&run(
        &server,
        &[
            "pack",
            model.to_str().unwrap(),
            "-o",
            "s3://names/m/ok.zstn",
        ],
        dir.path(),
    ));
    for cmd in ["info", "verify"] {
        let o = run(&server, &[cmd, "s3://names/m/ok.zstn"], dir.path());
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        ok(&o);
        assert!(!all.contains("ckptfs-s3-"), "{cmd}: {all}");
    }
    // An upload that fails: one line naming the object's URL, exit 1, and
    // no incomplete multipart upload left on the server.
    let big = dir.path().join("big.safetensors");
    common::s3::write_big_safetensors(&big, 80, 5);
    server.fail_uploads(true);
    let o = run(
        &server,
        &["pack", big.to_str().unwrap(), "-o", "s3://names/m/big.zstn"],
        dir.path(),
    );
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    // The packing report, then the error.
    let lines: Vec<&str> = e.trim().lines().collect();
    assert_eq!(lines.len(), 2, "{e}");
    assert!(lines[0].contains("-> s3://names/m/big.zstn: "), "{e}");
    assert!(lines[1].starts_with("ckptfs: s3://names/m/big.zstn"), "{e}");
    assert!(!e.contains("ckptfs-s3-") && !e.contains("panicked"), "{e}");
    assert!(server.uploads("names").is_empty(), "the upload was aborted");
    server.fail_uploads(false);
    // Without the server at all: still the URL.
    server.stop_proxy();
    let o = run(&server, &["info", "s3://names/m/ok.zstn"], dir.path());
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(e.contains("s3://names/m/ok.zstn"), "{e}");
}
