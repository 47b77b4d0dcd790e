"""Async handles (b2b.Transfer): start, wait, poll, cancel, between two real daemons."""

from __future__ import annotations

import signal
import threading
import time
import unittest

import daemon_harness

import numpy as np

import b2b
from b2b import kv, stream

BLOCK, N = 4096, 64


class AsyncTest(daemon_harness.SilentPeer, daemon_harness.DaemonPair):
    a_args = ("--max-transfers-per-client", "3")

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


class HandleTest(daemon_harness.DaemonPair):
    """One handle type for every transfer kind: a poll mixing them, and an
    interrupted wait, lose no outcome the daemon reports once."""

    def setUp(self):
        self.src = self.a.register_host(N * BLOCK)
        self.dst = self.b.register_host(N * BLOCK, "py-handle")
        self.src.memoryview[:] = np.random.default_rng(11).integers(0, 256, N * BLOCK, dtype=np.uint8).tobytes()
        self.a.register_layout("py-handle-src", [(self.src, 0, BLOCK, BLOCK)], N)
        self.b.register_layout("py-handle-dst", [(self.dst, 0, BLOCK, BLOCK)], N, export_name="py-handle-dst")
        self.kv_src = kv.register(self.a, [b2b.as_array(self.src, np.uint8, (N, BLOCK))], name="py-handle-kv")

    def tearDown(self):
        self.kv_src.close()
        self.a.deregister_layout("py-handle-src")
        self.b.deregister_layout("py-handle-dst")
        self.src.close(deregister=True)
        self.dst.close(deregister=True)

    def block(self, region, i):
        return bytes(region.memoryview[i * BLOCK:(i + 1) * BLOCK])

    def test_mixed_poll(self):
        peer = self.db.peer_address
        with stream.Counter(self.a, cuda=False) as c:
            c.set(1)
            hs = [
                self.a.start_transfer(self.src, peer, "py-handle", [0], [0], block_size=BLOCK),           # a batch
                self.kv_src.transfer_blocks(peer, "py-handle-dst", [1, 2], [11, 12], wait=False),        # b2b.kv
                stream.transfer_blocks(self.a, "py-handle-src", peer, "py-handle-dst", [3], [13], after=(c, 1)),  # b2b.stream
                self.a.transfer_blocks("py-handle-src", peer, "py-handle-dst", [4], [14], wait=False),   # Client
            ]
            deadline = time.monotonic() + 30
            while not all(self.a.poll(hs)):
                self.assertLess(time.monotonic(), deadline, f"handles still running: {hs}")
                time.sleep(0.01)
        self.assertEqual([h.state for h in hs], ["done"] * 4)
        self.assertEqual([h.result.blocks for h in hs], [1, 2, 1, 1])
        self.assertEqual(hs[1].remote_ids, [11, 12])
        self.assertEqual(len({type(h) for h in hs}), 1, "every kind must be the one handle type")
        for i, j in ((0, 0), (1, 11), (2, 12), (3, 13), (4, 14)):
            self.assertEqual(self.block(self.dst, j), self.block(self.src, i), f"block {i} -> {j}")

    def test_wait_timeout_is_one_error(self):
        with stream.Counter(self.a, cuda=False) as c:
            hs = [stream.transfer_blocks(self.a, "py-handle-src", self.db.peer_address, "py-handle-dst", [5], [15], after=(c, 1)),
                  self.kv_src.transfer_blocks(self.db.peer_address, "py-handle-dst", [6], [16], after=(c, 1))]
            for h in hs:
                with self.assertRaises(b2b.WaitTimeoutError) as cm:
                    h.wait(timeout=0.05)
                self.assertIsInstance(cm.exception, TimeoutError)
                self.assertIsInstance(cm.exception, b2b.DeadlineExceededError)
                self.assertIs(h.cancel(), True)
                self.assertIs(h.cancel(), True)  # kept: no second call
                self.assertIsInstance(h.error, b2b.CancelledError)
                self.assertTrue(h.failed)

    def test_interrupted_wait_keeps_the_outcome(self):
        # SIGINT may be ignored in a background job: handle it for this test.
        self.addCleanup(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))
        with stream.Counter(self.a, cuda=False) as c:
            h = self.kv_src.transfer_blocks(self.db.peer_address, "py-handle-dst", [7, 8], [17, 18], after=(c, 1))
            fired = threading.Event()

            def interrupt_then_release():
                time.sleep(0.5)  # the wait below is in flight by then
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                fired.wait(10)
                c.set(1)  # the transfer runs; its outcome goes to the interrupted call

            t = threading.Thread(target=interrupt_then_release)
            try:
                with self.assertRaises(KeyboardInterrupt):
                    t.start()  # in here: the interrupt cannot strike outside the block
                    h.wait()
            finally:
                fired.set()
                t.join()
            r = h.wait(timeout=30)
        self.assertEqual(r.blocks, 2)
        for i, j in ((7, 17), (8, 18)):
            self.assertEqual(self.block(self.dst, j), self.block(self.src, i))


if __name__ == "__main__":
    unittest.main()
