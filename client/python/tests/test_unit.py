"""Unit tests that need no daemon: packing, local validation, error mapping."""

from __future__ import annotations

import array
import pickle
import time
import unittest

import daemon_harness  # noqa: F401  (puts the source tree's b2b on sys.path)

import grpc
import numpy as np

import b2b
from b2b import _pack
from b2b.errors import from_rpc_error
from b2b.v1 import b2b_pb2 as pb


class PackTest(unittest.TestCase):
    def test_types_pack_identically(self):
        rng = np.random.default_rng(11)
        ref = rng.integers(0, 1 << 40, 1000, dtype=np.uint64)
        want = b"".join(int(v).to_bytes(8, "little") for v in ref)  # independent reference encoding
        for values in (
            ref,
            ref.astype(">u8"),  # big-endian input is byte-swapped
            ref.astype(np.int64),
            ref.tolist(),
            tuple(ref.tolist()),
            array.array("Q", ref.tolist()),
            ref[::-1].copy()[::-1],  # negative-stride view
        ):
            with self.subTest(type=type(values).__name__, dtype=getattr(values, "dtype", None)):
                data, n = _pack.pack_u64(values, "x")
                self.assertEqual(n, 1000)
                self.assertEqual(data, want)
        small = np.arange(5, dtype=np.uint32)
        self.assertEqual(_pack.pack_u64(small, "x")[0], b"".join(i.to_bytes(8, "little") for i in range(5)))

    def test_full_uint64_range(self):
        v = np.array([0, 1, (1 << 64) - 1], dtype=np.uint64)
        data, _ = _pack.pack_u64(v, "x")
        self.assertEqual(data[-8:], b"\xff" * 8)
        np.testing.assert_array_equal(_pack.unpack_u64(data), v)

    def test_uint64_array_is_not_converted(self):
        v = np.arange(10, dtype="<u8")
        self.assertIs(_pack.as_u64(v, "x"), v)

    def test_rejects(self):
        with self.assertRaisesRegex(b2b.InvalidArgumentError, r"x\[2\] = -5 is negative"):
            _pack.pack_u64(np.array([1, 2, -5, 4]), "x")
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "1-D"):
            _pack.pack_u64(np.zeros((2, 3), dtype=np.uint64), "x")
        with self.assertRaises(TypeError):
            _pack.pack_u64(np.array([1.0, 2.0]), "x")
        with self.assertRaises(TypeError):
            _pack.pack_u64(b"\x00" * 8, "x")
        with self.assertRaises(TypeError):
            _pack.pack_u64(["a", "b"], "x")
        self.assertEqual(_pack.pack_u64([], "x"), (b"", 0))

    def test_descriptors_local_checks(self):
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "dst_offsets has 2 entries, src_offsets has 3"):
            b2b.Descriptors([0, 1, 2], [0, 1], block_size=1)
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "lengths has 1 entries, src_offsets has 2"):
            b2b.Descriptors([0, 8], [0, 8], lengths=[8])
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "both set"):
            b2b.Descriptors([0], [0], lengths=[8], block_size=8)
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "neither"):
            b2b.Descriptors([0], [0])
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "block_size is 0"):
            b2b.Descriptors([0], [0], block_size=0)
        with self.assertRaises(TypeError):
            b2b.Descriptors([0], [0], block_size=8.0)
        # An InvalidArgumentError is also a ValueError, with the gRPC code.
        try:
            b2b.Descriptors([0], [0, 1], block_size=1)
        except ValueError as e:
            self.assertEqual(e.code, grpc.StatusCode.INVALID_ARGUMENT)

    def test_descriptors_message(self):
        d = b2b.Descriptors(np.array([3, 1]), [7, 9], lengths=array.array("Q", [4, 5]))
        self.assertEqual(len(d), 2)
        m = pb.Descriptors.FromString(d._msg.SerializeToString())
        np.testing.assert_array_equal(np.frombuffer(m.src_offsets, "<u8"), [3, 1])
        np.testing.assert_array_equal(np.frombuffer(m.dst_offsets, "<u8"), [7, 9])
        np.testing.assert_array_equal(np.frombuffer(m.lengths, "<u8"), [4, 5])
        self.assertEqual(m.block_length, 0)
        u = b2b.Descriptors([0], [0], block_size=4096)
        self.assertEqual(u._msg.block_length, 4096)
        self.assertEqual(u._msg.lengths, b"")


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class ErrorMappingTest(unittest.TestCase):
    def test_each_code_maps_to_its_class(self):
        cases = {
            grpc.StatusCode.NOT_FOUND: b2b.NotFoundError,
            grpc.StatusCode.INVALID_ARGUMENT: b2b.InvalidArgumentError,
            grpc.StatusCode.UNAVAILABLE: b2b.UnavailableError,
            grpc.StatusCode.DEADLINE_EXCEEDED: b2b.DeadlineExceededError,
            grpc.StatusCode.FAILED_PRECONDITION: b2b.FailedPreconditionError,
            grpc.StatusCode.RESOURCE_EXHAUSTED: b2b.ResourceExhaustedError,
            grpc.StatusCode.PERMISSION_DENIED: b2b.PermissionDeniedError,
            grpc.StatusCode.ABORTED: b2b.AbortedError,
            grpc.StatusCode.ALREADY_EXISTS: b2b.AlreadyExistsError,
            grpc.StatusCode.UNIMPLEMENTED: b2b.UnimplementedError,
            grpc.StatusCode.INTERNAL: b2b.B2BError,
            grpc.StatusCode.CANCELLED: b2b.CancelledError,
        }
        for code, cls in cases.items():
            with self.subTest(code=code):
                e = from_rpc_error(FakeRpcError(code, f"msg for {code.name}"))
                self.assertIs(type(e), cls)
                self.assertIsInstance(e, b2b.B2BError)
                self.assertEqual(e.code, code)
                self.assertEqual(e.message, f"msg for {code.name}")
                self.assertEqual(str(e), f"{code.name}: msg for {code.name}")
                e2 = pickle.loads(pickle.dumps(e))
                self.assertIs(type(e2), cls)
                self.assertEqual((e2.code, e2.message), (e.code, e.message))

    def test_cancelled_after_the_deadline_is_deadline_exceeded(self):
        # grpc-go resets a stream with RST_STREAM(CANCEL) at the deadline it was
        # sent; gRPC Python may report that as CANCELLED before its own timer fires.
        now = time.monotonic()
        cases = [
            ("no deadline", grpc.StatusCode.CANCELLED, None, b2b.CancelledError, grpc.StatusCode.CANCELLED),
            ("deadline ahead", grpc.StatusCode.CANCELLED, now + 3600, b2b.CancelledError, grpc.StatusCode.CANCELLED),
            ("deadline passed", grpc.StatusCode.CANCELLED, now - 0.001, b2b.DeadlineExceededError,
             grpc.StatusCode.DEADLINE_EXCEEDED),
            ("deadline passed, other code", grpc.StatusCode.ABORTED, now - 1, b2b.AbortedError,
             grpc.StatusCode.ABORTED),
        ]
        for name, code, deadline, cls, want in cases:
            with self.subTest(name):
                e = from_rpc_error(FakeRpcError(code, "Received RST_STREAM with error code 8"), deadline)
                self.assertIs(type(e), cls)
                self.assertEqual(e.code, want)
                self.assertIn("Received RST_STREAM with error code 8", e.message)


