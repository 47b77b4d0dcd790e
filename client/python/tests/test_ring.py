"""The shared-memory submission ring from Python (b2b._ring, docs/ring.md),
against two real daemons, the source with a submit socket: submits,
handles and batches through the ring land every block (bytes and both
daemons' per-block checksums), refusals carry gRPC's code and message, the
client falls back to gRPC where there is no ring, and a client killed in
the middle of a post leaves the daemon serving others."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import unittest
import warnings
from unittest import mock

import grpc
import numpy as np
import test_prepared
import test_transfer
from daemon_harness import stop_process
from test_transfer import TwoDaemons, layout

import b2b
from b2b import _ring, _ring_client
from b2b._transfers import LazyOutcome
from b2b.v1 import b2b_pb2 as pb

SUBMIT_ARGS = ("--submit-socket", "{dir}/submit.sock")


class RingTest(TwoDaemons):
    a_args = SUBMIT_ARGS
    N, BS = 10_000, 128

    def setUp(self):
        super().setUp()
        self.so, src_size = layout(self.N, self.BS, self.rng)
        self.do, dst_size = layout(self.N, self.BS, self.rng)
        self.src = self.a.register_host(src_size)
        self.name = f"ring-{self._testMethodName}"
        self.dst = self.b.register_host(dst_size, self.name)
        self.addCleanup(self.dst.close)
        self.addCleanup(self.src.close)
        self.ring = self.a.ring
        self.assertIsNotNone(self.ring, self.a._ring.reason)

    def prepare(self, sl=slice(None), **kw):
        p = self.a.prepare(self.src, self.peer_b, self.name, self.so[sl], self.do[sl], block_size=self.BS, **kw)
        self.addCleanup(p.release)
        return p

    def posted(self) -> int:
        return self.ring._tag

    def test_found_beside_the_api_socket(self):
        self.assertEqual(self.ring.path, os.path.join(os.path.dirname(self.da.socket), "submit.sock"))
        self.assertEqual(self.ring.entries, (256, 256))
        self.ring.ping()
        self.assertIs(self.a.ring, self.ring)  # one ring per client

    def test_submit_lands_every_block(self):
        for timeout in (None, 30):  # without and with the caller's deadline in the record
            p = self.prepare(timeout=timeout)
            for round in range(2):
                self.random_fill(self.src)
                before = self.posted()
                r = p.submit()
                self.assertEqual(self.posted(), before + 1, "the submit did not go through the ring")
                self.assertEqual((r.blocks, r.bytes, r.transport), (self.N, self.N * self.BS, "tcp"), (timeout, round))
                # The daemon's figures, as gRPC's SubmitTransfer gives them
                # (a plan's work requests are counted as they are posted).
                self.assertEqual(r.segments, p.segments)
                self.assertGreaterEqual(r.work_requests, max(1, p.work_requests))
                self.assertGreater(r.phases.total_ns, 0)
                self.assertGreaterEqual(r.phases.total_ns, r.phases.wire_ns)
                self.assert_blocks_equal(self.src, self.so, self.dst, self.do, self.BS)

    def test_refusals_match_grpc(self):
        p = self.prepare()
        gone = p.handle
        p.release()
        cases = {
            "released plan": gone,
            "never prepared": 424242,
        }
        for what, handle in cases.items():
            with self.assertRaises(grpc.RpcError) as cm:
                self.a.stub.SubmitTransfer(pb.SubmitTransferRequest(handle=handle), timeout=10)
            want = b2b.from_rpc_error(cm.exception)
            # The ring's own record, and PreparedTransfer.submit through it.
            c = self.ring.wait(self.ring.start(handle))
            stale = object.__new__(b2b.PreparedTransfer)
            stale.handle, stale._released, stale._client, stale.timeout = handle, False, self.a, None
            before = self.posted()
            with self.assertRaises(b2b.B2BError) as cm2:
                stale.submit()
            self.assertEqual(self.posted(), before + 1, what)
            for got in (c.error(), cm2.exception):
                self.assertIs(type(got), type(want), what)
                self.assertIsInstance(got, b2b.NotFoundError, what)
                self.assertEqual((got.code, got.message), (want.code, want.message), what)
                self.assertIn(str(handle), got.message)

    def test_bad_records_refused_by_field(self):
        # Records the Python client never posts, hand-written: the daemon
        # refuses each in its completion, naming the field, and serves on.
        for op, w0, w2, code, msg in [
            (9, 0, 0, grpc.StatusCode.INVALID_ARGUMENT, "op 9 unknown"),
            (_ring.OP_SUBMIT, 0, 0, grpc.StatusCode.INVALID_ARGUMENT, "handle is 0"),
            (_ring.OP_SUBMIT, 5, _ring.MAX_TIMEOUT_MS + 1, grpc.StatusCode.INVALID_ARGUMENT, "timeout_ms 86400001: want 1 to 86400000"),
            (_ring.OP_CANCEL, 0, 0, grpc.StatusCode.INVALID_ARGUMENT, "target tag is 0"),
            (_ring.OP_CANCEL, 999999, 0, grpc.StatusCode.NOT_FOUND, "no submit or watch in flight under tag 999999"),
        ]:
            _ring._BODY_LEN.setdefault(9, 0)
            try:
                (t,) = self.ring._post([(op, w0, w2)])
            finally:
                _ring._BODY_LEN.pop(9, None)
            err = self.ring.wait(t).error()
            self.assertIsNotNone(err, msg)
            self.assertEqual(err.code, code, err)
            self.assertIn(msg, err.message)
        self.ring.ping()

    def test_handles_and_batches(self):
        q = self.N // 4
        plans = [self.prepare(slice(k * q, (k + 1) * q)) for k in range(3)]
        stale = self.prepare()
        gone = stale.handle
        stale.release()
        stale._released = False  # post it anyway: the daemon refuses it in its completion
        self.random_fill(self.src)
        before = self.posted()
        hs = self.a.start_submits(plans * 4 + [stale], timeout=60)
        stale._released = True  # released in the daemon already: its cleanup does nothing
        self.assertEqual(self.posted(), before + 13)
        for h in hs:
            self.assertIsInstance(h, b2b.Transfer)
        self.a.wait_all(hs, timeout=60)
        self.assertEqual(self.a.poll(hs), [True] * 13)
        for i, h in enumerate(hs[:12]):
            self.assertEqual(h.state, "done", h.error)
            self.assertEqual((h.result.blocks, h.result.bytes), (plans[i % 3].blocks, plans[i % 3].bytes))
        self.assertEqual(hs[12].state, "failed")
        self.assertIsInstance(hs[12].error, b2b.NotFoundError)
        self.assertIn(str(gone), hs[12].error.message)
        with self.assertRaises(b2b.NotFoundError):
            hs[12].wait()
        sl = slice(0, 3 * q)
        self.assert_blocks_equal(self.src, self.so[sl], self.dst, self.do[sl], self.BS)
        # One handle: start_submit, done() by poll, then wait.
        self.random_fill(self.src)
        h = self.a.start_submit(plans[0])
        while not h.done():
            time.sleep(0.001)
        self.assertEqual(h.wait().blocks, plans[0].blocks)
        self.assertFalse(h.cancel())  # it ended: nothing to cancel, the outcome stays
        self.assert_blocks_equal(self.src, self.so[:q], self.dst, self.do[:q], self.BS)

    def test_interrupted_submit_is_settled(self):
        # Ctrl-C during submits through the ring: the one in flight is
        # cancelled and waited for, nothing stays tracked, the ring serves on.
        import threading

        self.addCleanup(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))
        p = self.prepare()
        done = threading.Event()

        def interrupt():
            time.sleep(0.3)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            done.set()

        t = threading.Thread(target=interrupt)
        n = 0
        try:
            with self.assertRaises(KeyboardInterrupt):
                t.start()
                while True:
                    p.submit()
                    n += 1
        finally:
            done.wait(10)
            t.join()
        self.assertGreater(n, 0)
        self.assertEqual((self.ring._pending, self.ring._done), (set(), {}))
        self.assertIsNone(self.ring.dead)
        self.random_fill(self.src)
        self.assertEqual(p.submit().blocks, self.N)
        self.assert_blocks_equal(self.src, self.so, self.dst, self.do, self.BS)

    def test_interrupt_while_posting_is_settled(self):
        # SIGINT as the record is posted is held until the tag is in hand,
        # then strikes: that submit is cancelled and waited for too.
        self.addCleanup(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))
        p = self.prepare()
        real = self.ring.start_many

        def start_many(handles, timeout_ms=0):
            signal.raise_signal(signal.SIGINT)
            return real(handles, timeout_ms)

        for what, call in (("submit", p.submit), ("start_submits", lambda: self.a.start_submits([p, p]))):
            before = self.posted()
            with mock.patch.object(self.ring, "start_many", start_many):
                with self.assertRaises(KeyboardInterrupt, msg=what):
                    call()
            self.assertGreater(self.posted(), before, what)
            self.assertEqual((self.ring._pending, self.ring._done), (set(), {}), what)
        self.random_fill(self.src)
        self.assertEqual(p.submit().blocks, self.N)
        self.assert_blocks_equal(self.src, self.so, self.dst, self.do, self.BS)

    def test_threads_share_the_ring(self):
        import threading

        p = self.prepare()
        self.random_fill(self.src)
        errors, results = [], []

        def run():
            try:
                for _ in range(5):
                    results.append(p.submit().blocks)
                    self.ring.ping()
            except BaseException as e:  # pylint: disable=broad-except
                errors.append(e)

        ts = [threading.Thread(target=run) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        self.assertEqual(errors, [])
        self.assertEqual(results, [self.N] * 20)
        self.assert_blocks_equal(self.src, self.so, self.dst, self.do, self.BS)

    def test_killed_mid_post_leaves_the_daemon_serving(self):
        # A child that (a) wrote half a record and sleeps unpublished, or (b)
        # posts pings and submits of an unknown plan as fast as it can, is
        # killed with SIGKILL; the daemon keeps serving this client's ring,
        # a new ring and gRPC.
        child = (
            "import sys, time\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "from b2b import _ring\n"
            "r = _ring.Ring(sys.argv[2])\n"
            "if sys.argv[3] == 'half':\n"
            "    r._mm[r.sq.slot(r._sq_tail):r.sq.slot(r._sq_tail) + 20] = b'\\x07' * 20\n"
            "    print('ready', flush=True); time.sleep(60)\n"
            "print('ready', flush=True)\n"
            "while True:\n"
            "    r.start_many([77] * 8); r._post([(_ring.OP_PING, 0, 0)])\n"
        )
        pkg = os.path.dirname(os.path.dirname(b2b.__file__))
        for mode in ("half", "busy"):
            proc = subprocess.Popen([sys.executable, "-c", child, pkg, self.ring.path, mode], stdout=subprocess.PIPE)
            try:
                self.assertEqual(proc.stdout.readline().strip(), b"ready", mode)
                time.sleep(0.1)
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
                proc.stdout.close()
            self.assertEqual(proc.returncode, -signal.SIGKILL, mode)
            p = self.prepare()
            self.random_fill(self.src)
            before = self.posted()
            self.assertEqual(p.submit().blocks, self.N, mode)
            self.assertEqual(self.posted(), before + 1)
            self.assert_blocks_equal(self.src, self.so, self.dst, self.do, self.BS)
            with _ring.Ring(self.ring.path) as other:
                other.ping()
            self.a.ping()
        self.assertIsNone(self.ring.dead)


class FallbackTest(TwoDaemons):
    a_args = SUBMIT_ARGS

    def transfer_via(self, c: b2b.Client) -> None:
        """A prepared submit and an async one on c land their blocks."""
        rng = np.random.default_rng(3)
        offs = np.arange(0, 64 * 4096, 4096, dtype=np.uint64)
        with c.register_host(64 * 4096) as src, self.b.register_host(64 * 4096, "ring-fallback") as dst:
            for _ in range(2):
                src.array[:] = rng.integers(0, 256, src.size, dtype=np.uint8)
                with c.prepare(src, self.peer_b, "ring-fallback", offs, offs, block_size=4096) as p:
                    self.assertEqual(p.submit(timeout=30).blocks, 64)
                    self.assertEqual(bytes(dst.memoryview), bytes(src.memoryview))
                    src.array[:] = rng.integers(0, 256, src.size, dtype=np.uint8)
                    h = c.start_submit(p)
                    self.assertEqual(h.wait(30).blocks, 64)
                    self.assertEqual(bytes(dst.memoryview), bytes(src.memoryview))

    def test_ring_off_by_option_and_env(self):
        with b2b.Client(self.da.socket, ring=False) as c:
            self.assertIsNone(c.ring)
            self.transfer_via(c)
        with mock.patch.dict(os.environ, {"B2B_RING": "0"}):
            with b2b.Client(self.da.socket) as c:
                self.assertIsNone(c.ring)
                self.transfer_via(c)
        with b2b.Client(self.da.socket) as c:  # the default finds it
            self.assertIsNotNone(c.ring)
            self.transfer_via(c)

    def test_no_socket_refused_or_remote(self):
        with b2b.Client(self.db.socket) as c:  # no --submit-socket there
            self.assertIsNone(c.ring)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with b2b.Client(self.da.socket, ring=self.da.socket) as c:  # the API socket refuses the hello
                self.assertIsNone(c.ring)
                self.assertIn("ring at", c._ring.reason)
                self.transfer_via(c)
        self.assertTrue(any(issubclass(x.category, RuntimeWarning) for x in w), [str(x.message) for x in w])
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            with b2b.Client(self.da.socket, ring=str(self.da.dir / "no-such.sock")) as c:
                self.assertIsNone(c.ring)
                self.transfer_via(c)
        for addr in ("127.0.0.1:7470", "dns:///localhost:7470", "[::1]:7470"):
            self.assertIsNone(_ring_client.submit_socket_for(addr, str(self.da.dir / "submit.sock")), addr)
        self.assertEqual(_ring_client.submit_socket_for("unix://" + self.da.socket, None), str(self.da.dir / "submit.sock"))

    def test_daemon_drops_the_ring(self):
        # A ring whose socket closes under it answers UnavailableError, and
        # the client opens a new one for its next submit.
        with b2b.Client(self.da.socket) as c:
            r = c.ring
            r._sock.shutdown(2)
            deadline = time.monotonic() + 10
            while r.dead is None and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertIsInstance(r.dead, b2b.UnavailableError)
            with self.assertRaises(b2b.UnavailableError):
                r.ping()
            self.assertIsNot(c.ring, r)
            c.ring.ping()
            self.transfer_via(c)


    def test_close_ends_waits(self):
        # A waiter on a ring closed under it raises UnavailableError at once
        # (not after its nap); the client opens a new ring for its next call.
        import threading

        with b2b.Client(self.da.socket) as c:
            r = c.ring
            with r._cq_lock:
                r._pending.add(1 << 40)  # a tag no completion will come for
            got = []
            t = threading.Thread(target=lambda: got.append(self._raises(lambda: r.wait(1 << 40))))
            t.start()
            time.sleep(0.2)
            t0 = time.monotonic()
            r.close()
            r.close()  # twice is fine
            t.join(10)
            self.assertFalse(t.is_alive())
            self.assertLess(time.monotonic() - t0, 5)
            self.assertIsInstance(got[0], b2b.UnavailableError)
            with self.assertRaises(b2b.UnavailableError):
                r.ping()
            c.ring.ping()

    @staticmethod
    def _raises(fn):
        try:
            fn()
        except BaseException as e:  # pylint: disable=broad-except
            return e
        return None


class PreparedOverRingTest(test_prepared.PreparedTest):
    """Every prepared-transfer test again, the source daemon offering a ring
    (the client takes it on its own)."""

    a_args = SUBMIT_ARGS

    def setUp(self):
        super().setUp()
        self.assertIsNotNone(self.a.ring)
        self.posted_before = self.a.ring._tag

    def test_submit_lands_every_block(self):
        super().test_submit_lands_every_block()
        self.assertEqual(self.a.ring._tag, self.posted_before + 3)




class RingBlocksTest(TwoDaemons):
    """Block-id transfers through the ring (a BindBlockRoute route and an
    OpBlocks record): 1 block of a 64-segment layout, bytes and checksums
    checked; refusals carry TransferBlocks' code and message."""

    a_args = SUBMIT_ARGS
    SEGS, NB, BL = 64, 8, 256

    def setUp(self):
        super().setUp()
        size = self.SEGS * self.NB * self.BL
        self.src = self.a.register_host(size)
        n = self.n = f"rb-{self._testMethodName}"
        self.dst = self.b.register_host(size, n + "-r")
        self.addCleanup(self.dst.close)
        self.addCleanup(self.src.close)
        segs = lambda r: [(r, s * self.BL, self.BL, self.SEGS * self.BL) for s in range(self.SEGS)]  # noqa: E731
        self.a.register_layout(n + "-src", segs(self.src), self.NB)
        self.addCleanup(self.a.deregister_layout, n + "-src")
        self.b.register_layout(n + "-dst", segs(self.dst), self.NB, export_name=n + "-dst")
        self.addCleanup(self.b.deregister_layout, n + "-dst")
        self.ring = self.a.ring
        self.assertIsNotNone(self.ring, self.a._ring.reason)

    def offsets(self, block):
        return np.array([block * self.SEGS * self.BL + s * self.BL for s in range(self.SEGS)], np.uint64)

    def test_one_block_of_64_segments(self):
        for timeout in (None, 30):
            for sb, db in [(3, 5), (0, 7), (7, 0)]:
                self.random_fill(self.src)
                before = self.ring._tag
                ids = np.array([sb], np.int64) if db == 7 else [sb]  # numpy ids take the ring too
                t0 = time.time_ns()
                r = self.a.transfer_blocks(self.n + "-src", self.peer_b, self.n + "-dst", ids, [db], timeout=timeout)
                t1 = time.time_ns()
                self.assertEqual(self.ring._tag, before + 1, "the transfer did not go through the ring")
                self.assertEqual((r.blocks, r.bytes), (self.SEGS, self.SEGS * self.BL))
                self.assertGreater(r.phases.total_ns, 0)
                # The daemon's wall-clock times ride in the completion's tail.
                ph = r.phases
                self.assertTrue(t0 <= ph.posted_unix_ns <= ph.landed_unix_ns <= t1, (t0, ph, t1))
                self.assertEqual(ph.trigger_seen_unix_ns, 0)
                self.assert_blocks_equal(self.src, self.offsets(sb), self.dst, self.offsets(db), self.BL)
        # Four pairs still fit one record; five take the id arena.
        self.random_fill(self.src)
        before = self.ring._tag
        self.a.transfer_blocks(self.n + "-src", self.peer_b, self.n + "-dst", [0, 1, 2, 3], [4, 5, 6, 7])
        self.assertEqual(self.ring._tag, before + 1)
        self.a.transfer_blocks(self.n + "-src", self.peer_b, self.n + "-dst", [4, 5, 6, 7, 0], [0, 1, 2, 3, 4])
        self.assertEqual(self.ring._tag, before + 2)
        for sb, db in [(4, 0), (5, 1), (6, 2), (7, 3), (0, 4)]:
            self.assert_blocks_equal(self.src, self.offsets(sb), self.dst, self.offsets(db), self.BL)

    def test_outcome_made_when_asked(self):
        # A ring handle that ended well keeps its completion; the
        # TransferOutcome message is made only when asked for, and says
        # what the completion did.
        t0 = time.time_ns()
        h = self.a.transfer_blocks(self.n + "-src", self.peer_b, self.n + "-dst", [1], [2], wait=False)
        self.a.wait_all([h], timeout=30)
        self.assertIsInstance(h._outcome, LazyOutcome)
        self.assertEqual((h.state, h.failed, h.error), ("done", False, None))
        marks = h._marks()
        self.assertIsInstance(h._outcome, LazyOutcome, "the daemon's marks made the message")
        o = h.outcome
        self.assertIsInstance(o, pb.TransferOutcome)
        self.assertIs(h.outcome, o)
        self.assertEqual((o.transfer_id, o.state), (h.id, pb.TRANSFER_STATE_DONE))
        ph = o.result.phases
        self.assertEqual(marks, (ph.trigger_seen_unix_ns, ph.posted_unix_ns, ph.landed_unix_ns, ph.wire_ns))
        self.assertTrue(t0 <= ph.posted_unix_ns <= ph.landed_unix_ns, (t0, ph))
        self.assertEqual((h.result.blocks, h.result.bytes), (self.SEGS, self.SEGS * self.BL))
        self.assertEqual(h.wait().phases.landed_unix_ns, ph.landed_unix_ns)
        # Asked for its result first, a handle makes the message then.
        g = self.a.transfer_blocks(self.n + "-src", self.peer_b, self.n + "-dst", [3], [4], wait=False)
        self.assertEqual(g.wait(30).blocks, self.SEGS)
        self.assertEqual(g.outcome.result.blocks, self.SEGS)
        # A refused one carries its failure at once, and no marks.
        f = self.a.transfer_blocks(self.n + "-src", self.peer_b, self.n + "-dst", [1], [self.NB + 3], wait=False)
        with self.assertRaises(b2b.InvalidArgumentError):
            f.wait(30)
        self.assertIsInstance(f.outcome, pb.TransferOutcome)
        self.assertIsNone(f._marks())

    def test_refusals_match_grpc(self):
        for what, lids, rids in [("local id out of range", [self.NB], [0]), ("remote id out of range", [1], [self.NB + 3]),
                                 ("remote id twice", [1, 2], [3, 3])]:
            with self.assertRaises(grpc.RpcError) as cm:
                self.a.stub.TransferBlocks(pb.TransferBlocksRequest(
                    local_layout=self.n + "-src", peer=self.peer_b, remote_layout=self.n + "-dst",
                    local_ids=np.array(lids, "<u4").tobytes(), remote_ids=np.array(rids, "<u4").tobytes()), timeout=10)
            want = b2b.from_rpc_error(cm.exception)
            before = self.ring._tag
            with self.assertRaises(b2b.B2BError) as cm2:
                self.a.transfer_blocks(self.n + "-src", self.peer_b, self.n + "-dst", lids, rids)
            self.assertEqual(self.ring._tag, before + 1, what)
            got = cm2.exception
            self.assertIs(type(got), type(want), what)
            self.assertEqual((got.code, got.message), (want.code, want.message), what)
        # A hand-written record on a route that is not bound.
        t = self.ring.start_blocks(424242, [0], [0])
        err = self.ring.wait(t).error()
        self.assertIsInstance(err, b2b.NotFoundError)
        self.assertIn("block route 424242", err.message)
        # Records the client never posts: refused by field, and the ring serves on.
        for route, ms, pairs, msg in [(5, 0, [], "length 16 for op blocks"), (0, 0, [1, 2], "route handle is 0"),
                                      (5, _ring.MAX_TIMEOUT_MS + 1, [1, 2], "timeout_ms 86400001")]:
            (t,) = self.ring._post([(_ring.OP_BLOCKS, route, ms, pairs)])
            err = self.ring.wait(t).error()
            self.assertIsInstance(err, b2b.InvalidArgumentError, msg)
            self.assertIn(msg, err.message)
        self.ring.ping()

    def test_route_rebound_and_evicted(self):
        src, dst = self.n + "-src", self.n + "-dst"
        key = (src, self.peer_b, dst, 0, 0)  # the daemon's transport, a write
        self.a.transfer_blocks(src, self.peer_b, dst, [1], [2])
        h = self.a._ring.routes[key]
        # Freed behind the client's back (as a reconnect frees it): the next
        # transfer is refused NotFound, binds again, and goes through the ring.
        self.a.stub.ReleaseBlockRoute(pb.ReleaseBlockRouteRequest(handle=h), timeout=10)
        self.random_fill(self.src)
        before = self.ring._tag
        self.a.transfer_blocks(src, self.peer_b, dst, [1], [2])
        self.assertEqual(self.ring._tag, before + 2)
        h2 = self.a._ring.routes[key]
        self.assertNotEqual(h2, h)
        self.assert_blocks_equal(self.src, self.offsets(1), self.dst, self.offsets(2), self.BL)
        # Past the cache's bound the oldest route is released.
        with mock.patch.object(_ring_client, "MAX_ROUTES", 1):
            for k, transport in enumerate(["tcp", None, "tcp"]):
                self.random_fill(self.src)
                self.a.transfer_blocks(src, self.peer_b, dst, [k], [3], transport=transport)
                self.assertEqual(len(self.a._ring.routes), 1)
                self.assert_blocks_equal(self.src, self.offsets(k), self.dst, self.offsets(3), self.BL)
        with self.assertRaises(grpc.RpcError) as cm:
            self.a.stub.ReleaseBlockRoute(pb.ReleaseBlockRouteRequest(handle=h2), timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)


