"""Argument checks that need no daemon: every ``timeout=`` of the API goes
through one check (b2b.errors.check_timeout), and register_layout checks
its numbers as register_host does. A client of a socket nobody serves shows
that a refusal came from the check: a call that got past it would be
UNAVAILABLE instead (or, with a deadline gRPC cannot take, DEADLINE_EXCEEDED
at once)."""

from __future__ import annotations

import os
import tempfile
import threading
import time
import unittest
from concurrent import futures
from fractions import Fraction

import daemon_harness  # noqa: F401  (puts the source tree's b2b on sys.path)

import grpc
import numpy as np

import b2b
from b2b import errors
from b2b.v1 import b2b_pb2 as pb

NAN, INF = float("nan"), float("inf")
PEER = "127.0.0.1:1"


def dead_client(**kw) -> b2b.Client:
    """A client of a Unix socket path where no daemon listens."""
    d = tempfile.mkdtemp(prefix="b2b-dead-")
    return b2b.Client(os.path.join(d, "nobody.sock"), ring=False, **kw)


class CheckTimeoutTest(unittest.TestCase):
    def test_table(self):
        big = errors.MAX_TIMEOUT
        # value, want (call), want (wait); an exception class: refused.
        bad = b2b.InvalidArgumentError
        cases = [
            (None, None, None),
            (1, 1, 1),
            (0.25, 0.25, 0.25),
            (np.float32(0.5), 0.5, 0.5),
            (np.int64(3), 3.0, 3.0),
            (Fraction(1, 4), 0.25, 0.25),
            (0, bad, 0),
            (0.0, bad, 0.0),
            (-1, bad, bad),
            (-0.001, bad, bad),
            (-INF, bad, bad),
            (NAN, bad, bad),
            (np.float64("nan"), bad, bad),
            (True, bad, bad),
            (False, bad, bad),
            (np.bool_(True), bad, bad),
            ("5", bad, bad),
            (b"5", bad, bad),
            ([5], bad, bad),
            (1e8, 1e8, 1e8),
            (1e9, big, big),  # capped: gRPC takes 1e9 s, but not 1e10 s
            (1e10, big, big),
            (10 ** 400, big, None),  # past float's range: inf
            (INF, big, None),  # inf: no limit (a wait's None; elsewhere the longest deadline)
        ]
        for value, want_call, want_wait in cases:
            for wait, want in ((False, want_call), (True, want_wait)):
                with self.subTest(value=value, wait=wait):
                    if want is bad:
                        with self.assertRaises(b2b.InvalidArgumentError) as cm:
                            errors.check_timeout(value, wait=wait)
                        msg = cm.exception.message
                        self.assertTrue(msg.startswith(f"timeout {value!r}"), msg)  # the field and the value
                        self.assertIn(">= 0" if wait else "> 0", msg)  # the rule
                        self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                    else:
                        got = errors.check_timeout(value, wait=wait)
                        self.assertEqual(got, want)
                        if got is not None:
                            self.assertLessEqual(got, big)

    def test_name_and_wait_rule(self):
        with self.assertRaisesRegex(b2b.InvalidArgumentError, r"Blocks\.timeout nan: want seconds > 0"):
            errors.check_timeout(NAN, "Blocks.timeout")
        with self.assertRaisesRegex(b2b.InvalidArgumentError, r"timeout -1: want seconds >= 0 .*0: do not wait"):
            errors.check_timeout(-1, wait=True)
        with self.assertRaisesRegex(b2b.InvalidArgumentError, r"timeout 'x' is a str"):
            errors.check_timeout("x")

    def test_timeout_ms(self):
        cases = [
            (None, 0),
            (0, 1),  # a wait of 0: the shortest the daemon takes (0 would be none)
            (0.0001, 1),  # rounded up
            (0.25, 250),
            (3600, 3_600_000),
            (3600.001, 3_600_000),  # the daemon's limit of timeout_ms (1 h)
            (errors.MAX_TIMEOUT, errors.MAX_FIELD_TIMEOUT_MS),
        ]
        for t, want in cases:
            with self.subTest(timeout=t):
                self.assertEqual(errors.timeout_ms(t), want)
        self.assertEqual(errors.timeout_ms(86400.5, 86_400_000), 86_400_000)

    def test_transfer_deadline(self):
        from b2b.errors import DEADLINE_GRACE, TIMEOUT_KEY, transfer_deadline

        cases = [
            (None, None, None),
            (0.0001, 0.0001 + DEADLINE_GRACE, "1"),
            (86400.0, 86400.0 + DEADLINE_GRACE, "86400000"),
            (86400.01, 86400.01, None),  # over the metadata's limit: the call's own deadline
            (1e10, errors.MAX_TIMEOUT, None),
            (INF, errors.MAX_TIMEOUT, None),
        ]
        for timeout, want_rpc, want_ms in cases:
            with self.subTest(timeout=timeout):
                rpc, md = transfer_deadline(timeout)
                self.assertEqual(rpc, want_rpc)
                self.assertEqual(md, None if want_ms is None else ((TIMEOUT_KEY, want_ms),))
        for bad in (0, -1, NAN, True, "1"):
            with self.subTest(timeout=bad), self.assertRaises(b2b.InvalidArgumentError):
                transfer_deadline(bad)


