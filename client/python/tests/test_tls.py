"""The Python client over a daemon's --api-listen off loopback: mutual TLS,
against a real daemon with certificates from deploy/scripts/certs.sh."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import daemon_harness

import numpy as np

import b2b

REPO = daemon_harness.REPO_ROOT


class TLSArguments(unittest.TestCase):
    """Refusals that need no daemon: each names the problem and the fix."""

    def test_refusals(self):
        cases = [
            # (address, kwargs, words the message must carry)
            ("10.1.2.3:7472", {}, ["not loopback", "tls_ca", "tls_cert", "tls_key"]),
            ("[2001:db8::1]:7472", {}, ["not loopback"]),
            ("127.0.0.1:7472", {"tls_ca": "/x/ca.pem"}, ["tls_cert", "tls_key", "missing"]),
            ("127.0.0.1:7472", {"tls_server_name": "hostB"}, ["tls_server_name", "without"]),
            ("/run/b2bd/b2bd.sock", {"tls_ca": "a", "tls_cert": "b", "tls_key": "c"}, ["Unix socket"]),
            ("127.0.0.1:7472", {"tls_ca": "/nonexistent/ca.pem", "tls_cert": "/nonexistent/c.pem", "tls_key": "/nonexistent/k.pem"}, ["tls_ca", "/nonexistent/ca.pem"]),
        ]
        for address, kw, words in cases:
            with self.subTest(address=address, kw=kw):
                with self.assertRaises(b2b.InvalidArgumentError) as cm:
                    b2b.Client(address, **kw)
                for w in words:
                    self.assertIn(w, str(cm.exception))

    def test_plaintext_allowed(self):
        for address in ["/run/b2bd/b2bd.sock", "unix:///run/b2bd/b2bd.sock", "127.0.0.1:7472", "localhost:7472", "[::1]:7472"]:
            with self.subTest(address=address):
                b2b.Client(address).close()  # lazy channel: constructing it connects nothing


class TLSDaemon(unittest.TestCase):
    """A daemon with mutual TLS and --api-listen on every address (so off
    loopback, hence TLS only), reached at 127.0.0.1."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="b2bd-tls-")
        certs = os.path.join(cls.dir, "certs")
        subprocess.run([str(REPO / "deploy/scripts/certs.sh"), certs, "daemon", "app", "other"],
                       check=True, capture_output=True)
        # A second CA: its certificates must be refused.
        subprocess.run([str(REPO / "deploy/scripts/certs.sh"), os.path.join(cls.dir, "rogue"), "rogue"],
                       check=True, capture_output=True)
        cls.certs = certs
        cls.rogue = os.path.join(cls.dir, "rogue")
        cls.api_port = daemon_harness.free_port()
        cls.socket = os.path.join(cls.dir, "b2bd.sock")
        cls.log_path = os.path.join(cls.dir, "b2bd.log")
        args = [
            daemon_harness.b2bd_binary(),
            "--socket", cls.socket,
            "--shm-dir", os.path.join(cls.dir, "shm"),
            "--peer-listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
            "--api-listen", f"0.0.0.0:{cls.api_port}",
            "--tls-cert", f"{certs}/daemon.pem", "--tls-key", f"{certs}/daemon-key.pem", "--tls-ca", f"{certs}/ca.pem",
            "--transport", "tcp", "--log-level", "warn", "--node-name", "tls",
        ]
        with open(cls.log_path, "ab") as log:
            cls.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and cls.proc.poll() is None:
            if os.path.exists(cls.socket):
                try:
                    with b2b.Client(cls.socket, timeout=1) as c:
                        c.status()
                    return
                except b2b.B2BError:
                    pass
            time.sleep(0.02)
        cls.tearDownClass()
        raise RuntimeError("b2bd with TLS did not come up; log:\n" + open(cls.log_path).read())

    @classmethod
    def tearDownClass(cls):
        if cls.proc.poll() is None:
            cls.proc.send_signal(signal.SIGTERM)
            try:
                cls.proc.wait(20)
            except subprocess.TimeoutExpired:
                cls.proc.kill()
                cls.proc.wait()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def tls(self, name="app", ca=None, **kw):
        return b2b.Client(
            f"127.0.0.1:{self.api_port}", timeout=10,
            tls_ca=ca or f"{self.certs}/ca.pem", tls_cert=f"{self.certs}/{name}.pem", tls_key=f"{self.certs}/{name}-key.pem", **kw,
        )

    def test_register_and_checksum_over_mutual_tls(self):
        offsets = np.arange(16, dtype=np.uint64) * 4096
        with self.tls() as c, b2b.Client(self.socket) as root:
            self.assertEqual(c.status().node_name, "tls")
            # Registered over TLS (this test shares the daemon's host, so the
            # region's file maps here too): the daemon hashes what we wrote.
            with c.register_host(1 << 16) as reg:
                reg.array[:] = np.arange(1 << 16, dtype=np.uint64).astype(np.uint8)
                over_tls = c.checksum(reg, offsets, block_size=4096, per_block=True)
                on_socket = root.checksum(reg.id, offsets, block_size=4096, per_block=True)
                self.assertEqual(over_tls.blocks, 16)
                np.testing.assert_array_equal(over_tls.block_digests, on_socket.block_digests)
                # The region belongs to the certificate "app": "other" may not act on it.
                with self.tls("other") as other:
                    with self.assertRaises(b2b.PermissionDeniedError) as cm:
                        other.checksum(reg.id, offsets, block_size=4096)
                    self.assertIn(reg.id, str(cm.exception))

    def test_server_name_override(self):
        # The daemon's certificate names "daemon", localhost and 127.0.0.1;
        # the override must be what is checked: a wrong name is refused.
        with self.tls(tls_server_name="daemon") as c:
            self.assertEqual(c.status().node_name, "tls")
        with self.tls(tls_server_name="not-the-daemon") as c:
            with self.assertRaises(b2b.UnavailableError):
                c.status()

    def test_refused_without_the_right_certificates(self):
        # Plaintext to the TLS listener.
        with b2b.Client(f"127.0.0.1:{self.api_port}", timeout=5) as plain:
            with self.assertRaises(b2b.UnavailableError):
                plain.status()
        # A client certificate from another CA: the daemon refuses it.
        with b2b.Client(f"127.0.0.1:{self.api_port}", timeout=5, tls_ca=f"{self.certs}/ca.pem",
                        tls_cert=f"{self.rogue}/rogue.pem", tls_key=f"{self.rogue}/rogue-key.pem") as c:
            with self.assertRaises(b2b.UnavailableError):
                c.status()
        # The daemon's certificate checked against another CA: we refuse it.
        with self.tls(ca=f"{self.rogue}/ca.pem") as c:
            with self.assertRaises(b2b.UnavailableError):
                c.status()


if __name__ == "__main__":
    unittest.main()