class RingResultTest(unittest.TestCase):
    """The ring's results are built past the dataclasses' __init__: they
    must be indistinguishable from results built through it."""

    def test_result_takes_the_daemons_figures(self):
        c = _ring.Completion(7, 0, "tcp", 3, 384, 1500, 9000, (11, 22, 33), (64, 2, 5, 6, 7, 8, 9, 10))
        got = _ring_client._result(2, c, segments=5, work_requests=1)
        self.assertEqual((got.segments, got.work_requests), (64, 2))
        self.assertEqual((got.phases.validate_ns, got.phases.resolve_ns, got.phases.plan_ns, got.phases.post_ns,
                          got.phases.notify_ns, got.phases.armed_ns), (5, 6, 7, 8, 9, 10))
        self.assertEqual(got, b2b.TransferResult(3, 384, "tcp", 1.5e-6, 64, 2, b2b.PhaseTimings(
            validate_ns=5, resolve_ns=6, plan_ns=7, post_ns=8, wire_ns=1500, notify_ns=9, total_ns=9000, armed_ns=10,
            trigger_seen_unix_ns=11, posted_unix_ns=22, landed_unix_ns=33)))

    def test_result_equals_constructed(self):
        c = _ring.Completion(7, 0, "", 3, 384, 1500, 9000, (11, 22, 33))
        got = _ring_client._result(2, c, segments=5, work_requests=1)
        want = b2b.TransferResult(3, 384, got.transport, 1.5e-6, 5, 1, b2b.PhaseTimings(
            wire_ns=1500, total_ns=9000, trigger_seen_unix_ns=11, posted_unix_ns=22, landed_unix_ns=33))
        self.assertEqual(got, want)
        self.assertEqual(hash(got.phases), hash(want.phases))
        self.assertEqual(repr(got), repr(want))
        self.assertEqual(got.phases.as_dict(), want.phases.as_dict())
        self.assertEqual(got.elapsed_ns, 1500)
        self.assertEqual(got.phases.decode_ns, 0)  # a field not set reads its default
        with self.assertRaises(AttributeError):  # still frozen
            got.blocks = 4


