"""Client.close() with work in flight, between two real daemons: it stops
what the client started (its transfers, armed or running, its plans, its
ring) before it releases its regions, so it warns of nothing and the
regions are gone once it returned. The test's own clients keep this
process connected, so no lease would have freed them: close() did. A
region another client still holds is left to its lease quietly, unless it
persists (no lease frees it): that one is warned about."""

from __future__ import annotations

import logging
import time
import uuid
import warnings

import daemon_harness

import numpy as np

import b2b
import b2b.stream

BLOCK, N = 4096, 16


class CloseTest(daemon_harness.SilentPeer, daemon_harness.DaemonPair):
    def setUp(self):
        self.tag = uuid.uuid4().hex[:6]
        self.dst = self.b.register_host(N * BLOCK, f"close-{self.tag}")
        self.offs = np.arange(N, dtype=np.uint64) * BLOCK
        self.c1 = self.da.client(timeout=30)
        self.addCleanup(self.c1.close)

    def tearDown(self):
        self.dst.close()

    def close_quietly(self, c: b2b.Client) -> None:
        """Close c; no warning may come of it."""
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            c.close()
        self.assertEqual([str(w.message) for w in got], [])

    def wait_gone(self, ids, timeout: float = 10.0) -> None:
        """The regions ids are no longer registered (another client asks)."""
        end = time.monotonic() + timeout
        while True:
            left = {r.id for r in self.a.list_regions()} & set(ids)
            if not left:
                return
            if time.monotonic() > end:
                self.fail(f"regions {sorted(left)} still registered {timeout} s after close()")
            time.sleep(0.01)

    def test_armed_transfer(self):
        src = self.c1.register_host(N * BLOCK)
        counter = b2b.stream.Counter(self.c1, cuda=False)
        h = self.c1.start_transfer(src, self.peer_b, self.dst.export_name, self.offs, self.offs, block_size=BLOCK,
                                   timeout=30, after=(counter, 1))  # the counter never gets there
        self.close_quietly(self.c1)
        self.wait_gone([src.id, counter.region.id])
        self.assertEqual(h.state, "cancelled")  # the handle got its outcome
        self.assertEqual(self.a.status().transfers_in_flight, 0)

    def test_running_transfer(self):
        src = self.c1.register_host(N * BLOCK)
        h = self.c1.start_transfer(src, self.silent_addr, "nobody", self.offs, self.offs, block_size=BLOCK, timeout=30)
        self.close_quietly(self.c1)
        self.wait_gone([src.id])
        self.assertEqual(h.state, "cancelled")

    def test_dropped_handle(self):
        src = self.c1.register_host(N * BLOCK)
        self.c1.start_transfer(src, self.silent_addr, "nobody", self.offs, self.offs, block_size=BLOCK, timeout=30)
        self.close_quietly(self.c1)  # its id was kept: cancelled all the same
        self.wait_gone([src.id])

    def test_unreleased_plan(self):
        src = self.c1.register_host(N * BLOCK)
        plan = self.c1.prepare(src, self.peer_b, self.dst.export_name, self.offs, self.offs, block_size=BLOCK)
        self.assertEqual(plan.submit().blocks, N)
        self.close_quietly(self.c1)  # the plan pinned src
        self.wait_gone([src.id])

    def test_note_armed_blocks(self):
        mbox = self.c1.register_host(4096, f"mbox-{self.tag}")
        sink = self.c1.register_host(N * BLOCK)
        local, remote = f"sink-{self.tag}", f"src-{self.tag}"
        self.c1.register_layout(local, [(sink, 0, BLOCK, BLOCK)], N)
        self.b.register_layout(remote, [(self.dst, 0, BLOCK, BLOCK)], N, export_name=remote, readers=["*"])
        try:
            h = self.c1.start_many([b2b.Blocks(local, self.peer_b, remote, [1, 2], [1, 2], op="read",
                                               after=b2b.on_note(mbox, "never"), timeout=30)])[0]
            self.assertEqual(h.state, "running")
            self.close_quietly(self.c1)
            self.wait_gone([mbox.id, sink.id])
            layouts = self.a.stub.ListLayouts(b2b.v1.b2b_pb2.ListLayoutsRequest()).layouts
            self.assertNotIn(local, [lay.name for lay in layouts])
        finally:
            self.b.deregister_layout(remote)

    def test_held_by_another_client(self):
        leased = self.c1.register_host(4096)
        kept = self.c1.register_host(4096, persist=True, deregister_on_close=True)
        lay = f"hold-{self.tag}"
        self.a.register_layout(lay, [(leased, 0, 64, 64), (kept, 0, 64, 64)], 4)  # another client's hold
        try:
            with self.assertLogs("b2b", logging.DEBUG) as logs, warnings.catch_warnings(record=True) as got:
                warnings.simplefilter("always")
                self.c1.close()
            msgs = [str(w.message) for w in got]
            self.assertEqual(len(msgs), 1, msgs)  # the one that persists: no lease frees it
            self.assertIn(f"region {kept.id}", msgs[0])
            self.assertIn("persists", msgs[0])
            self.assertTrue(any(leased.id in m and "lease" in m for m in logs.output), logs.output)
            self.assertLessEqual({leased.id, kept.id}, {r.id for r in self.a.list_regions()})
        finally:
            self.a.deregister_layout(lay)
            for rid in (leased.id, kept.id):
                self.a.deregister(rid)


class RingCloseTest(CloseTest):
    """The same with a ring (daemon a has a submit socket): the ring's
    transfers end when it closes, a moment later in the daemon."""

    names = ("ca", "cb")
    a_args = ("--submit-socket", "{dir}/submit.sock")

    def setUp(self):
        super().setUp()
        self.assertIsNotNone(self.c1.ring, self.c1._ring.reason)

    def test_note_armed_blocks(self):
        super().test_note_armed_blocks()  # over the ring: start_many posts it there

    def test_ring_submits(self):
        src = self.c1.register_host(N * BLOCK)
        plan = self.c1.prepare(src, self.peer_b, self.dst.export_name, self.offs, self.offs, block_size=BLOCK)
        hs = self.c1.start_submits([plan] * 8, timeout=30)
        self.assertEqual(type(hs[0]).__name__, "RingTransfer")
        self.close_quietly(self.c1)
        self.wait_gone([src.id])


if __name__ == "__main__":
    import unittest

    unittest.main()
