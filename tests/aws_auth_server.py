#!/usr/bin/env python3
"""A stand-in for AWS STS (AssumeRole) and the IAM Identity Center portal
(GetRoleCredentials) and its OIDC service (CreateToken with a refresh
token) for the credential tests: it answers as they do and
appends each request it sees to LOG as one JSON line (what was asked, and
the Authorization or bearer header), so a test can check what ckptfs sent.

Usage: aws_auth_server.py PORT LOG   (prints "ready" once listening)
The SSO portal accepts the bearer tokens "good-token" and "refreshed-token";
POST /token turns the refresh token "good-refresh" into "refreshed-token".
"""
import datetime, json, sys, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, LOG = int(sys.argv[1]), sys.argv[2]


def record(**kw):
    with open(LOG, "a") as f:
        f.write(json.dumps(kw) + "\n")


def later(hours=1):
    return datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=hours)


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def answer(self, status, body, ctype):
        b = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(n).decode()
        if self.path == "/token":
            body = json.loads(raw)
            record(kind="oidc", body=body)
            if body.get("grantType") != "refresh_token" or body.get("refreshToken") != "good-refresh":
                return self.answer(400, json.dumps({"error": "invalid_grant"}), "application/json")
            return self.answer(200, json.dumps({"accessToken": "refreshed-token", "expiresIn": 3600,
                                                "tokenType": "Bearer"}), "application/json")
        form = urllib.parse.parse_qs(raw)
        one = {k: v[0] for k, v in form.items()}
        record(kind="sts", form=one, auth=self.headers.get("Authorization", ""))
        if one.get("Action") != "AssumeRole":
            return self.answer(400, "<ErrorResponse><Error><Code>InvalidAction</Code>"
                               "<Message>no</Message></Error></ErrorResponse>", "text/xml")
        exp = later().strftime("%Y-%m-%dT%H:%M:%SZ")
        self.answer(200, f"""<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
<AssumeRoleResult><AssumedRoleUser><Arn>{one.get("RoleArn")}/s</Arn><AssumedRoleId>X:s</AssumedRoleId></AssumedRoleUser>
<Credentials><AccessKeyId>ASIAROLE</AccessKeyId><SecretAccessKey>rolesecret</SecretAccessKey>
<SessionToken>roletoken</SessionToken><Expiration>{exp}</Expiration></Credentials>
</AssumeRoleResult><ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></AssumeRoleResponse>""",
                    "text/xml")

    def do_GET(self):
        u = urllib.parse.urlparse(self.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(u.query).items()}
        token = self.headers.get("x-amz-sso_bearer_token", "")
        record(kind="sso", path=u.path, query=q, token=token)
        if u.path != "/federation/credentials":
            return self.answer(404, "{}", "application/json")
        if token not in ("good-token", "refreshed-token"):
            return self.answer(401, json.dumps({"message": "Session token not found or invalid"}),
                               "application/json")
        ms = int(later().timestamp() * 1000)
        self.answer(200, json.dumps({"roleCredentials": {
            "accessKeyId": "ASIASSO", "secretAccessKey": "ssosecret",
            "sessionToken": "ssotoken", "expiration": ms}}), "application/json")


srv = ThreadingHTTPServer(("127.0.0.1", PORT), H)
print("ready", flush=True)
srv.serve_forever()
