"""Fixtures of the Python package's tests: the CLI binary (built by
scripts/test.sh before pytest runs), the z4ai vectors, an S3 server."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _cli():
    env = os.environ.get("CKPTFS_BIN")
    if env:
        return env
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    for p in (target / "debug" / "ckptfs", target / "release" / "ckptfs"):
        if p.exists():
            return str(p)
    found = shutil.which("ckptfs")
    if found:
        return found
    pytest.exit("no ckptfs binary: build it (cargo build) or set CKPTFS_BIN", 2)


@pytest.fixture(scope="session")
def cli():
    path = _cli()

    def run(*args, check=True):
        r = subprocess.run([path, "-q", *map(str, args)], capture_output=True, text=True)
        if check and r.returncode != 0:
            raise AssertionError(f"ckptfs {' '.join(map(str, args))}: {r.stderr}")
        return r

    return run


@pytest.fixture(scope="session")
def vectors():
    shared = REPO.parent / "shared" / "vectors"
    return shared if shared.is_dir() else REPO / "tests" / "vectors"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """moto's server (tests/s3_server.py) with a bucket `ckpt`; yields the
    endpoint. The AWS variables are set for the process (the native client
    reads them)."""
    import moto  # noqa: F401  (the test S3 server: tests/s3_server.py)
    port = _free_port()
    log = open(tmp_path_factory.mktemp("s3") / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "s3_server.py"), "server", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in
             ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL")}
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
                      AWS_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="ckpt")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