class AddressTest(unittest.TestCase):
    def test_targets(self):
        from b2b.client import _target

        self.assertEqual(_target("/run/b2bd/b2bd.sock"), "unix:///run/b2bd/b2bd.sock")
        self.assertEqual(_target("unix:///x/y.sock"), "unix:///x/y.sock")
        self.assertEqual(_target("127.0.0.1:7400"), "127.0.0.1:7400")
        with self.assertRaises(TypeError):
            _target("")

    def test_unreachable_daemon_is_unavailable(self):
        with b2b.Client("/nonexistent/b2bd-test.sock", timeout=5) as c:
            with self.assertRaises(b2b.UnavailableError) as cm:
                c.status()
            self.assertIn("b2bd-test.sock", cm.exception.message)
        with self.assertRaisesRegex(b2b.UnavailableError, "closed"):
            c.status()

    def test_wait_ready_times_out(self):
        with b2b.Client("/nonexistent/b2bd-test.sock") as c:
            t0 = time.monotonic()
            with self.assertRaises(b2b.DeadlineExceededError):
                c.wait_ready(timeout=0.3)
            self.assertGreaterEqual(time.monotonic() - t0, 0.25)


class _FakeDaemon:
    """A gRPC server answering BatchTransfer, SubmitTransfer, PrepareTransfer,
    WarmTransfer and SubmitStream:
    it records each call's metadata and time left, waits for the caller's
    deadline (``b2b-timeout-ms``) to pass while its own call is still live,
    and answers DEADLINE_EXCEEDED with its own message."""

    MESSAGE = "fake daemon: the caller's deadline passed"

    def __init__(self):
        import threading
        from concurrent import futures

        self.seen = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "BatchTransfer": grpc.unary_unary_rpc_method_handler(self._unary, request_deserializer=None, response_serializer=None),
            "SubmitTransfer": grpc.unary_unary_rpc_method_handler(self._unary, request_deserializer=None, response_serializer=None),
            # These two move no bytes but reach the peer (a frozen one holds
            # them to the deadline): the answer must be the daemon's, naming it.
            "PrepareTransfer": grpc.unary_unary_rpc_method_handler(self._unary, request_deserializer=None, response_serializer=None),
            "WarmTransfer": grpc.unary_unary_rpc_method_handler(self._unary, request_deserializer=None, response_serializer=None),
            "SubmitStream": grpc.stream_stream_rpc_method_handler(self._stream, request_deserializer=None, response_serializer=None),
        }
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("b2b.v1.B2B", handlers),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _answer(self, context):
        md = dict(context.invocation_metadata())
        left = context.time_remaining()
        ms = md.get(b2b.errors.TIMEOUT_KEY)
        alive = None
        if ms is not None:
            # Held to the caller's deadline, then asked whether its own call is still live.
            time.sleep(int(ms) / 1000)  # the work a daemon would do; not a synchronisation
            alive = context.is_active()
        with self.lock:
            self.seen.append((ms, left, alive))
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, self.MESSAGE)

    def _unary(self, request, context):
        self._answer(context)

    def _stream(self, requests, context):
        self._answer(context)
        yield b""

    def close(self):
        self.server.stop(None)


