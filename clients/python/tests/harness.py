"""A real airlock for the client's tests: the binary built from this repository (or
$AIRLOCK_BIN), migrated on a fresh database and served on a free port. Nothing of airlock
is stubbed.

Backends: SQLite always; PostgreSQL when AIRLOCK_TEST_DATABASE_URL is set (by
scripts/with-postgres.sh), each server on a fresh schema of that database (created with
psql). Under CI=true a missing PostgreSQL fails the tests instead of skipping them.
"""

import http.cookiejar
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
PYROOT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PYROOT))
if PYROOT not in sys.path:
    sys.path.insert(0, PYROOT)

POLICY = """
actions:
  create_doc:
    connector: worker
    gate: none
  crm_note:
    connector: worker
    gate: none
  fx_note:
    connector: worker
    gate: none
  share_doc:
    connector: worker
    gate: approve_before_act
    approvers: {roles: [support-lead]}
  post_update:
    connector: worker
    gate: approve_before_act
    approvers: {roles: [support-lead]}
    approval: {on_reject: skip_effect}
  legal_share:
    connector: worker
    gate: approve_before_act
    approvers: {roles: [legal]}
  digest:
    connector: worker
    gate: act_with_window
    reversible: true
    window: 1h
    approvers: {roles: [support-lead]}
  ticket_reply:
    connector: worker
    gate: none
    schema:
      type: object
      required: [label, text]
      additionalProperties: false
      properties:
        label: {enum: [refund, shipping, other]}
        text: {type: string, maxLength: 2000}
validation: {max_repairs: 2}
retry:
  server_error: {retry: business, max_attempts: 3, backoff: 1s, max_backoff: 2s}
"""

APPROVER = ("lead", "correct horse battery staple")

_binary: Optional[str] = None
_bindir: Optional[str] = None


def binary() -> str:
    """airlock's binary: $AIRLOCK_BIN, or built once per test process."""
    global _binary, _bindir
    if _binary:
        return _binary
    if os.environ.get("AIRLOCK_BIN"):
        _binary = os.environ["AIRLOCK_BIN"]
        return _binary
    _bindir = tempfile.mkdtemp(prefix="airlock-py-bin-")
    out = os.path.join(_bindir, "airlock")
    env = dict(os.environ, GOTOOLCHAIN="local")
    subprocess.run(["go", "build", "-o", out, "./cmd/airlock"], cwd=REPO, env=env, check=True)
    _binary = out
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backends() -> List[str]:
    """The backends to test: sqlite, and postgres when a test database is given."""
    out = ["sqlite"]
    if os.environ.get("AIRLOCK_TEST_DATABASE_URL"):
        out.append("postgres")
    elif os.environ.get("CI") == "true":
        raise RuntimeError("AIRLOCK_TEST_DATABASE_URL is not set: under CI the PostgreSQL tests must run "
                           "(use scripts/test-clients.sh, which runs them inside scripts/with-postgres.sh)")
    return out


def postgres_schema() -> str:
    """A fresh schema on the test database, and the URL that uses it."""
    url = os.environ["AIRLOCK_TEST_DATABASE_URL"]
    schema = "py_" + secrets.token_hex(6)
    subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", url, "-c", f"CREATE SCHEMA {schema}"], check=True,
                   stdout=subprocess.DEVNULL)
    sep = "&" if "?" in url else "?"
    return url + sep + "search_path=" + schema, schema


class Server:
    """One `airlock serve` with its keys and an approver account."""

    def __init__(self, backend: str = "sqlite", policy: str = POLICY, extra_env: Optional[Dict[str, str]] = None):
        self.backend = backend
        self.dir = tempfile.mkdtemp(prefix="airlock-py-")
        self.schema = ""
        if backend == "postgres":
            db, self.schema = postgres_schema()
        else:
            db = os.path.join(self.dir, "airlock.db")
        with open(os.path.join(self.dir, "airlock.yaml"), "w") as f:
            f.write(policy)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AIRLOCK_")}
        self.env.update({"AIRLOCK_DATABASE_URL": db, "AIRLOCK_CONFIG": os.path.join(self.dir, "airlock.yaml"),
                         "AIRLOCK_LOG_LEVEL": "error"})
        self.env.update(extra_env or {})
        self.run("migrate")
        self.keys = {s: self.run("apikey", "create", "--name", "py-" + s, "--scope", s)
                     for s in ("runs", "worker", "operator", "admin")}
        self.run("user", "add", APPROVER[0], "--role", "support-lead", env={"AIRLOCK_USER_PASSWORD": APPROVER[1]})
        self.proc: Optional[subprocess.Popen] = None
        for _ in range(5):
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            self.log = open(os.path.join(self.dir, "serve.log"), "wb")
            self.proc = subprocess.Popen([binary(), "serve"], env=dict(self.env, AIRLOCK_LISTEN=f"127.0.0.1:{port}"),
                                         stdout=self.log, stderr=subprocess.STDOUT)
            if self._ready():
                return
            self.proc.kill()
            self.proc.wait()
        self.close()
        raise RuntimeError("airlock did not start: " + self.logs())

    def _ready(self) -> bool:
        for _ in range(400):
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                    if r.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def run(self, *args: str, env: Optional[Dict[str, str]] = None) -> str:
        p = subprocess.run([binary(), *args], env=dict(self.env, **(env or {})), capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"airlock {' '.join(args)}: {p.stderr}")
        return p.stdout.strip()

    def logs(self) -> str:
        try:
            with open(os.path.join(self.dir, "serve.log"), errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def approve(self, approve_url: str, decision: str = "approve", reason: str = "") -> int:
        """Decide on the approval page as a signed-in person would: sign in, then post
        the form with the page's Origin (airlock refuses cross-site posts)."""
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        headers = {"Origin": self.url, "Content-Type": "application/x-www-form-urlencoded"}
        login = urllib.parse.urlencode({"username": APPROVER[0], "password": APPROVER[1]}).encode()
        opener.open(urllib.request.Request(self.url + "/login", data=login, headers=headers), timeout=10).close()
        # The link's origin is the server's public URL, which is this server's.
        fields = {"decision": decision}
        if reason:
            fields["reason"] = reason
        form = urllib.parse.urlencode(fields).encode()
        with opener.open(urllib.request.Request(approve_url, data=form, headers=headers), timeout=10) as r:
            return r.status

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()
        if self.schema:
            subprocess.run(["psql", "-q", os.environ["AIRLOCK_TEST_DATABASE_URL"], "-c",
                            f"DROP SCHEMA {self.schema} CASCADE"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


class ServerTestCase(unittest.TestCase):
    """One server per test class and backend; subclasses set ``backend``."""

    backend = "sqlite"
    policy = POLICY
    server: Server

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server(cls.backend, policy=cls.policy)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.close()


def per_backend(base: type, module_globals: dict) -> None:
    """Define one concrete TestCase per backend from an abstract one (``base`` is not
    collected: it has no test_ methods of its own, its mixin does)."""
    for b in backends():
        name = base.__name__.replace("Base", "") + b.capitalize()
        module_globals[name] = type(name, (base, ServerTestCase), {"backend": b})