class TransferOverRingTest(test_transfer.TransferTest):
    """Every batch_transfer test again, the source daemon offering a ring:
    ad hoc batches go as batch records (the client takes the ring on its
    own), and land and answer as over gRPC."""

    a_args = SUBMIT_ARGS

    def setUp(self):
        super().setUp()
        self.assertIsNotNone(self.a.ring, self.a._ring.reason)
        self.posted_before = self.a.ring._tag

    def test_10k_uniform_blocks_verified(self):
        super().test_10k_uniform_blocks_verified()
        self.assertEqual(self.a.ring._tag, self.posted_before + 1, "the batch did not go through the ring")

    def test_result_figures_as_grpc(self):
        """Over the ring a batch's result carries the figures gRPC gives
        (segments, work requests, the phases but decode: nothing to
        unmarshal), not zeros."""
        with self.a.register_host(1 << 20) as src, self.b.register_host(1 << 20, "rfig-dst") as dst:
            offs = np.arange(64, dtype=np.uint64) * 8192  # gapped: 64 segments
            r = self.a.batch_transfer(src, self.peer_b, dst.export_name, offs, offs, block_size=4096)
            self.assertEqual(self.a.ring._tag, self.posted_before + 1, "the batch did not go through the ring")
            self.assertEqual(r.segments, 64)
            self.assertGreaterEqual(r.work_requests, 1)
            self.assertGreater(r.phases.validate_ns, 0)
            self.assertGreater(r.phases.resolve_ns, 0)
            self.assertGreater(r.phases.wire_ns, 0)


