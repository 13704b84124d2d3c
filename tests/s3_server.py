"""An S3-compatible server for the tests: moto's server on 127.0.0.1, with
a middleware that counts what it serves, and an optional TCP proxy in front
of it that the tests stop and start to cut the network.

    python s3_server.py server PORT      # moto; GET /__stats, POST /__reset
    python s3_server.py proxy PORT UPSTREAM_PORT
    python s3_server.py put ENDPOINT BUCKET [KEY=PATH ...]   # (boto3)
    python s3_server.py get ENDPOINT BUCKET [KEY=PATH ...]   # (boto3)
    python s3_server.py list ENDPOINT BUCKET PREFIX   # one "KEY SIZE" a line
    python s3_server.py uploads ENDPOINT BUCKET   # multipart uploads in progress: "KEY ID"

/__stats answers {"gets": n, "get_bytes": n, "ranges": ["bytes=a-b", ...],
"keys": {key: bytes}, "log": [[start, seconds, bytes], ...]} for the object
GETs since the last /__reset (start and seconds: when each began, on the
server's monotonic clock, and how long it took to answer). GET
/__mode?like_s3s_fs=1 makes it behave as s3s-fs 0.14 does: conditional
headers ignored, listings without ETags (`like_s3s_fs=0` undoes it).
GET /__mode?fail_uploads=1 answers 503 to every upload (PUT of an object or
a part, completion of a multipart upload) but the writer lock's, while the
creation and abort of a multipart upload still work (`fail_uploads=0`
undoes it).
"""

import json
import socket
import sys
import threading
import time

def serve(port):
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()
    stats = {"gets": 0, "get_bytes": 0, "ranges": [], "keys": {}, "log": []}
    # /__mode?like_s3s_fs=1: behave as s3s-fs 0.14 does, ignoring
    # conditional headers and listing objects without ETags.
    mode = {"like_s3s_fs": False, "fail_uploads": False}
    conditions = ("HTTP_IF_MATCH", "HTTP_IF_NONE_MATCH", "HTTP_IF_UNMODIFIED_SINCE")

    def counting(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/__stats":
            with lock:
                body = json.dumps(stats).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        if path == "/__reset":
            with lock:
                stats.update(gets=0, get_bytes=0, ranges=[], keys={}, log=[])
            start_response("200 OK", [("Content-Length", "0")])
            return [b""]
        if path == "/__mode":
            q = environ.get("QUERY_STRING", "")
            if "like_s3s_fs" in q:
                mode["like_s3s_fs"] = "like_s3s_fs=1" in q
            if "fail_uploads" in q:
                mode["fail_uploads"] = "fail_uploads=1" in q
            start_response("200 OK", [("Content-Length", "0")])
            return [b""]
        method = environ["REQUEST_METHOD"]
        query = environ.get("QUERY_STRING", "")
        if mode["fail_uploads"] and not path.endswith(".ckptfs-writer.lock") and (
            method == "PUT" or (method == "POST" and "uploadId" in query)
        ):
            length = int(environ.get("CONTENT_LENGTH") or 0)
            stream = environ["wsgi.input"]
            while length > 0:
                got = stream.read(min(length, 1 << 20))
                if not got:
                    break
                length -= len(got)
            body = b"<Error><Code>SlowDown</Code><Message>failing uploads</Message></Error>"
            start_response("503 Service Unavailable", [("Content-Length", str(len(body)))])
            return [body]
        if mode["like_s3s_fs"]:
            for h in conditions:
                environ.pop(h, None)
            if environ["REQUEST_METHOD"] == "GET" and "list-type" in environ.get("QUERY_STRING", ""):
                return without_etags(environ, start_response)
        is_get = environ["REQUEST_METHOD"] == "GET" and environ.get("QUERY_STRING", "") == ""
        t0 = time.monotonic()
        result = app(environ, start_response)
        if not is_get:
            return result
        body = b"".join(result)
        took = time.monotonic() - t0
        with lock:
            stats["log"].append([t0, took, len(body)])
            stats["gets"] += 1
            stats["get_bytes"] += len(body)
            stats["ranges"].append(environ.get("HTTP_RANGE", ""))
            stats["keys"][path] = stats["keys"].get(path, 0) + len(body)
        return [body]

    def without_etags(environ, start_response):
        import re
        got = {}

        def keep(status, headers, exc_info=None):
            got["status"], got["headers"] = status, headers

        body = b"".join(app(environ, keep))
        body = re.sub(rb"<ETag>[^<]*</ETag>", b"", body)
        headers = [(k, v) for k, v in got["headers"] if k.lower() != "content-length"]
        start_response(got["status"], headers + [("Content-Length", str(len(body)))])
        return [body]

    srv = make_server("127.0.0.1", port, counting, threaded=True)
    print("ready", flush=True)
    srv.serve_forever()


def proxy(port, upstream):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(64)
    print("ready", flush=True)

    def pipe(a, b):
        try:
            while True:
                d = a.recv(1 << 16)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    while True:
        c, _ = ls.accept()
        u = socket.create_connection(("127.0.0.1", upstream))
        threading.Thread(target=pipe, args=(c, u), daemon=True).start()
        threading.Thread(target=pipe, args=(u, c), daemon=True).start()


def put(endpoint, bucket, pairs):
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="test", aws_secret_access_key="test")
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    for p in pairs:
        key, path = p.split("=", 1)
        s3.upload_file(path, bucket, key)


def client(endpoint):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


def get(endpoint, bucket, pairs):
    s3 = client(endpoint)
    for p in pairs:
        key, path = p.split("=", 1)
        s3.download_file(bucket, key, path)


def list_keys(endpoint, bucket, prefix):
    s3 = client(endpoint)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            print(o["Key"], o["Size"])


def uploads(endpoint, bucket):
    s3 = client(endpoint)
    for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        print(u["Key"], u["UploadId"])


if __name__ == "__main__":
    if sys.argv[1] == "put":
        put(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1] == "get":
        get(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1] == "uploads":
        uploads(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "list":
        list_keys(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "server":
        serve(int(sys.argv[2]))
    else:
        proxy(int(sys.argv[2]), int(sys.argv[3]))