class TransferDeadlineTest(unittest.TestCase):
    def test_transfer_deadline(self):
        from b2b.errors import DEADLINE_GRACE, TIMEOUT_KEY, transfer_deadline

        cases = [
            (None, None, None),
            (0.0001, 0.0001 + DEADLINE_GRACE, "1"),  # rounded up: never earlier than the caller's
            (0.25, 0.25 + DEADLINE_GRACE, "250"),
            (86400.0, 86400.0 + DEADLINE_GRACE, "86400000"),
            (86400.01, 86400.01, None),  # over the daemon's limit: sent as it is
        ]
        for timeout, want_rpc, want_ms in cases:
            with self.subTest(timeout=timeout):
                rpc, md = transfer_deadline(timeout)
                self.assertEqual(rpc, want_rpc)
                self.assertEqual(md, None if want_ms is None else ((TIMEOUT_KEY, want_ms),))
        for bad in (0, -1.0):  # refused, as every timeout (test_unit_args.py)
            with self.subTest(timeout=bad), self.assertRaises(b2b.InvalidArgumentError):
                transfer_deadline(bad)

    def test_answer_at_the_deadline_is_the_daemons(self):
        fake = _FakeDaemon()
        self.addCleanup(fake.close)
        with b2b.Client(f"127.0.0.1:{fake.port}", timeout=10) as c:
            calls = {
                "batch_transfer": lambda: c.batch_transfer("r1", "peer:7470", "dst", [0], [0], block_size=64, timeout=0.2),
                "submit": lambda: b2b.PreparedTransfer(c, pb.PrepareTransferResponse(handle=1), 0.2).submit(),
                "stream": lambda: list(c.submit_stream(timeout=0.2)),
                "prepare": lambda: c.prepare("r1", "peer:7470", "dst", [0], [0], block_size=64, timeout=0.2),
                "warm": lambda: c.warm("r1", "peer:7470", "dst", timeout=0.2),
            }
            for name, call in calls.items():
                with self.subTest(name):
                    with self.assertRaises(b2b.DeadlineExceededError) as cm:
                        call()
                    self.assertEqual(cm.exception.message, _FakeDaemon.MESSAGE)
                    ms, left, alive = fake.seen[-1]
                    self.assertEqual(ms, "200")
                    self.assertGreater(left, 1.0)  # the gRPC deadline is the grace later
                    self.assertTrue(alive, "the call ended at the caller's deadline: the daemon could not answer")