class EveryTimeoutTest(unittest.TestCase):
    """Each ``timeout=`` of the API refuses what the check refuses, before
    any call; and a huge one reaches gRPC as a deadline it takes."""

    @classmethod
    def setUpClass(cls):
        cls.c = dead_client(timeout=5)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def calls(self):
        c = self.c
        plan = b2b.PreparedTransfer(c, pb.PrepareTransferResponse(handle=1), None)
        offs = dict(src_offsets=[0], dst_offsets=[0], block_size=64)

        def stream(t):
            s = c.submit_stream(timeout=t)
            try:
                next(s)  # the call starts here
            finally:
                s.close()

        return {
            "Client": lambda t: dead_client(timeout=t).close(),
            "batch_transfer": lambda t: c.batch_transfer("r1", PEER, "dst", **offs, timeout=t),
            "start_transfer": lambda t: c.start_transfer("r1", PEER, "dst", **offs, timeout=t),
            "warm": lambda t: c.warm("r1", PEER, "dst", timeout=t),
            "transfer_blocks": lambda t: c.transfer_blocks("l", PEER, "r", [0], [0], timeout=t),
            "transfer_blocks(wait=False)": lambda t: c.transfer_blocks("l", PEER, "r", [0], [0], timeout=t, wait=False),
            "prepare": lambda t: c.prepare("r1", PEER, "dst", **offs, timeout=t),
            "PreparedTransfer": lambda t: b2b.PreparedTransfer(c, pb.PrepareTransferResponse(handle=1), t),
            "submit": lambda t: plan.submit(timeout=t),
            "start_submit": lambda t: c.start_submit(plan, timeout=t),
            "start_submits": lambda t: c.start_submits([plan], timeout=t),
            "submit_stream": stream,
            "start_many": lambda t: c.start_many([b2b.Blocks("l", PEER, "r", [0], [0])], timeout=t),
            "Blocks": lambda t: b2b.Blocks("l", PEER, "r", [0], [0], timeout=t),
            "ping": lambda t: c.ping(timeout=t),
            "wait_ready": lambda t: c.wait_ready(timeout=t),
            "checksum": lambda t: c.checksum("r1", [0], block_size=64, timeout=t),
            "notify_region": lambda t: c.notify_region("r1", b"x", timeout=t),
            "watch": lambda t: c.watch("r1", timeout=t),
            "register_layout": lambda t: c.register_layout("l", [("r1", 0, 64, 64)], 1, timeout=t),
            "deregister_layout": lambda t: c.deregister_layout("l", timeout=t),
            "kv.start_blocks": lambda t: b2b.kv.start_blocks(c, pb.TransferBlocksRequest(), t, None),
            "stream.transfer_blocks": lambda t: b2b.stream.transfer_blocks(c, "l", PEER, "r", [0], [0], timeout=t),
        }

    def waits(self):
        c = self.c
        return {
            "Transfer.wait": lambda t: b2b.Transfer(c, 1).wait(timeout=t),
            "wait_all": lambda t: c.wait_all([b2b.Transfer(c, 1)], timeout=t),
            "wait_any": lambda t: c.wait_any([b2b.Transfer(c, 1)], timeout=t),
        }

    def test_bad_values_are_refused_naming_timeout(self):
        for calls, bads in ((self.calls(), (0, -1, NAN, -INF, True, "5")), (self.waits(), (-1, NAN, -INF, True, "5"))):
            for name, call in calls.items():
                for v in bads:
                    with self.subTest(call=name, timeout=v):
                        with self.assertRaises(b2b.InvalidArgumentError) as cm:
                            call(v)
                        self.assertIn(f"timeout {v!r}", cm.exception.message)

    def test_huge_values_reach_the_call(self):
        # Past the check, the call fails as any call to a socket nobody
        # serves: UNAVAILABLE, not a deadline gRPC took as already past.
        skip = {"Blocks", "PreparedTransfer", "Client",  # make no call
                "wait_ready"}  # waits for the daemon until the deadline
        for name, call in {**self.calls(), **self.waits()}.items():
            for v in (1e10, 1e9, INF):
                with self.subTest(call=name, timeout=v):
                    if name in skip:
                        if name != "wait_ready":
                            call(v)
                        continue
                    t0 = time.monotonic()
                    with self.assertRaises(b2b.B2BError) as cm:
                        r = call(v)
                        if name == "watch":
                            next(iter(r))
                    self.assertIsInstance(cm.exception, b2b.UnavailableError, f"{name}: {cm.exception}")
                    self.assertLess(time.monotonic() - t0, 5)

    def test_client_timeout(self):
        self.assertIsNone(dead_client(timeout=None).timeout)
        self.assertEqual(dead_client(timeout=INF).timeout, errors.MAX_TIMEOUT)
        self.assertEqual(dead_client(timeout=1e10).timeout, errors.MAX_TIMEOUT)
        self.assertEqual(dead_client(timeout=2).timeout, 2)


