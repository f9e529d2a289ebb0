"""A real airlock for the client's tests: the binary built from this repository (or
$AIRLOCK_BIN), started by clients/testdata/serve.sh (the start-a-server helper the
TypeScript tests share) with clients/testdata/policy.yaml. Nothing of airlock is stubbed.

Backends: SQLite always; PostgreSQL when AIRLOCK_TEST_DATABASE_URL is set (by
scripts/with-postgres.sh), each server on a fresh schema of that database. Under CI=true a
missing PostgreSQL fails the tests instead of skipping them.
"""

import http.cookiejar
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.parse
import urllib.request
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
PYROOT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PYROOT))
if PYROOT not in sys.path:
    sys.path.insert(0, PYROOT)

TESTDATA = os.path.join(REPO, "clients", "testdata")
POLICY = os.path.join(TESTDATA, "policy.yaml")  # the client tests' one policy file

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


class Server:
    """One `airlock serve` (clients/testdata/serve.sh) with its keys and an approver account."""

    def __init__(self, backend: str = "sqlite", policy: str = POLICY):
        self.backend = backend
        env = dict(os.environ, AIRLOCK_BIN=binary())
        self.proc = subprocess.Popen([os.path.join(TESTDATA, "serve.sh"), backend, policy], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise RuntimeError("airlock did not start (serve.sh's reason is on stderr)")
        info = json.loads(line)
        self.url: str = info["url"]
        self.dir: str = info["dir"]
        self.keys: Dict[str, str] = info["keys"]

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
        """Stop the server: serve.sh stops airlock and removes its database when its stdin closes."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                self.proc.wait()
        self.proc.stdout.close()


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