class RingBatchRefusalTest(TwoDaemons):
    """A refused batch record carries BatchTransfer's code and message; a
    batch too large for the arena goes over gRPC."""

    a_args = SUBMIT_ARGS

    def test_refusals_match_grpc(self):
        ring = self.a.ring
        self.assertIsNotNone(ring, self.a._ring.reason)
        with self.a.register_host(1 << 20) as src, self.b.register_host(1 << 20, "rbr-dst") as dst:
            ok = dict(src_offsets=np.array([0, 4096], np.uint64), dst_offsets=np.array([0, 4096], np.uint64), block_size=4096)
            cases = [
                ("overlapping destinations", dict(ok, dst_offsets=np.array([0, 100], np.uint64))),
                ("block past the source", dict(ok, src_offsets=np.array([0, 1 << 20], np.uint64))),
                ("pull of an export without readers", dict(ok, op="read")),
                ("unknown export", dict(ok, dst_region="absent")),
            ]
            for what, kw in cases:
                kw = dict(kw)
                name = kw.pop("dst_region", "rbr-dst")
                req = self.a._batch_request(src, self.peer_b, name, kw["src_offsets"], kw["dst_offsets"], None, kw["block_size"],
                                            None, None, None, "batch_transfer", kw.get("op"))
                with self.assertRaises(grpc.RpcError) as cm:
                    self.a.stub.BatchTransfer(req, timeout=10)
                want = b2b.from_rpc_error(cm.exception)
                before = ring._tag
                with self.assertRaises(b2b.B2BError) as got:
                    self.a.batch_transfer(src, self.peer_b, name, **kw)
                self.assertEqual(ring._tag, before + 1, f"{what}: not through the ring")
                self.assertIs(type(got.exception), type(want), what)
                self.assertEqual((got.exception.code, got.exception.message), (want.code, want.message), what)
            self.assertFalse(dst.array.any())
            # 100,000 descriptors (1.6 MB of blob) over the 1 MiB arena: gRPC.
            n = 100_000
            self.random_fill(src)
            offs = np.arange(n, dtype=np.uint64) * 8
            before = ring._tag
            r = self.a.batch_transfer(src, self.peer_b, "rbr-dst", offs, offs, block_size=8)
            self.assertEqual((r.blocks, ring._tag, r.transport), (n, before, "tcp"))
            np.testing.assert_array_equal(dst.array[: n * 8], src.array[: n * 8])


