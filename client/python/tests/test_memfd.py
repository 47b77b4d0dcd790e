"""Memory the client allocates itself (b2b.alloc_host, Client.register_memfd):
every block moved from and into it is checked, unshareable memory and
unsealed memfds are refused naming the allocator, the seal refuses a
shrink, and the daemon's mapping outlives the client's."""

from __future__ import annotations

import fcntl
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import unittest

import numpy as np
from test_transfer import TwoDaemons, layout

import b2b

SUBMIT_ARGS = ("--submit-socket", "{dir}/submit.sock")


class MemfdTest(TwoDaemons):
    a_args = SUBMIT_ARGS
    N, BS = 2_000, 512

    def setUp(self):
        super().setUp()
        self.so, self.size = layout(self.N, self.BS, self.rng)
        self.name = f"memfd-{self._testMethodName}"

    def test_blocks_both_ways(self):
        src = self.a.alloc_host(self.size, "memfd-in")
        self.addCleanup(src.close)
        self.assertIsInstance(src.buffer, b2b.HostBuffer)
        self.assertEqual(src.info.shm_path, "")
        dst = self.b.register_host(self.size, self.name)
        self.addCleanup(dst.close)
        self.random_fill(src)
        self.a.batch_transfer(src, self.peer_b, self.name, self.so, self.so, block_size=self.BS)
        self.assert_blocks_equal(src, self.so, dst, self.so, self.BS)
        # Into the memfd: the peer's bytes show in this process's array.
        self.random_fill(dst)
        self.b.batch_transfer(dst, self.da.peer_address, "memfd-in", self.so, self.so, block_size=self.BS)
        self.assert_blocks_equal(dst, self.so, src, self.so, self.BS)
        # The seal refuses a shrink, so no client can SIGBUS the daemon.
        with self.assertRaises(PermissionError):
            os.ftruncate(src.buffer.fd, 4096)

    def assert_blocks_equal(self, src, so, dst, do, lengths):
        # The byte comparison only: the two regions live on either daemon.
        got = np.concatenate([dst.array[int(o):int(o) + self.BS] for o in do])
        want = np.concatenate([src.array[int(o):int(o) + self.BS] for o in so])
        self.assertTrue(np.array_equal(got, want), "a block differs")

    def test_numpy_view_of_a_buffer(self):
        buf = b2b.alloc_host(self.size)
        self.addCleanup(buf.close)
        arr = buf.as_array(np.uint8, self.size)
        arr[:] = self.rng.integers(0, 256, self.size, dtype=np.uint8)  # filled before registering
        src = self.a.register_memfd(arr)
        self.addCleanup(src.close)
        dst = self.b.register_host(self.size, self.name)
        self.addCleanup(dst.close)
        self.a.batch_transfer(src, self.peer_b, self.name, self.so, self.so, block_size=self.BS)
        self.assert_blocks_equal(src, self.so, dst, self.so, self.BS)
        src.close()
        self.assertEqual(int(buf.array[0]), int(arr[0]))  # the buffer outlives its region

    def test_refusals(self):
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            self.a.register_memfd(np.zeros(4096, np.uint8))
        self.assertIn("b2b.alloc_host", str(cm.exception))
        fd = os.memfd_create("unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self.addCleanup(os.close, fd)
        os.ftruncate(fd, 4096)
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            self.a.register_memfd(fd)
        for want in ("host_fd", "F_SEAL_SHRINK", "b2b.alloc_host"):
            self.assertIn(want, str(cm.exception))
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        r = self.a.register_memfd(fd, size=4096)
        self.addCleanup(r.close)
        self.assertEqual(r.size, 4096)

    def test_outlives_client(self):
        c = self.da.client(timeout=30)
        src = c.alloc_host(self.size, persist=True)
        self.random_fill(src)
        want = src.array.copy()
        rid = src.id
        src.close()  # unmaps and closes the memfd here
        c.close()
        dst = self.b.register_host(self.size, self.name)
        self.addCleanup(dst.close)
        self.a.batch_transfer(rid, self.peer_b, self.name, self.so, self.so, block_size=self.BS)
        got = np.concatenate([dst.array[int(o):int(o) + self.BS] for o in self.so])
        self.assertTrue(np.array_equal(got, np.concatenate([want[int(o):int(o) + self.BS] for o in self.so])))
        self.a.deregister(rid)

    def test_outlives_killed_client(self):
        # A process that registers a persistent memfd region, fills it, and is
        # killed (SIGKILL: no clean-up of any kind).
        code = textwrap.dedent(f"""
            import os, signal, sys, numpy as np
            sys.path[:0] = {sys.path!r}
            import b2b
            c = b2b.Client({self.da.socket!r})
            r = c.alloc_host({self.size}, persist=True)
            r.array[:] = np.random.default_rng(9).integers(0, 256, {self.size}, dtype=np.uint8)
            print(r.id, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
            """)
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, -signal.SIGKILL, p.stderr)
        rid = p.stdout.strip()
        want = np.random.default_rng(9).integers(0, 256, self.size, dtype=np.uint8)
        dst = self.b.register_host(self.size, self.name)
        self.addCleanup(dst.close)
        self.a.batch_transfer(rid, self.peer_b, self.name, self.so, self.so, block_size=self.BS)
        for o in self.so:
            o = int(o)
            self.assertTrue(np.array_equal(dst.array[o:o + self.BS], want[o:o + self.BS]), f"block at {o} differs")
        self.a.deregister(rid)


if __name__ == "__main__":
    unittest.main()
