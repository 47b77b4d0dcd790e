"""Batched starts and waits (StartTransfers, WaitTransfers): 64 transfers
start in one call, are polled in one and waited for in one, and an engine
step of the connector costs one call to start its reads and one for
get_finished; every block of every transfer checked. The calls are
counted by a gRPC client interceptor on the clients' channels."""

from __future__ import annotations

import collections
import threading
import unittest
import uuid
from typing import Any, Dict, List

import daemon_harness
import grpc
import numpy as np

import b2b
from b2b.v1 import b2b_pb2_grpc as pb_grpc

SEGMENTS, POOL, BLOCK, N = 2, 256, 512, 64


class Counter(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Counts the calls of a channel by method name."""

    def __init__(self) -> None:
        self.calls: Dict[str, int] = collections.Counter()
        self._lock = threading.Lock()

    def _count(self, details: Any) -> None:
        with self._lock:
            self.calls[details.method.rsplit("/", 1)[-1]] += 1

    def intercept_unary_unary(self, continuation, details, request):
        self._count(details)
        return continuation(details, request)

    def intercept_unary_stream(self, continuation, details, request):
        self._count(details)
        return continuation(details, request)

    def take(self) -> Dict[str, int]:
        with self._lock:
            out, self.calls = dict(self.calls), collections.Counter()
        return out


def counted(c: b2b.Client) -> Counter:
    """Route c's stub through a Counter."""
    k = Counter()
    c._stub = pb_grpc.B2BStub(grpc.intercept_channel(c._channel, k))
    return k


class BlockPools(daemon_harness.DaemonPair):
    """Block pools for block-id tests on two daemons: ``segments`` regions
    of ``pool`` blocks of ``block`` bytes a side, A's random, B's exported
    and laid out as ``self.dst``; ``self.c`` a client of A's daemon whose
    gRPC calls ``self.k`` counts."""

    segments, pool, block = SEGMENTS, POOL, BLOCK

    def pools(self, rng: np.random.Generator, prefix: str) -> None:
        tag = uuid.uuid4().hex[:6]
        n = self.pool * self.block
        self.srcs = [self.a.register_host(n) for _ in range(self.segments)]
        self.dsts = [self.b.register_host(n, f"{prefix}-{tag}-{i}") for i in range(self.segments)]
        for s in self.srcs:
            s.memoryview[:] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        self.src, self.dst = f"{prefix}-src-{tag}", f"{prefix}-dst-{tag}"
        self.a.register_layout(self.src, [(s, 0, self.block, self.block) for s in self.srcs], self.pool)
        self.b.register_layout(self.dst, [(d, 0, self.block, self.block) for d in self.dsts], self.pool,
                               export_name=self.dst)
        self.c = self.da.client(timeout=30)
        self.k = counted(self.c)

    def tearDown(self):
        self.c.close()
        for c, name in ((self.a, self.src), (self.b, self.dst)):
            try:
                c.deregister_layout(name)
            except b2b.NotFoundError:
                pass
        for r in self.srcs + self.dsts:
            r.close()

    def landed(self, lids: Any, rids: Any) -> bool:
        """Every segment's block ``lids[k]`` of A arrived as block ``rids[k]`` of B."""
        bs = self.block
        return all(bytes(d.memoryview[j * bs:(j + 1) * bs]) == bytes(s.memoryview[i * bs:(i + 1) * bs])
                   for s, d in zip(self.srcs, self.dsts) for i, j in zip((int(x) for x in lids), (int(x) for x in rids)))


class BatchedTest(BlockPools):
    def setUp(self):
        rng = np.random.default_rng(41)
        self.pools(rng, "bt")
        # 64 transfers of 3 blocks each, to other ids (a permutation).
        perm = [int(x) for x in rng.permutation(POOL)]
        self.moves = [(list(range(3 * i, 3 * i + 3)), perm[3 * i:3 * i + 3]) for i in range(N)]

    def blocks(self, lids: List[int], rids: List[int]) -> b2b.Blocks:
        return b2b.Blocks(self.src, self.peer_b, self.dst, lids, rids)

    def test_64_starts_one_call_one_poll_one_wait(self):
        hs = self.c.start_many([self.blocks(l, r) for l, r in self.moves], timeout=30)
        self.assertEqual(self.k.take(), {"StartTransfers": 1})
        self.assertEqual(len(hs), N)
        self.assertTrue(all(h.id for h in hs))
        self.c.poll(hs)
        self.assertEqual(self.k.take(), {"PollTransfers": 1})
        self.c.wait_all(hs, timeout=30)
        self.assertLessEqual(set(self.k.take()), {"WaitTransfers"})  # none when the poll saw them all ended
        for h, (l, r) in zip(hs, self.moves):
            self.assertEqual(h.result.blocks, 3 * SEGMENTS)
            self.assertTrue(self.landed(l, r), h)

    def test_bad_request_gets_its_own_error(self):
        moves = list(self.moves[:8])
        items = [self.blocks(l, r) for l, r in moves]
        # Refused at start (the daemon checks a block transfer's ids when it
        # runs): a raw request goes as it is, its timeout over the daemon's
        # limit (b2b.Blocks would send that limit instead).
        items[5] = b2b.Blocks(self.src, self.peer_b, self.dst, *moves[5]).request()
        items[5].timeout_ms = 10_000_000_000
        moves[6] = (moves[6][0], [POOL + 7, 1, 2])  # an id out of range: fails when it runs
        items[6] = self.blocks(*moves[6])
        hs = self.c.start_many(items, timeout=30)
        self.assertEqual(self.k.take(), {"StartTransfers": 1})
        self.assertEqual(hs[5].id, 0)
        self.assertTrue(hs[5].failed)
        self.assertIsInstance(hs[5].error, b2b.InvalidArgumentError)
        self.assertIn("requests[5]: ", str(hs[5].error))
        self.assertIn("timeout_ms is 10000000000, over the limit of 3600000", str(hs[5].error))
        with self.assertRaises(b2b.InvalidArgumentError):
            hs[5].wait()
        self.c.wait_all(hs, timeout=30)
        self.assertEqual(sum(self.k.take().values()), 1)  # the refused one is not asked about
        self.assertIsInstance(hs[6].error, b2b.InvalidArgumentError)
        self.assertIn("remote_ids[0]", str(hs[6].error))
        for i, h in enumerate(hs):
            if i not in (5, 6):
                self.assertEqual(h.result.blocks, 3 * SEGMENTS)
                self.assertTrue(self.landed(*moves[i]))
        self.assertFalse(self.landed(*moves[5]))  # nothing of the refused ones moved
        self.assertFalse(self.landed(moves[6][0][1:], moves[6][1][1:]))

    def test_kv_many_and_wait_any(self):
        lay = b2b.kv.Layout.__new__(b2b.kv.Layout)  # a handle over the registered layout, as b2b.kv makes
        lay.client, lay.name, lay._closed = self.c, self.src, False
        hs = lay.transfer_blocks_many([(self.peer_b, self.dst, l, r) for l, r in self.moves[:16]], timeout=30)
        self.assertEqual(self.k.take(), {"StartTransfers": 1})
        first = self.c.wait_any(hs, timeout=30)
        self.assertGreaterEqual(len(first), 1)
        self.assertTrue(all(h.result is not None for h in first))
        self.assertLessEqual(sum(self.k.take().values()), 2)  # a poll, then at most one wait
        self.c.wait_all(hs, timeout=30)
        for h, (l, r) in zip(hs, self.moves):
            self.assertEqual(h.result.blocks, 3 * SEGMENTS)
            self.assertTrue(self.landed(l, r))


class ConnectorStepTest(unittest.TestCase):
    """A decode step loading 64 requests from two prefill engines: one
    StartTransfers for every read, one call in get_finished."""

    @classmethod
    def setUpClass(cls):
        cls.dp = daemon_harness.Daemon("prefill").start()
        cls.dd = daemon_harness.Daemon("decode").start()

    @classmethod
    def tearDownClass(cls):
        cls.dp.stop()
        cls.dd.stop()

    def test_step_round_trips(self):
        from test_connector import Side  # the connector tests' engine stand-in

        from b2b.connector.testing import Request

        tag = uuid.uuid4().hex[:8]
        ps = [Side(self.dp, f"pre{j}-{tag}", num_blocks=N) for j in range(2)]
        d = Side(self.dd, f"dec-{tag}", num_blocks=2 * N)
        for s in ps + [d]:
            self.addCleanup(s.close)
        d.pools[0].scribble(range(2 * N))
        cases = []
        for i in range(N):
            p = ps[i % 2]
            rid, pid, did, seed = f"r{i}", i // 2, i, 100 + i
            r = Request(rid, list(range(16)), {"do_remote_decode": True})
            p.sched.update_state_after_alloc(r, [pid], 0)
            p.step([(rid, [pid], seed, 16)])
            _, params = p.sched.request_finished(r, [pid])
            cases.append((rid, params, did, seed))
        for rid, params, did, _ in cases:
            r = Request(rid, list(range(16)), dict(params))
            got, _ = d.sched.get_num_new_matched_tokens(r, 0)
            d.sched.update_state_after_alloc(r, [did], got)
        w = d.workers[0]
        k = counted(w.worker.client)
        meta = d.sched.build_connector_meta(None)
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        calls = k.take()
        self.assertEqual(calls.get("StartTransfers"), 1, calls)  # both engines' reads
        self.assertNotIn("StartTransfer", calls)
        self.assertEqual(w.worker.stats["pull_starts"], 2)
        w.wait_for_save()
        recving: set = set()
        steps = 0
        while len(recving) < N and steps < 2000:
            _, r = w.get_finished(set())
            calls = k.take()
            self.assertEqual(sum(calls.values()), 1, calls)  # one round trip, 64 requests outstanding
            self.assertEqual(calls.get("PollTransfers"), 1, calls)
            recving |= r or set()
            steps += 1
        w.clear_connector_metadata()
        self.assertEqual(len(recving), N)
        self.assertEqual(w.get_block_ids_with_load_errors(), set())
        for rid, _, did, seed in cases:
            self.assertEqual(d.check([did], seed, 16), 0, rid)


if __name__ == "__main__":
    unittest.main()
