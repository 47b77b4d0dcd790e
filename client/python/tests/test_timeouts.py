"""Timeouts that are no plain number of seconds, between two real daemons:
NaN and negatives are refused naming ``timeout`` (nothing starts), while
``math.inf`` and huge finite values run as the longest deadline there is,
where they used to fail at once (DEADLINE_EXCEEDED) or raise raw
ValueError/OverflowError. Over gRPC, and through the ring."""

from __future__ import annotations

import math
import unittest

import daemon_harness

import numpy as np

import b2b

BLOCK, N = 4096, 16
NAN, INF = float("nan"), math.inf


class TimeoutsTest(daemon_harness.DaemonPair):
    def setUp(self):
        self.src = self.a.register_host(N * BLOCK)
        self.dst = self.b.register_host(N * BLOCK, f"py-to-{type(self).__name__}")
        self.offs = np.arange(N, dtype=np.uint64) * BLOCK

    def tearDown(self):
        self.src.close()
        self.dst.close()

    def fill(self, seed: int) -> None:
        self.src.memoryview[:] = np.random.default_rng(seed).integers(0, 256, N * BLOCK, dtype=np.uint8).tobytes()

    def landed(self) -> bool:
        return bytes(self.dst.memoryview) == bytes(self.src.memoryview)

    def batch(self, t):
        return self.a.batch_transfer(self.src, self.peer_b, self.dst.export_name, self.offs, self.offs, block_size=BLOCK, timeout=t)

    def start(self, t):
        return self.a.start_transfer(self.src, self.peer_b, self.dst.export_name, self.offs, self.offs, block_size=BLOCK, timeout=t)

    def test_refused(self):
        self.fill(1)
        for name, call in (("batch_transfer", self.batch), ("start_transfer", self.start)):
            for t, rule in ((NAN, "> 0"), (-1, "> 0"), (0, "> 0"), (True, "is a bool")):
                with self.subTest(call=name, timeout=t):
                    with self.assertRaises(b2b.InvalidArgumentError) as cm:
                        call(t)
                    self.assertIn(f"timeout {t!r}", cm.exception.message)
                    self.assertIn(rule, cm.exception.message)
        self.assertEqual(self.a.status().transfers_in_flight, 0)
        self.assertFalse(self.landed(), "a refused call moved bytes")

    def test_inf_and_huge_run(self):
        seed = 10
        for t in (INF, 1e10, 1e9, 86401, 7200):
            for name, call in (("batch_transfer", self.batch), ("start_transfer", lambda t: self.start(t).wait(timeout=60))):
                seed += 1
                with self.subTest(call=name, timeout=t):
                    self.fill(seed)
                    r = call(t)
                    self.assertEqual(r.blocks, N)
                    self.assertTrue(self.landed())

    def test_waits(self):
        h = self.start(30)
        for t in (NAN, -1, "1"):
            with self.subTest(timeout=t), self.assertRaises(b2b.InvalidArgumentError) as cm:
                h.wait(timeout=t)
            self.assertIn(f"timeout {t!r}", cm.exception.message)
            self.assertIn(">= 0", cm.exception.message)
        self.assertEqual(h.wait(timeout=INF).blocks, N)
        h = self.start(INF)
        self.a.wait_all([h], timeout=1e10)
        self.assertEqual(h.result.blocks, N)
        with self.assertRaises(b2b.InvalidArgumentError):
            self.a.wait_any([h], timeout=NAN)


class RingTimeoutsTest(TimeoutsTest):
    """The same through the ring (daemon a with a submit socket): the
    ring's paths take the checked timeout too."""

    names = ("ra", "rb")
    a_args = ("--submit-socket", "{dir}/submit.sock")

    def setUp(self):
        super().setUp()
        self.assertIsNotNone(self.a.ring, self.a._ring.reason)

    def test_ring_handles(self):
        self.fill(3)
        with self.a.prepare(self.src, self.peer_b, self.dst.export_name, self.offs, self.offs, block_size=BLOCK, timeout=INF) as plan:
            self.assertEqual(plan.submit(timeout=1e10).blocks, N)
            for bad in (NAN, -1):
                with self.subTest(timeout=bad), self.assertRaises(b2b.InvalidArgumentError):
                    plan.submit(timeout=bad)
            # Over the ring's 24 h a submit takes gRPC, whose call carries it.
            self.assertEqual(self.a.start_submit(plan, timeout=INF).wait(timeout=INF).blocks, N)
            h = self.a.start_submit(plan, timeout=30)
            self.assertEqual(type(h).__name__, "RingTransfer")
            for bad in (NAN, -1, "x", True):
                with self.subTest(timeout=bad), self.assertRaises(b2b.InvalidArgumentError) as cm:
                    h.wait(timeout=bad)
                self.assertIn(f"timeout {bad!r}", cm.exception.message)
            self.assertEqual(h.wait(timeout=INF).blocks, N)
            hs = self.a.start_submits([plan, plan], timeout=1e10)
            self.a.wait_all(hs, timeout=INF)
            self.assertEqual([x.result.blocks for x in hs], [N, N])
        self.assertTrue(self.landed())


if __name__ == "__main__":
    unittest.main()
