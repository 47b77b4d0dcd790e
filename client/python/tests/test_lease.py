"""Regions leased to their client: a client process that is killed -9, or
exits without deregistering, takes its leased regions with it; a region
registered with persist=True stays; a name collision names the holder.
Against one real daemon."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import unittest

import daemon_harness

import b2b

# The client process: registers a leased and a persistent region, prints
# their IDs, then waits for a line on stdin ("exit": leave without
# deregistering) or to be killed.
CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {pkg!r})
    import b2b
    c = b2b.Client({sock!r}, timeout=30)
    leased = c.register_host(1 << 20, {name!r})
    kept = c.register_host(1 << 20, {name!r} + "-kept", persist=True)
    print(leased.id, kept.id, flush=True)
    sys.stdin.readline()
    os_exit = __import__("os")._exit
    os_exit(0)  # no close, no deregistration: the daemon sees the connection go
    """
)


class LeaseTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = daemon_harness.Daemon("lease").start()
        cls.c = cls.d.client(timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        code = cls.d.stop()
        cls.d.cleanup()
        if code != 0:
            raise AssertionError(f"b2bd exited with {code}")

    def child(self, name: str):
        src = CHILD.format(pkg=str(daemon_harness.PKG_ROOT), sock=self.d.socket, name=name)
        p = subprocess.Popen([sys.executable, "-c", src], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.addCleanup(lambda: (p.poll() is None and p.kill(), p.wait()))
        line = p.stdout.readline().split()
        self.assertEqual(len(line), 2, f"the client process printed {line!r}")
        return p, line[0], line[1]

    def regions(self):
        return {r.id: r for r in self.c.list_regions()}

    def wait_gone(self, rid: str, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        while rid in self.regions():
            if time.monotonic() > deadline:
                self.fail(f"region {rid} still registered {timeout} s after its client left")
            time.sleep(0.01)

    def check_lease(self, name: str, leave):
        p, leased_id, kept_id = self.child(name)
        rs = self.regions()
        leased, kept = rs[leased_id], rs[kept_id]
        for r in (leased, kept):
            self.assertEqual(r.pid, p.pid)
            self.assertEqual(r.owner, f"uid {os.getuid()}")
            self.assertGreater(r.age_ns, 0)
        self.assertFalse(leased.persist)
        self.assertTrue(kept.persist)
        with self.assertRaises(b2b.AlreadyExistsError) as cm:
            self.c.register_host(4096, name)
        msg = str(cm.exception)
        for w in (f"region {leased_id}", f"pid {p.pid}", "leased"):
            self.assertIn(w, msg)
        leave(p)
        self.wait_gone(leased_id)
        self.assertIn(kept_id, self.regions(), "the persistent region went with its client")
        # The rerun gets the name.
        with self.c.register_host(4096, name):
            pass
        self.c.deregister(kept_id)

    def test_killed_client_releases_its_regions(self):
        def kill(p):
            p.send_signal(signal.SIGKILL)
            p.wait()

        self.check_lease("py-killed", kill)

    def test_exited_client_releases_its_regions(self):
        def leave(p):
            p.stdin.write("exit\n")
            p.stdin.flush()
            self.assertEqual(p.wait(), 0)

        self.check_lease("py-exited", leave)

    def test_persist_keyword(self):
        r = self.c.register_host(4096, persist=True)
        try:
            self.assertTrue(r.info.persist)
            self.assertFalse(r._deregister_on_close, "persist=True regions stay unless deregister_on_close=True")
        finally:
            r.close(deregister=True)
        with self.c.register_host(4096) as r2:
            self.assertFalse(r2.info.persist)
            self.assertTrue(r2._deregister_on_close)


if __name__ == "__main__":
    unittest.main()