if __name__ == "__main__":
    unittest.main()


class RingStoppedDaemonTest(TwoDaemons):
    """The client's own daemon stopped (SIGSTOP) under calls that take the
    ring: each ends DEADLINE_GRACE past the caller's deadline with
    DeadlineExceededError, as a gRPC transfer call does; before, the ring
    waited for ever (plan.submit, batch_transfer, transfer_blocks and
    notify_region with timeout=2 were still blocked 25 s later)."""

    a_args = SUBMIT_ARGS
    GRACE = 0.5  # DEADLINE_GRACE, shortened for the test

    def test_calls_end_past_the_deadline(self):
        bs, n = 4096, 8
        name = f"stopped-{os.getpid()}"
        dst = self.b.register_host(bs * n, name)
        self.addCleanup(dst.close)
        self.b.register_layout(name + "L", [(dst, 0, bs, bs)], n, export_name=name + "L")
        self.addCleanup(self.b.deregister_layout, name + "L")
        src = self.a.register_host(bs * n)
        self.addCleanup(src.close)
        self.a.register_layout(name + "l", [(src, 0, bs, bs)], n)
        self.addCleanup(self.a.deregister_layout, name + "l")
        note = self.a.register_host(4096)
        self.addCleanup(note.close)
        plan = self.a.prepare(src, self.peer_b, name, [0], [0], block_size=bs)
        self.addCleanup(plan.release)
        ring = self.a.ring
        self.assertIsNotNone(ring)
        plan.submit(timeout=10)  # over the ring, routes bound, all warm
        self.a.transfer_blocks(name + "l", self.peer_b, name + "L", [1], [1], timeout=10)
        self.a.batch_transfer(src, self.peer_b, name, [0], [0], block_size=bs, timeout=10)
        self.a.notify_region(note, b"warm", timeout=10)
        calls = {
            "submit": lambda t: plan.submit(timeout=t),
            "batch_transfer": lambda t: self.a.batch_transfer(src, self.peer_b, name, [0], [0], block_size=bs, timeout=t),
            "transfer_blocks": lambda t: self.a.transfer_blocks(name + "l", self.peer_b, name + "L", [1], [1], timeout=t),
            "notify_region": lambda t: self.a.notify_region(note, b"x", timeout=t),
        }
        timeout = 0.3
        pid = self.da.proc.pid
        with mock.patch.object(_ring_client, "DEADLINE_GRACE", self.GRACE):
            try:
                stop_process(pid)
                for what, call in calls.items():
                    with self.subTest(what):
                        before = ring._tag
                        t0 = time.monotonic()
                        with self.assertRaises(b2b.DeadlineExceededError) as cm:
                            call(timeout)
                        took = time.monotonic() - t0
                        self.assertGreater(ring._tag, before, f"{what} did not go through the ring")
                        self.assertLess(took, timeout + self.GRACE + 2.0, f"{what} took {took:.1f} s: {cm.exception}")
                # An interrupt (Ctrl-C) of a ring call without a deadline
                # cancels the record through the ring and waits for it at
                # most the grace twice (the cancel, then the record): it
                # used to wait for ever for the stopped daemon to take the
                # cancel.
                with self.subTest("interrupted"):
                    import _thread
                    import threading

                    self.addCleanup(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))
                    before = ring._tag
                    timer = threading.Timer(0.3, _thread.interrupt_main)
                    timer.start()
                    t0 = time.monotonic()
                    with self.assertRaises(KeyboardInterrupt):
                        plan.submit()  # the plan has no timeout: no deadline in the record
                    took = time.monotonic() - t0
                    timer.join()
                    self.assertGreater(ring._tag, before, "the call did not go through the ring")
                    self.assertLess(took, 0.3 + 2 * self.GRACE + 2.0, f"the interrupted call took {took:.1f} s")
            finally:
                os.kill(pid, signal.SIGCONT)
        # The daemon goes on, and so does the ring; the records given up
        # were cancelled, and let go of their regions.
        self.assertEqual(plan.submit(timeout=10).blocks, 1)
        end = time.monotonic() + 10
        while self.a.status().transfers_in_flight and time.monotonic() < end:
            time.sleep(0.01)