class _HoldingDaemon:
    """A gRPC server that holds BatchTransfer and SubmitTransfer until a
    CancelCall names the call's ``b2b-call-id`` (or 10 s pass), then answers
    CANCELLED with its own message, telling whether its call was still live
    then (the caller's interrupt must not have cut it at the client).
    CancelCall returns once that call answered, as the daemon's does."""

    MESSAGE = "fake daemon: stopped by CancelCall"

    def __init__(self):
        import threading
        from concurrent import futures

        self.arrived = threading.Event()
        self.events = {}  # call id -> (cancelled, ended) threading.Events
        self.seen = []  # (call id, whether a CancelCall named it, alive)
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "BatchTransfer": grpc.unary_unary_rpc_method_handler(self._unary, request_deserializer=None, response_serializer=None),
            "SubmitTransfer": grpc.unary_unary_rpc_method_handler(self._unary, request_deserializer=None, response_serializer=None),
            "SubmitStream": grpc.stream_stream_rpc_method_handler(self._stream, request_deserializer=None, response_serializer=None),
            "CancelCall": grpc.unary_unary_rpc_method_handler(
                self._cancel, request_deserializer=pb.CancelCallRequest.FromString, response_serializer=pb.CancelCallResponse.SerializeToString
            ),
        }
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("b2b.v1.B2B", handlers),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _events(self, call_id):
        import threading

        with self.lock:
            return self.events.setdefault(call_id, (threading.Event(), threading.Event()))

    def _unary(self, request, context):
        call_id = dict(context.invocation_metadata()).get(b2b.errors.CALL_ID_KEY)
        cancelled, ended = self._events(call_id)
        self.arrived.set()
        cancelled.wait(10)
        with self.lock:
            self.seen.append((call_id, cancelled.is_set(), context.is_active()))
        ended.set()
        context.abort(grpc.StatusCode.CANCELLED, self.MESSAGE)

    def _stream(self, requests, context):
        self._unary(None, context)
        yield b""  # never reached: _unary aborts

    def _cancel(self, request, context):
        cancelled, ended = self._events(request.call_id)
        cancelled.set()
        return pb.CancelCallResponse(in_flight=ended.wait(5))

    def close(self):
        self.server.stop(None)