class _RecordingDaemon:
    """Answers StartTransfer (id 1), WaitTransfer (RUNNING the first
    ``running`` times, then DONE) and BatchTransfer, recording each
    request's timeout_ms (or metadata) and the call's time left."""

    def __init__(self, running: int = 0):
        self.running = running
        self.seen = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))

        def h(fn, req, resp):
            return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString)

        handlers = {
            "StartTransfer": h(self._start, pb.StartTransferRequest, pb.StartTransferResponse),
            "WaitTransfer": h(self._wait, pb.WaitTransferRequest, pb.TransferOutcome),
            "BatchTransfer": h(self._batch, pb.BatchTransferRequest, pb.BatchTransferResponse),
        }
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("b2b.v1.B2B", handlers),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _note(self, method, ms, context):
        with self.lock:
            self.seen.append((method, ms, context.time_remaining()))

    def _start(self, req, context):
        self._note("StartTransfer", req.timeout_ms, context)
        return pb.StartTransferResponse(transfer_id=1)

    def _wait(self, req, context):
        self._note("WaitTransfer", req.timeout_ms, context)
        with self.lock:
            self.running -= 1
            if self.running >= 0:
                return pb.TransferOutcome(transfer_id=1, state=pb.TRANSFER_STATE_RUNNING)
        return pb.TransferOutcome(transfer_id=1, state=pb.TRANSFER_STATE_DONE, result=pb.BatchTransferResponse(blocks=3))

    def _batch(self, req, context):
        self._note("BatchTransfer", dict(context.invocation_metadata()).get(errors.TIMEOUT_KEY), context)
        return pb.BatchTransferResponse(blocks=1)

    def close(self):
        self.server.stop(None)


