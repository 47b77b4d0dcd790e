"""Block-id transfers of any size, with notifications, through the ring's
id arena (docs/ring.md): 64 transfers of ~100 ids with notes started by one
start_many go over the ring without a StartTransfers or TransferBlocks
call, every block checked and every note received once; ring and gRPC
handles mix in one poll, wait_any and wait_all; transfer_blocks with a
note (waiting or not) takes the ring too. gRPC calls are counted by the
interceptor of test_batched."""

from __future__ import annotations

import json
import threading
import time
import unittest
from typing import List

import numpy as np
from test_batched import BlockPools

import b2b
from b2b import _ring_client

SEGMENTS, POOL, BLOCK, N, IDS = 2, 8192, 64, 64, 100


class RingArenaTest(BlockPools):
    a_args = ("--submit-socket", "{dir}/submit.sock")
    segments, pool, block = SEGMENTS, POOL, BLOCK

    def setUp(self):
        self.rng = np.random.default_rng(53)
        self.pools(self.rng, "ra")
        self.assertIsNotNone(self.c.ring, self.c._ring.reason)
        # N transfers of IDS +- 8 ids each, to distinct other ids.
        perm = self.rng.permutation(POOL)
        self.moves, at = [], 0
        for i in range(N):
            n = IDS + int(self.rng.integers(-8, 9))
            self.moves.append((self.rng.permutation(POOL)[:n].astype(np.uint32), perm[at:at + n].astype(np.uint32)))
            at += n
        self.notes: List[bytes] = []
        self.watch = self.b.watch(self.dsts[0], timeout=120)
        self.reader = threading.Thread(target=self._read_notes, daemon=True)
        self.reader.start()

    def _read_notes(self):
        try:
            for n in self.watch:
                self.notes.append(bytes(n.notification))
        except b2b.B2BError:
            pass  # cancelled at tearDown

    def tearDown(self):
        self.watch.cancel()
        super().tearDown()

    def note(self, i: int) -> bytes:
        return json.dumps({"req": f"r{i}", "blocks": len(self.moves[i][0])}).encode()

    def blocks(self, i: int, **kw) -> b2b.Blocks:
        return b2b.Blocks(self.src, self.peer_b, self.dst, *self.moves[i], notification=self.note(i), **kw)

    def wait_notes(self, want: List[bytes]) -> None:
        end = time.monotonic() + 60
        while len(self.notes) < len(want) and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep(0.05)  # a duplicate would come now
        self.assertEqual(sorted(self.notes), sorted(want))  # each once

    def test_64_starts_over_the_ring(self):
        posted = self.c.ring._tag
        hs = self.c.start_many([self.blocks(i) for i in range(N)], timeout=30)
        self.assertEqual(self.c.ring._tag, posted + N, "not every start went through the ring")
        calls = self.k.take()
        self.assertLessEqual(set(calls), {"BindBlockRoute"}, calls)  # the route, once
        self.assertTrue(all(isinstance(h, _ring_client.RingBlocksTransfer) for h in hs))
        self.c.poll(hs)
        self.c.wait_all(hs, timeout=60)
        self.assertEqual(self.k.take(), {})
        for i, h in enumerate(hs):
            self.assertEqual(h.state, "done", h.error)
            self.assertEqual(h.result.blocks, len(self.moves[i][0]) * SEGMENTS)
            self.assertEqual(h.result.bytes, len(self.moves[i][0]) * SEGMENTS * BLOCK)
            self.assertIs(h.remote_ids, self.moves[i][1])
            self.assertTrue(self.landed(*self.moves[i]), i)
        self.wait_notes([self.note(i) for i in range(N)])
        # The route is cached: a second step binds nothing.
        hs = self.c.start_many([self.blocks(i) for i in range(4)])
        self.c.wait_all(hs, timeout=60)
        self.assertEqual(self.k.take(), {})

    def test_mixed_handles(self):
        plan = self.c.prepare(self.srcs[0], self.peer_b, self.dsts[1], [0], [0], block_size=BLOCK)
        try:
            self.mixed(plan)
        finally:
            plan.release()

    def mixed(self, plan):
        self.k.take()
        bad_ids = (self.moves[1][0], self.moves[1][1].copy())
        bad_ids[1][3] = POOL + 5  # out of range: refused when it runs, as over gRPC
        over = self.blocks(2).request()  # a raw request goes over gRPC as it is: refused at start
        over.timeout_ms = 10_000_000_000
        items = [self.blocks(0), plan, b2b.Blocks(self.src, self.peer_b, self.dst, *bad_ids, notification=b"x"),
                 over, self.blocks(3)]
        hs = self.c.start_many(items)
        self.assertEqual(self.k.take(), {"BindBlockRoute": 1, "StartTransfers": 1})  # the plan and the refused one
        self.assertEqual([type(h).__name__ for h in hs], ["RingBlocksTransfer", "Transfer", "RingBlocksTransfer", "Transfer", "RingBlocksTransfer"])
        self.assertTrue(hs[3].failed)
        self.assertIn("requests[3]: ", str(hs[3].error))  # the caller's index, not the call's
        self.assertIn("timeout_ms is 10000000000", str(hs[3].error))
        first = self.c.wait_any(hs, timeout=30)
        self.assertIn(hs[3], first)
        self.c.wait_all(hs, timeout=30)
        self.assertEqual(self.c.poll(hs), [True] * 5)
        self.assertTrue(hs[0].result and hs[4].result and hs[1].result)
        g = self.c.transfer_blocks(self.src, self.peer_b, self.dst, *bad_ids, notification=b"x", timeout=30, wait=False)
        self.assertIsInstance(g, _ring_client.RingBlocksTransfer)
        with self.assertRaises(b2b.InvalidArgumentError) as ring_err:
            g.wait(30)
        self.assertIsInstance(hs[2].error, b2b.InvalidArgumentError)
        c2 = self.da.client(timeout=30, ring=False)
        self.addCleanup(c2.close)
        with self.assertRaises(b2b.InvalidArgumentError) as grpc_err:
            c2.transfer_blocks(self.src, self.peer_b, self.dst, *bad_ids, notification=b"x", timeout=30)
        self.assertEqual(str(ring_err.exception), str(grpc_err.exception))
        self.assertEqual(str(hs[2].error), str(grpc_err.exception))
        self.assertTrue(self.landed(*self.moves[0]) and self.landed(*self.moves[3]))
        self.assertFalse(self.landed(*self.moves[2]))
        self.wait_notes([self.note(0), self.note(3)])

    def test_transfer_blocks_with_a_note(self):
        lids, rids = self.moves[5]
        r = self.c.transfer_blocks(self.src, self.peer_b, self.dst, lids, rids, notification=self.note(5), timeout=30)
        self.assertEqual(r.blocks, len(lids) * SEGMENTS)
        h = self.c.transfer_blocks(self.src, self.peer_b, self.dst, *self.moves[6], notification=self.note(6), wait=False)
        self.assertIsInstance(h, _ring_client.RingBlocksTransfer)
        self.assertEqual(h.wait(30).blocks, len(self.moves[6][0]) * SEGMENTS)
        self.assertTrue(h.done())
        calls = self.k.take()
        self.assertLessEqual(set(calls), {"BindBlockRoute"}, calls)
        self.assertTrue(self.landed(lids, rids) and self.landed(*self.moves[6]))
        self.wait_notes([self.note(5), self.note(6)])
        # A note over the limit: gRPC's refusal.
        with self.assertRaises(b2b.InvalidArgumentError) as e:
            self.c.transfer_blocks(self.src, self.peer_b, self.dst, lids, rids, notification=b"n" * 4097, timeout=30)
        self.assertIn("notification is 4097 bytes, over the limit of 4096", str(e.exception))

    def test_arena_wraps_and_reclaims(self):
        # Many more ids than a small arena holds at once: the client waits
        # for the daemon to take records and reuses their space.
        ring = self.c.ring
        size = ring.arena.size
        items = [self.blocks(i % N) for i in range(4 * size // (8 * IDS))]
        posted = ring._tag
        hs = self.c.start_many(items)
        self.assertEqual(ring._tag - posted, len(items))
        self.assertGreater(ring.arena.tail, 0)
        self.c.wait_all(hs, timeout=120)
        for i in range(N):
            self.assertTrue(self.landed(*self.moves[i]), i)
        self.assertTrue(all(h.state == "done" for h in hs), [h.error for h in hs if h.failed][:1])
        self.assertLessEqual(ring.arena.tail - ring.arena.head, size)

    def test_cancel(self):
        hs = self.c.start_many([self.blocks(i) for i in range(8)])
        got = [h.cancel() for h in hs]  # each ended first or was cancelled: either way it answers
        for h, cancelled in zip(hs, got):
            self.assertEqual(h.state, "cancelled" if cancelled else "done")


if __name__ == "__main__":
    unittest.main()