class InterruptTest(unittest.TestCase):
    """An interrupted transfer call (Ctrl-C) goes to the daemon as CancelCall
    with the call's id, and the interrupt is raised once the daemon answered:
    the call was not cut at the client."""

    def test_interrupt_reaches_the_daemon(self):
        import _thread
        import signal
        import threading

        # interrupt_main does nothing while SIGINT is ignored, as it is for a
        # job a non-interactive shell started in the background: handle it.
        self.addCleanup(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))
        fake = _HoldingDaemon()
        self.addCleanup(fake.close)
        with b2b.Client(f"127.0.0.1:{fake.port}", timeout=10) as c:
            calls = {
                "batch_transfer": lambda: c.batch_transfer("r1", "peer:7470", "dst", [0], [0], block_size=64, timeout=30),
                "submit": lambda: b2b.PreparedTransfer(c, pb.PrepareTransferResponse(handle=1), 30).submit(),
            }
            for name, call in calls.items():
                with self.subTest(name):
                    fake.arrived.clear()
                    t = threading.Thread(target=lambda: fake.arrived.wait(10) and _thread.interrupt_main())
                    t.start()
                    with self.assertRaises(KeyboardInterrupt):
                        call()
                    t.join()
                    self.assertEqual(len(fake.seen), list(calls).index(name) + 1, "the interrupt was raised before the daemon answered")
                    call_id, cancelled, alive = fake.seen[-1]
                    self.assertIsNotNone(call_id, "the call carried no b2b-call-id")
                    self.assertTrue(cancelled, "no CancelCall named the call's id")
                    self.assertTrue(alive, "the interrupt cut the call at the client: the daemon could not answer")

    def test_stream_close_reaches_the_daemon(self):
        # Closing a submit stream stops it through the daemon: close returns
        # once CancelCall answered that the stream ended there.
        fake = _HoldingDaemon()
        self.addCleanup(fake.close)
        with b2b.Client(f"127.0.0.1:{fake.port}", timeout=10) as c:
            s = c.submit_stream(timeout=30)
            s.submit(b2b.PreparedTransfer(c, pb.PrepareTransferResponse(handle=1), 30))
            self.assertTrue(fake.arrived.wait(10), "the stream never reached the daemon")
            s.close()
            self.assertEqual(len(fake.seen), 1, "close returned before the daemon answered")
            call_id, cancelled, alive = fake.seen[-1]
            self.assertIsNotNone(call_id, "the stream carried no b2b-call-id")
            self.assertTrue(cancelled, "no CancelCall named the stream's id")
            self.assertTrue(alive, "close cut the stream at the client: the daemon could not answer")


if __name__ == "__main__":
    unittest.main()


class PreparedUnitTest(unittest.TestCase):
    """The prepared-transfer helpers that need no daemon."""

    def test_transfer_result_phases(self):
        r = pb.BatchTransferResponse(blocks=3, bytes=384, transport=pb.TRANSPORT_KIND_TCP, elapsed_ns=1500, segments=2, work_requests=1)
        t = b2b.TransferResult.from_proto(r)
        self.assertEqual((t.blocks, t.bytes, t.transport, t.segments, t.work_requests), (3, 384, "tcp", 2, 1))
        self.assertEqual(t.elapsed_ns, 1500)
        self.assertIsNone(t.phases)  # a daemon that sent none
        r.phases.CopyFrom(pb.PhaseTimings(decode_ns=1, validate_ns=2, resolve_ns=3, plan_ns=4, post_ns=5, wire_ns=6, notify_ns=7, total_ns=28,
                                          armed_ns=9, trigger_seen_unix_ns=10, posted_unix_ns=11, landed_unix_ns=12))
        p = b2b.TransferResult.from_proto(r).phases
        self.assertEqual(
            p.as_dict(),
            {"decode_ns": 1, "validate_ns": 2, "resolve_ns": 3, "plan_ns": 4, "post_ns": 5, "wire_ns": 6, "notify_ns": 7, "total_ns": 28,
             "armed_ns": 9, "trigger_seen_unix_ns": 10, "posted_unix_ns": 11, "landed_unix_ns": 12},
        )

    def test_stream_result(self):
        ok = b2b.StreamResult(4, b2b.TransferResult(1, 2, "tcp", 0.0))
        self.assertTrue(ok.ok)
        self.assertEqual(ok.get().bytes, 2)
        bad = b2b.StreamResult(5, None, b2b.error_for_code(grpc.StatusCode.NOT_FOUND, "plan 9: no such prepared transfer"))
        self.assertFalse(bad.ok)
        with self.assertRaises(b2b.NotFoundError) as cm:
            bad.get()
        self.assertIn("plan 9", str(cm.exception))

    def test_submit_request_serialised_once(self):
        # A plan's submit sends bytes prepared once: they decode to its handle.
        c = b2b.Client("/nonexistent/b2bd.sock")
        try:
            p = b2b.PreparedTransfer(c, pb.PrepareTransferResponse(handle=1 << 63, blocks=2, bytes=256), None)
            self.assertEqual(pb.SubmitTransferRequest.FromString(p._req).handle, 1 << 63)
            self.assertEqual((p.blocks, p.bytes, p.released), (2, 256, False))
            c.close()
            p.release()  # a closed client: the daemon frees the plan itself
            self.assertTrue(p.released)
            with self.assertRaises(b2b.FailedPreconditionError):
                p.submit()
        finally:
            c.close()

    def test_pipeline_depth(self):
        with b2b.Client("/nonexistent/b2bd.sock") as c:
            for depth in (0, -1, 1.5, True):
                with self.subTest(depth=depth), self.assertRaises(b2b.InvalidArgumentError):
                    list(c.pipeline([], depth=depth))