class DaemonLimitsTest(unittest.TestCase):
    """What a timeout becomes on the wire: timeout_ms at most the daemon's
    limit, a gRPC deadline at most MAX_TIMEOUT."""

    def fake(self, running=0):
        d = _RecordingDaemon(running)
        self.addCleanup(d.close)
        c = b2b.Client(f"127.0.0.1:{d.port}", timeout=10)
        self.addCleanup(c.close)
        return d, c

    def test_start_is_capped_at_the_daemons_limit(self):
        d, c = self.fake()
        for t, want in ((2.5, 2500), (7200, errors.MAX_FIELD_TIMEOUT_MS), (1e10, errors.MAX_FIELD_TIMEOUT_MS), (INF, errors.MAX_FIELD_TIMEOUT_MS), (None, 0)):
            with self.subTest(timeout=t):
                c.start_transfer("r1", PEER, "dst", [0], [0], block_size=64, timeout=t)
                self.assertEqual(d.seen[-1][:2], ("StartTransfer", want))

    def test_batch_deadline(self):
        d, c = self.fake()
        for t, want_ms, want_left in ((3600, "3600000", 3600 + errors.DEADLINE_GRACE), (1e10, None, errors.MAX_TIMEOUT), (INF, None, errors.MAX_TIMEOUT)):
            with self.subTest(timeout=t):
                c.batch_transfer("r1", PEER, "dst", [0], [0], block_size=64, timeout=t)
                method, ms, left = d.seen[-1]
                self.assertEqual(ms, want_ms)
                self.assertAlmostEqual(left, want_left, delta=want_left * 0.05)  # gRPC sends whole hours

    def test_long_wait_takes_more_calls(self):
        # 2 h: more than one WaitTransfer may ask (1 h); RUNNING at the
        # first answer is not the end of the caller's wait.
        d, c = self.fake(running=1)
        h = c.start_transfer("r1", PEER, "dst", [0], [0], block_size=64)
        self.assertEqual(h.wait(timeout=7200).blocks, 3)
        waits = [s for s in d.seen if s[0] == "WaitTransfer"]
        self.assertEqual(len(waits), 2)
        self.assertEqual(waits[0][1], errors.MAX_FIELD_TIMEOUT_MS)
        self.assertLess(waits[0][2], 3600 + 120)  # its call ends with it (plus a margin), not after 2 h

    def test_short_wait_that_runs_out(self):
        d, c = self.fake(running=5)
        h = c.start_transfer("r1", PEER, "dst", [0], [0], block_size=64)
        with self.assertRaises(b2b.WaitTimeoutError):
            h.wait(timeout=0.05)
        waits = [s[1] for s in d.seen if s[0] == "WaitTransfer"]
        self.assertEqual(len(waits), 1)  # one call: its timeout is what is left of the caller's
        self.assertTrue(1 <= waits[0] <= 50, waits)


class LayoutArgsTest(unittest.TestCase):
    """register_layout checks its numbers and segments as register_host
    checks size, naming the field and the value."""

    def test_table(self):
        c = dead_client()
        self.addCleanup(c.close)
        seg = ("r1", 0, 4096, 4096)
        bad = b2b.InvalidArgumentError
        cases = [
            # segments, num_blocks, error class, words in the message
            ([seg], -1, bad, "num_blocks -1 is not a uint64"),
            ([seg], 1 << 64, bad, f"num_blocks {1 << 64} is not a uint64: want 0 to {(1 << 64) - 1}"),
            ([("r1", -4096, 4096, 4096)], 4, bad, "segments[0].offset -4096 is not a uint64"),
            ([seg, ("r1", 0, -1, 4096)], 4, bad, "segments[1].block_len -1"),
            ([("r1", 0, 4096, 1 << 64)], 1, bad, f"segments[0].stride {1 << 64}"),
            ([seg, ("r1", 0, 4096)], 4, bad, "segments[1] ('r1', 0, 4096): want a 4-tuple"),
            ([("r1", 0, 4096, 4096, 5)], 4, bad, "segments[0] ('r1', 0, 4096, 4096, 5): want a 4-tuple"),
            (["r1"], 4, bad, "segments[0] 'r1': want a 4-tuple"),
            ([seg], "4", TypeError, "num_blocks must be an int, got str"),
            ([("r1", 0.5, 4096, 4096)], 4, TypeError, "segments[0].offset must be an int, got float"),
            ([("r1", True, 4096, 4096)], 4, TypeError, "segments[0].offset must be an int, got bool"),
            ([(None, 0, 4096, 4096)], 4, TypeError, "segments[0].region"),
        ]
        for segments, n, err, words in cases:
            with self.subTest(segments=segments, num_blocks=n):
                with self.assertRaises(err) as cm:
                    c.register_layout("l", segments, n)
                self.assertIn(words, str(cm.exception))
        # In range (numpy ints and lists too): past the checks, to the call.
        for segments, n in (([seg], 4), ([["r1", np.uint64(0), np.int32(64), 64]], np.int64(2)), ([("r1", 0, 1, (1 << 64) - 1)], 0)):
            with self.subTest(segments=segments), self.assertRaises(b2b.UnavailableError):
                c.register_layout("l", segments, n)


if __name__ == "__main__":
    unittest.main()
