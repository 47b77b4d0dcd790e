"""Async handles (b2b.Transfer): start, wait, poll, cancel, between two real daemons."""

from __future__ import annotations

import socket
import unittest

import daemon_harness

import numpy as np

import b2b

BLOCK, N = 4096, 64


class AsyncTest(daemon_harness.DaemonPair):
    a_args = ("--max-transfers-per-client", "3")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # A peer that accepts connections and never speaks: a transfer to it
        # runs until cancelled or its deadline.
        cls.silent = socket.socket()
        cls.silent.bind(("127.0.0.1", 0))
        cls.silent.listen(16)
        cls.silent_addr = "127.0.0.1:%d" % cls.silent.getsockname()[1]

    @classmethod
    def tearDownClass(cls):
        cls.silent.close()
        super().tearDownClass()

    def setUp(self):
        self.src = self.a.register_host(N * BLOCK)
        self.dst = self.b.register_host(N * BLOCK, "py-async")
        self.src.memoryview[:] = np.random.default_rng(7).integers(0, 256, N * BLOCK, dtype=np.uint8).tobytes()

    def tearDown(self):
        self.src.close(deregister=True)
        self.dst.close(deregister=True)

    def offsets(self):
        return np.arange(0, N * BLOCK, BLOCK, dtype=np.uint64)

    def test_wait_returns_the_result_once_landed(self):
        h = self.a.start_transfer(self.src, self.db.peer_address, "py-async", self.offsets(), self.offsets(), block_size=BLOCK)
        self.assertIsInstance(h, b2b.Transfer)
        self.assertNotEqual(h.id, 0)
        r = h.wait()
        self.assertEqual(r.blocks, N)
        self.assertTrue(h.done())
        self.assertEqual(h.state, "done")
        self.assertEqual(h.result.blocks, N)  # kept in the handle: the daemon reports once
        self.assertEqual(bytes(self.dst.memoryview), bytes(self.src.memoryview))
        with self.assertRaises(b2b.NotFoundError):  # reported once: the id is freed
            self.a.poll([b2b.Transfer(self.a, h.id)])

    def test_blocks_without_waiting(self):
        self.a.register_layout("py-async-src", [(self.src, 0, BLOCK, BLOCK)], N)
        self.b.register_layout("py-async-dst", [(self.dst, 0, BLOCK, BLOCK)], N, export_name="py-async-dst")
        try:
            src_ids, dst_ids = [1, 2, 3, 9], [40, 41, 7, 0]
            h = self.a.transfer_blocks("py-async-src", self.db.peer_address, "py-async-dst", src_ids, dst_ids, wait=False)
            self.assertIsInstance(h, b2b.Transfer)
            while not self.a.poll([h])[0]:
                pass
            self.assertEqual(h.result.blocks, len(src_ids))
            for i, j in zip(src_ids, dst_ids):
                self.assertEqual(bytes(self.dst.memoryview[j * BLOCK:(j + 1) * BLOCK]), bytes(self.src.memoryview[i * BLOCK:(i + 1) * BLOCK]))
        finally:
            self.a.deregister_layout("py-async-src")
            self.b.deregister_layout("py-async-dst")

    def test_cancel_and_bound(self):
        hs = [self.a.start_transfer(self.src, self.silent_addr, "x", [0], [0], block_size=BLOCK, timeout=60) for _ in range(3)]
        with self.assertRaises(b2b.ResourceExhaustedError) as cm:
            self.a.start_transfer(self.src, self.silent_addr, "x", [0], [0], block_size=BLOCK, timeout=60)
        self.assertIn("the limit (--max-transfers-per-client) is 3", str(cm.exception))
        self.assertFalse(hs[0].done())
        with self.assertRaises(TimeoutError):
            hs[0].wait(timeout=0.01)
        self.assertEqual(self.a.status().transfers_in_flight, 3)
        for h in hs:
            self.assertTrue(h.cancel())
            self.assertEqual(h.state, "cancelled")
            with self.assertRaises(b2b.CancelledError):
                h.wait()
            self.assertIsInstance(h.error, b2b.CancelledError)
        st = self.a.status()
        self.assertEqual((st.transfers_in_flight, st.transfers_held), (0, 0))

    def test_bad_input_is_refused_at_start(self):
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            self.a.start_transfer(self.src, self.db.peer_address, "py-async", [N * BLOCK], [0], block_size=BLOCK)
        self.assertIn("src", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