class _ReportOnceDaemon:
    """A gRPC server with one transfer (id 1) whose outcome it reports once,
    as the daemon does: WaitTransfer holds until ``release`` is set, then
    hands DONE over (even to a caller that went away: the daemon's answer
    may be on the wire when the caller's interrupt strikes) and forgets the
    id; a later Wait or Poll of it is NOT_FOUND."""

    BLOCKS = 7

    def __init__(self):
        import threading
        from concurrent import futures

        self.arrived, self.release = threading.Event(), threading.Event()
        self.lock = threading.Lock()
        self.reported = False
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "WaitTransfer": grpc.unary_unary_rpc_method_handler(
                self._wait, request_deserializer=pb.WaitTransferRequest.FromString, response_serializer=pb.TransferOutcome.SerializeToString),
            "PollTransfers": grpc.unary_unary_rpc_method_handler(
                self._poll, request_deserializer=pb.PollTransfersRequest.FromString, response_serializer=pb.PollTransfersResponse.SerializeToString),
            "CancelTransfer": grpc.unary_unary_rpc_method_handler(
                self._wait, request_deserializer=pb.CancelTransferRequest.FromString, response_serializer=pb.TransferOutcome.SerializeToString),
        }
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("b2b.v1.B2B", handlers),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _report(self, context):
        with self.lock:
            if self.reported:
                context.abort(grpc.StatusCode.NOT_FOUND, "transfer_id 1 is unknown (reported already)")
            self.reported = True
        return pb.TransferOutcome(transfer_id=1, state=pb.TRANSFER_STATE_DONE, result=pb.BatchTransferResponse(blocks=self.BLOCKS))

    def _wait(self, request, context):
        self.arrived.set()
        self.release.wait(10)
        return self._report(context)

    def _poll(self, request, context):
        if not self.release.is_set():
            return pb.PollTransfersResponse(outcomes=[pb.TransferOutcome(transfer_id=1, state=pb.TRANSFER_STATE_RUNNING)])
        return pb.PollTransfersResponse(outcomes=[self._report(context)])

    def close(self):
        self.server.stop(None)


class HandleInterruptTest(unittest.TestCase):
    """An interrupt during a handle's wait() loses no outcome: the call
    goes on, and the next wait() (or done()) takes the daemon's answer."""

    def run_interrupted(self, then):
        import _thread
        import signal
        import threading

        self.addCleanup(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))
        fake = _ReportOnceDaemon()
        self.addCleanup(fake.close)
        with b2b.Client(f"127.0.0.1:{fake.port}", timeout=10) as c:
            h = b2b.Transfer(c, 1)
            t = threading.Thread(target=lambda: fake.arrived.wait(10) and _thread.interrupt_main())
            t.start()
            with self.assertRaises(KeyboardInterrupt):
                h.wait()
            t.join()
            self.assertTrue(fake.arrived.is_set(), "the interrupt struck before the wait reached the daemon")
            fake.release.set()  # the daemon hands the outcome over now
            then(self, h)

    def test_wait_after_interrupt(self):
        self.run_interrupted(lambda s, h: s.assertEqual(h.wait(timeout=10).blocks, _ReportOnceDaemon.BLOCKS))

    def test_done_after_interrupt(self):
        def then(s, h):
            deadline = time.monotonic() + 10
            while not h.done():
                s.assertLess(time.monotonic(), deadline)
                time.sleep(0.01)
            s.assertEqual(h.result.blocks, _ReportOnceDaemon.BLOCKS)

        self.run_interrupted(then)


