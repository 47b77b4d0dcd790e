"""Prepared transfers, the submit stream and ping, against two real daemons
(TCP, loopback): every block verified by both daemons' per-block checksums
and by the bytes."""

from __future__ import annotations

import time
import unittest

import grpc
import numpy as np
from test_transfer import TwoDaemons, layout

import b2b
from b2b.v1 import b2b_pb2 as pb


class PreparedTest(TwoDaemons):
    N, BS = 10_000, 128

    def setUp(self):
        super().setUp()
        so, src_size = layout(self.N, self.BS, self.rng)
        do, dst_size = layout(self.N, self.BS, self.rng)
        self.so, self.do = so, do
        self.src = self.a.register_host(src_size)
        self.name = f"prep-{self._testMethodName}"
        self.dst = self.b.register_host(dst_size, self.name)
        self.addCleanup(self.dst.close)
        self.addCleanup(self.src.close)

    def prepare(self, **kw):
        p = self.a.prepare(self.src, self.peer_b, self.name, self.so, self.do, block_size=self.BS, timeout=30, **kw)
        self.addCleanup(p.release)
        return p

    def test_submit_lands_every_block(self):
        p = self.prepare()
        self.assertNotEqual(p.handle, 0)
        self.assertEqual((p.blocks, p.bytes, p.transport), (self.N, self.N * self.BS, "tcp"))
        self.assertIsNotNone(p.phases)
        for round in range(3):
            self.random_fill(self.src)  # new bytes, same layout
            r = p.submit()
            self.assertEqual((r.blocks, r.bytes, r.transport), (self.N, self.N * self.BS, "tcp"), round)
            # A prepared submit decodes, validates and plans nothing.
            self.assertEqual((r.phases.validate_ns, r.phases.plan_ns), (0, 0), r.phases)
            self.assertGreater(r.phases.total_ns, 0)
            self.assert_blocks_equal(self.src, self.so, self.dst, self.do, self.BS)

    def test_release(self):
        p = self.prepare()
        p.submit()
        # The plan holds its source.
        with self.assertRaises(b2b.FailedPreconditionError) as cm:
            self.a.deregister(self.src)
        self.assertIn("prepared", cm.exception.message)
        p.release()
        p.release()  # a second release does nothing
        self.assertTrue(p.released)
        with self.assertRaises(b2b.FailedPreconditionError):
            p.submit()
        # The daemon forgot the handle too.
        with self.assertRaises(grpc.RpcError) as cm:
            self.a.stub.SubmitTransfer(pb.SubmitTransferRequest(handle=p.handle), timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        # Nothing holds the source any more: it deregisters.
        self.src.close()
        self.assertTrue(self.src.deregistered)

    def test_context_manager(self):
        with self.a.prepare(self.src, self.peer_b, self.name, self.so, self.do, block_size=self.BS) as p:
            self.random_fill(self.src)
            self.assertEqual(p.submit(timeout=30).blocks, self.N)
        self.assertTrue(p.released)
        self.assert_blocks_equal(self.src, self.so, self.dst, self.do, self.BS)
        self.src.close()
        self.assertTrue(self.src.deregistered)

    def test_unknown_handle(self):
        with self.assertRaises(grpc.RpcError) as cm:
            self.a.stub.SubmitTransfer(pb.SubmitTransferRequest(handle=424242), timeout=10)
        err = b2b.from_rpc_error(cm.exception)
        self.assertIsInstance(err, b2b.NotFoundError)
        self.assertIn("424242", err.message)
        with self.assertRaises(b2b.NotFoundError) as cm2:
            self.a._call(self.a.stub.ReleaseTransfer, pb.ReleaseTransferRequest(handle=424242), 10)
        self.assertIn("424242", cm2.exception.message)

    def test_another_clients_plan(self):
        p = self.prepare()
        with b2b.Client(self.da.socket, timeout=10) as other:
            with self.assertRaises(grpc.RpcError) as cm:
                other.stub.SubmitTransfer(pb.SubmitTransferRequest(handle=p.handle), timeout=10)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertEqual(p.submit().blocks, self.N)

    def test_bad_prepare(self):
        bad = self.do.copy()
        bad[17] = self.dst.size  # past the destination's end
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            self.a.prepare(self.src, self.peer_b, self.name, self.so, bad, block_size=self.BS, timeout=30)
        self.assertIn("17", cm.exception.message)
        with self.assertRaises(b2b.NotFoundError):
            self.a.prepare(self.src, self.peer_b, "no-such-export", self.so, self.do, block_size=self.BS, timeout=30)

    def test_stream_tags(self):
        # Three plans into disjoint quarters of the destination, plus a released one.
        q = self.N // 4
        plans = []
        for k in range(3):
            sl = slice(k * q, (k + 1) * q)
            plans.append(self.a.prepare(self.src, self.peer_b, self.name, self.so[sl], self.do[sl], block_size=self.BS, timeout=30))
            self.addCleanup(plans[-1].release)
        gone = self.prepare()
        gone_handle = gone.handle
        gone.release()
        self.random_fill(self.src)
        want = {}
        with self.a.submit_stream(timeout=60) as s:
            for i in range(12):
                tag = 1000 + 7 * i
                self.assertEqual(s.submit(plans[i % 3], tag), tag)
                want[tag] = plans[i % 3].bytes
            # A handle the daemon does not know: its tag comes back with NotFound.
            stale = object.__new__(b2b.PreparedTransfer)
            stale.handle, stale._released = gone_handle, False
            s.submit(stale, 5)
            s.done_sending()
            got = {r.tag: r for r in s}
        self.assertEqual(set(got), set(want) | {5})
        self.assertIsInstance(got[5].error, b2b.NotFoundError)
        self.assertIn(str(gone_handle), got[5].error.message)
        with self.assertRaises(b2b.NotFoundError):
            got[5].get()
        for tag, n in want.items():
            self.assertTrue(got[tag].ok, got[tag].error)
            self.assertEqual(got[tag].get().bytes, n)
        sl = slice(0, 3 * q)
        self.assert_blocks_equal(self.src, self.so[sl], self.dst, self.do[sl], self.BS)

    def test_pipeline(self):
        p = self.prepare()
        self.random_fill(self.src)
        results = list(self.a.pipeline([p] * 20, depth=4, timeout=60))
        self.assertEqual(sorted(r.tag for r in results), list(range(20)))
        for r in results:
            self.assertEqual(r.get().blocks, self.N)
        self.assert_blocks_equal(self.src, self.so, self.dst, self.do, self.BS)
        with self.assertRaises(b2b.InvalidArgumentError):
            list(self.a.pipeline([p], depth=0))
        self.assertEqual(list(self.a.pipeline([], depth=2)), [])

    def test_plans_freed_with_their_client(self):
        c = b2b.Client(self.da.socket, timeout=30)
        p = c.prepare(self.src, self.peer_b, self.name, self.so, self.do, block_size=self.BS)
        p.submit()
        c.close()
        # The daemon frees the plans of a connection that is gone, so the
        # source deregisters (soon: the daemon learns of the close by itself).
        deadline = time.monotonic() + 10
        while True:
            try:
                self.a.deregister(self.src)
                break
            except b2b.FailedPreconditionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.assertTrue(self.src.deregistered)

    def test_ping(self):
        self.assertIsNone(self.a.ping())
        self.assertIsNone(self.b.ping(timeout=5))


if __name__ == "__main__":
    unittest.main()
