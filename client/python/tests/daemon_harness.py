"""Runs real b2bd daemons for the tests (and for bench_vs_go.py).

Each daemon gets its own temp directory (socket, shm dir, log), the TCP
transport, and peer/data ports picked here (bind port 0, close, pass the
number), so that the peer address is known before it starts.

The binary is ``$B2BD_BIN`` (a relative path is tried against the working
directory, then the repository root), else ``bin/b2bd`` at the repository root
(build it with ``make build`` or ``go build -o bin/ ./cmd/...``).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path
from typing import List, Optional, Sequence

PKG_ROOT = Path(__file__).resolve().parents[1]  # client/python
REPO_ROOT = PKG_ROOT.parents[1]

# Test the source tree's b2b, not an installed copy.
if str(PKG_ROOT) not in sys.path:
    sys.path.insert(0, str(PKG_ROOT))

import b2b  # noqa: E402


def b2bd_binary() -> str:
    """Path of the b2bd binary under test; raises if it is missing."""
    path = os.environ.get("B2BD_BIN") or str(REPO_ROOT / "bin" / "b2bd")
    if not os.path.isabs(path):
        # Relative to the working directory, else to the repository root.
        path = os.path.abspath(path) if os.path.exists(path) else str(REPO_ROOT / path)
    if not os.access(path, os.X_OK):
        raise RuntimeError(
            f"b2bd binary not found at {path}: run `make build` (or `go build -o bin/ ./cmd/...`) "
            "at the repository root, or set B2BD_BIN"
        )
    return path


# Its own generator: a test that seeds random must not make two harnesses
# pick the same ports.
_ports = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return lo if lo >= 12000 else 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's
    ephemeral range: a port from that range (what binding port 0 gives) can
    be taken by any outgoing connection before the daemon binds it."""
    lo = _ephemeral_low()
    for _ in range(200):
        port = _ports.randrange(10000, lo)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in 10000..{lo - 1} after 200 tries")


def stop_process(pid: int, timeout: float = 30.0) -> None:
    """SIGSTOPs pid and returns once every thread of it has stopped (state
    T in /proc/PID/task/TID/stat): kill returns before that, and on a loaded
    host the daemon could answer one more call."""
    os.kill(pid, signal.SIGSTOP)
    end = time.monotonic() + timeout
    while True:
        running = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    stat = f.read()
            except FileNotFoundError:
                continue  # the thread ended
            if stat[stat.rindex(b")") + 2:][:1] not in (b"T", b"t"):
                running += 1
        if not running:
            return
        if time.monotonic() > end:
            raise AssertionError(f"{running} threads of process {pid} still running {timeout} s after SIGSTOP")
        time.sleep(0.001)


class Daemon:
    """One b2bd process on a temp socket and loopback ports."""

    def __init__(self, name: str, root: Optional[str] = None, extra_args: Optional[List[str]] = None) -> None:
        self.name = name
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix=f"b2bd-{name}-"))
        self.dir = self.root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket = str(self.dir / "b2bd.sock")
        self.shm_dir = str(self.dir / "shm")
        self.log_path = self.dir / "b2bd.log"
        self.extra_args = list(extra_args or [])
        self.proc: Optional[subprocess.Popen] = None
        self.peer_port = 0
        self.data_port = 0

    @property
    def peer_address(self) -> str:
        return f"127.0.0.1:{self.peer_port}"

    def start(self, timeout: float = 20.0, attempts: int = 3) -> "Daemon":
        """Start and wait until the socket answers Status. Retries with new
        ports if the picked ones were taken meanwhile."""
        binary = b2bd_binary()
        for attempt in range(attempts):
            self.peer_port, self.data_port = free_port(), free_port()
            while self.data_port == self.peer_port:
                self.data_port = free_port()
            args = [
                binary,
                "--socket", self.socket,
                "--peer-listen", self.peer_address,
                "--data-listen", f"127.0.0.1:{self.data_port}",
                "--shm-dir", self.shm_dir,
                "--transport", "tcp",
                "--insecure",  # plaintext between daemons: loopback only
                "--node-name", self.name,
                "--log-level", "warn",
                "--shutdown-grace", "5s",
            ] + [a.replace("{dir}", str(self.dir)) for a in self.extra_args]  # {dir}: this daemon's directory
            log = open(self.log_path, "ab")
            try:
                self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            finally:
                log.close()
            if self._wait_ready(timeout):
                return self
            if attempt + 1 < attempts and "address already in use" in self.log():
                continue
            break
        raise RuntimeError(f"b2bd {self.name} did not come up; log:\n{self.log()}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if os.path.exists(self.socket):
                try:
                    with b2b.Client(self.socket, timeout=1.0) as c:
                        st = c.status()
                    if st.peer_address == self.peer_address:
                        return True
                except b2b.B2BError:
                    pass
            time.sleep(0.02)
        self.proc.kill()
        self.proc.wait()
        return False

    def client(self, **kw) -> "b2b.Client":
        return b2b.Client(self.socket, **kw)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait, return the exit code (kills it after ``timeout``)."""
        if self.proc is None:
            return 0
        p, self.proc = self.proc, None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                return -9
        return p.returncode

    def cleanup(self) -> None:
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)


class DaemonPair(unittest.TestCase):
    """Starts daemons ``da`` (source, client ``a``) and ``db`` (destination,
    client ``b``, peer address ``peer_b``) once per class and checks that
    both exit 0 on SIGTERM. A subclass may rename them (``names``) or give
    daemon a flags (``a_args``); one that sets up more calls super() first
    in setUpClass and last in tearDownClass."""

    names: Sequence[str] = ("a", "b")
    a_args: Sequence[str] = ()

    @classmethod
    def setUpClass(cls):
        cls.da = Daemon(cls.names[0], extra_args=list(cls.a_args)).start()
        try:
            cls.db = Daemon(cls.names[1]).start()
        except BaseException:
            cls.da.stop()
            cls.da.cleanup()
            raise
        cls.a = cls.da.client(timeout=30)
        cls.b = cls.db.client(timeout=30)
        cls.peer_b = cls.db.peer_address

    @classmethod
    def tearDownClass(cls):
        cls.a.close()
        cls.b.close()
        problems = []
        for d in (cls.da, cls.db):
            code = d.stop()
            if code != 0:
                problems.append(f"b2bd {d.name} exited with {code}; log:\n{d.log()}")
            d.cleanup()
        if problems:
            raise AssertionError("\n".join(problems))


class SilentPeer:
    """A mixin for a DaemonPair: ``silent_addr`` is a peer that accepts
    connections and never speaks, so a transfer to it runs until
    cancelled or its deadline. List it before DaemonPair."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.silent = socket.socket()
        cls.silent.bind(("127.0.0.1", 0))
        cls.silent.listen(16)
        cls.silent_addr = "127.0.0.1:%d" % cls.silent.getsockname()[1]

    @classmethod
    def tearDownClass(cls):
        cls.silent.close()
        super().tearDownClass()


class KVPair(DaemonPair):
    """A DaemonPair whose tests register host regions (``host``) and
    ``b2b.kv`` layouts (``layout``) that are closed after each test, the
    latest first."""

    def setUp(self):
        self.cleanup = []

    def tearDown(self):
        for c in reversed(self.cleanup):
            c.close()

    def host(self, client, size, export=None):
        r = client.register_host(size, export)
        self.cleanup.append(r)
        return r

    def layout(self, *a, **kw):
        from b2b import kv

        lay = kv.register(*a, **kw)
        self.cleanup.append(lay)
        return lay