class CancelBoundTest(unittest.TestCase):
    """cancel() is bounded by the client's ``timeout``, as its other control
    calls are: a daemon that does not answer (frozen by SIGSTOP) made it
    wait for ever, while status(), poll() and done() failed after the
    timeout."""

    def test_cancel_of_an_unanswering_daemon(self):
        fake = _ReportOnceDaemon()  # holds CancelTransfer until release (10 s)
        self.addCleanup(fake.close)
        self.addCleanup(fake.release.set)
        for timeout in (0.3, 1.0):
            with self.subTest(timeout=timeout), b2b.Client(f"127.0.0.1:{fake.port}", timeout=timeout) as c:
                h = b2b.Transfer(c, 1)
                t0 = time.monotonic()
                with self.assertRaises(b2b.DeadlineExceededError):
                    h.cancel()
                took = time.monotonic() - t0
                self.assertLess(took, timeout + 2.0, f"cancel() took {took:.1f} s with the client's timeout {timeout} s")
                self.assertEqual(h.state, "running")


class _SilentDaemon:
    """A gRPC server that answers RegisterLayout and DeregisterLayout only
    once ``release`` is set (or 10 s passed): a daemon stopped (SIGSTOP)."""

    def __init__(self):
        import threading
        from concurrent import futures

        self.release = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "RegisterLayout": grpc.unary_unary_rpc_method_handler(
                self._hold, request_deserializer=pb.RegisterLayoutRequest.FromString, response_serializer=pb.RegisterLayoutResponse.SerializeToString),
            "DeregisterLayout": grpc.unary_unary_rpc_method_handler(
                self._hold_dereg, request_deserializer=pb.DeregisterLayoutRequest.FromString, response_serializer=pb.DeregisterLayoutResponse.SerializeToString),
        }
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("b2b.v1.B2B", handlers),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _hold(self, request, context):
        self.release.wait(10)
        return pb.RegisterLayoutResponse()

    def _hold_dereg(self, request, context):
        self.release.wait(10)
        return pb.DeregisterLayoutResponse()

    def close(self):
        self.release.set()
        self.server.stop(None)


class LayoutCallsBoundTest(unittest.TestCase):
    """register_layout and deregister_layout without a timeout take the
    client's, as its other control calls do: against a daemon that does
    not answer they waited for ever, and so did close() of a client
    holding a leased layout."""

    def test_layout_calls_of_an_unanswering_daemon(self):
        fake = _SilentDaemon()
        self.addCleanup(fake.close)
        timeout = 0.3
        with b2b.Client(f"127.0.0.1:{fake.port}", timeout=timeout) as c:
            calls = {
                "register_layout": lambda: c.register_layout("kv", [("r1", 0, 64, 64)], 1),
                "deregister_layout": lambda: c.deregister_layout("kv"),
            }
            for name, call in calls.items():
                with self.subTest(name):
                    t0 = time.monotonic()
                    with self.assertRaises(b2b.DeadlineExceededError):
                        call()
                    took = time.monotonic() - t0
                    self.assertLess(took, timeout + 2.0, f"{name} took {took:.1f} s with the client's timeout {timeout} s")


class RingResultTest(unittest.TestCase):
    """A ring call's result is what the gRPC path's response would make,
    field for field, though built without the protobuf."""

    def test_same_as_from_proto(self):
        from types import SimpleNamespace

        from b2b import _ring_client
        from b2b._ring import Completion
        from b2b._results import TransferResult

        c = Completion(7, 0, "", 3, 384, 12_345, 67_890)
        for transport in ("tcp", "local", "verbs", "auto", "", "bogus"):
            plan = SimpleNamespace(transport=transport, segments=2, work_requests=5)
            got = _ring_client._result(_ring_client._TRANSPORT_BY_NAME.get(transport, 0), c, 2, 5)
            want = TransferResult.from_proto(_ring_client._response(plan, c))
            self.assertEqual(got, want, transport)
        for kind in (pb.TRANSPORT_KIND_UNSPECIFIED, pb.TRANSPORT_KIND_TCP, pb.TRANSPORT_KIND_LOCAL, 99):
            got = _ring_client._result(kind, c)
            want = TransferResult.from_proto(pb.BatchTransferResponse(
                blocks=c.blocks, bytes=c.bytes, transport=kind, elapsed_ns=c.wire_ns,
                phases=pb.PhaseTimings(wire_ns=c.wire_ns, total_ns=c.total_ns)))
            self.assertEqual(got, want, kind)


class _MemRegion:
    """A host region's stand-in for Pool: memory and nothing else."""

    def __init__(self, n: int) -> None:
        self.mmap = bytearray(n)
        self.size = n


class _MemClient:
    def register_host(self, n: int) -> _MemRegion:
        return _MemRegion(n)


class PoolTest(unittest.TestCase):
    """The harness's KV pool (b2b.connector.testing.Pool) writes whole blocks
    in one numpy assignment: it must write exactly pattern() of every
    token, leave the rest of a last partial block and every other block as
    they were, and its check must count each wrong token."""

    def setUp(self):
        from b2b.connector import testing

        self.testing = testing
        self._as_array = b2b.as_array
        testing.b2b.as_array = lambda r, dt, shape: np.frombuffer(r.mmap, dtype=dt).reshape(shape)

    def tearDown(self):
        self.testing.b2b.as_array = self._as_array

    def test_fill_is_pattern_and_check_counts_tokens(self):
        t = self.testing
        for layout, head0 in (("NHD", 0), ("HND", 2)):
            for ntok in (1, 15, 16, 17, 40, 64):
                p = t.Pool(_MemClient(), layers=3, num_blocks=12, block_size=16, heads=2, dim=8, kv_layout=layout,
                           head0=head0)
                p.array[:] = 0x5A5A
                before = p.array.copy()
                ids = [9, 2, 7, 4][:-(-ntok // 16)]
                p.fill(ids, 77, ntok)
                tok = np.arange(ntok)
                heads = np.arange(head0, head0 + 2)
                blocks, pos = np.asarray(ids)[tok // 16], tok % 16
                want = before.copy()
                for layer in range(3):
                    for kv in (0, 1):
                        v = t.pattern(77, layer, kv, tok, heads, 8)
                        if layout == "NHD":
                            want[layer, kv, blocks, pos] = v
                        else:
                            want[layer, kv, blocks, :, pos] = v
                np.testing.assert_array_equal(p.array, want, f"{layout}, {ntok} tokens")
                self.assertEqual(p.check(ids, 77, ntok), 0)
                self.assertEqual(p.check(ids, 78, ntok), ntok, "another request's keys pass")
                # One element of the last token, then of the first, altered.
                last = (2, 1, ids[-1], (ntok - 1) % 16, 1, 3) if layout == "NHD" else (2, 1, ids[-1], 1, (ntok - 1) % 16, 3)
                p.array[last] ^= 1
                self.assertEqual(p.check(ids, 77, ntok), 1, f"{layout}, {ntok}: last token")
                p.array[(0, 0, ids[0], 0, 0, 0)] ^= 0x100
                self.assertEqual(p.check(ids, 77, ntok), 1 if ntok == 1 else 2, f"{layout}, {ntok}: first token")
