"""b2b.stream: counters, mark_layer_done through a stand-in driver (no GPU),
and triggered block transfers between two real daemons with a host-written
counter (the same watcher a GPU-written one meets)."""

from __future__ import annotations

import time
import unittest

import daemon_harness

import grpc
import numpy as np

import b2b
from b2b import stream
from b2b.v1 import b2b_pb2 as pb


class FakeDriver:
    """libcuda's few entry points as Python callables, recording calls."""

    DEVPTR_BASE = 0x7F0000000000

    def __init__(self) -> None:
        self.calls = []
        self.registered = {}
        self.ctx = 0

    # Each returns a CUresult (0: success).
    def cuInit(self, flags):
        return 0

    def cuGetErrorName(self, code, out):
        out._obj.value = b"CUDA_ERROR_FAKE"
        return 0

    def cuCtxGetCurrent(self, out):
        out._obj.value = self.ctx or None
        return 0

    def cuCtxSetCurrent(self, ctx):
        self.ctx = ctx.value
        return 0

    def cuDeviceGet(self, out, ordinal):
        out._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, out, dev):
        out._obj.value = 0x1000 + dev
        return 0

    def cuMemHostRegister_v2(self, p, size, flags):
        self.calls.append(("register", p.value, size, flags))
        if p.value in self.registered:
            return stream.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        self.registered[p.value] = size
        return 0

    def cuMemHostUnregister(self, p):
        self.calls.append(("unregister", p.value))
        return 0 if self.registered.pop(p.value, None) else 1

    def cuMemHostGetDevicePointer_v2(self, out, p, flags):
        out._obj.value = self.DEVPTR_BASE + p.value % (1 << 32)
        return 0

    def cuStreamWriteValue64_v2(self, s, addr, value, flags):
        self.calls.append(("write", s.value or 0, addr, value, flags))
        return 0


class FakeRegion:
    def __init__(self, size=4096):
        self.size = size
        self.id = "r-fake"
        self.array = np.zeros(size // 8, dtype=np.uint64).view(np.uint8)
        self.closed = False

    def close(self):
        self.closed = True


class FakeClient:
    def __init__(self):
        self.regions = []

    def register_host(self, size):
        r = FakeRegion(size)
        self.regions.append(r)
        return r


class DriverTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeDriver()
        self.saved = stream._driver
        stream._driver = stream._Driver(self.fake)

    def tearDown(self):
        stream._driver = self.saved

    def test_counter_registers_page_and_marks(self):
        c = stream.Counter(FakeClient(), device=1)
        base = int(c.region.array.ctypes.data)
        self.assertEqual(self.fake.calls[0], ("register", base, 4096, stream.CU_MEMHOSTREGISTER_DEVICEMAP))
        self.assertEqual(self.fake.ctx, 0x1001, "no context was current: device 1's primary one")
        self.assertEqual(c.device_ptr, FakeDriver.DEVPTR_BASE + base % (1 << 32))
        stream.mark_layer_done(0xABC, c, 7)
        self.assertEqual(self.fake.calls[-1], ("write", 0xABC, c.device_ptr, 7, stream.CU_STREAM_WRITE_VALUE_DEFAULT))

        class TorchLikeStream:
            cuda_stream = 0xDEF
        stream.mark_layer_done(TorchLikeStream(), c, 8)
        self.assertEqual(self.fake.calls[-1][:2], ("write", 0xDEF))
        c.close()
        c.close()
        self.assertEqual([k for k in self.fake.calls if k[0] == "unregister"], [("unregister", base)])
        self.assertTrue(c.region.closed)

    def test_two_counters_share_a_page(self):
        r = FakeRegion()
        a = stream.Counter(FakeClient(), r, 0)
        b = stream.Counter(FakeClient(), r, 8)
        self.assertEqual(b.device_ptr - a.device_ptr, 8)
        a.set(5)
        b.set(9)
        self.assertEqual((a.value, b.value), (5, 9))
        self.assertFalse(r.closed, "a counter on a caller's region leaves it registered")

    def test_bad_arguments(self):
        c = stream.Counter(FakeClient())
        for bad in (-1, 1 << 64, 1.5, "3"):
            with self.assertRaises(b2b.InvalidArgumentError):
                stream.mark_layer_done(0, c, bad)
        for bad in (-8, 3, 4096):
            with self.assertRaises(b2b.InvalidArgumentError):
                stream.Counter(FakeClient(), FakeRegion(), bad)
        with self.assertRaises(b2b.InvalidArgumentError):
            stream.mark_layer_done("stream", c, 1)
        host_only = stream.Counter(FakeClient(), cuda=False)
        with self.assertRaises(b2b.InvalidArgumentError):
            stream.mark_layer_done(0, host_only, 1)
        for bad in ((c,), (c, -1), ("c", 1), (c, True)):
            with self.assertRaises(b2b.InvalidArgumentError):
                stream.trigger_proto(bad)
        p = stream.trigger_proto((c, 3))
        self.assertEqual((p.counter_region_id, p.counter_offset, p.value), (c.region_id, 0, 3))

    def test_driver_error_names_the_call(self):
        self.fake.cuStreamWriteValue64_v2 = lambda s, a, v, f: 1
        stream._driver = stream._Driver(self.fake)
        c = stream.Counter(FakeClient())
        with self.assertRaises(stream.CudaDriverError) as cm:
            stream.mark_layer_done(0, c, 1)
        self.assertIn("cuStreamWriteValue64 failed: CUDA_ERROR_FAKE", str(cm.exception))


SEGMENTS, POOL, BLOCK = 2, 16, 512


class TriggeredTransferTest(daemon_harness.DaemonPair):
    """Two daemons; the counter is written from the host."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        rng = np.random.default_rng(25)
        cls.srcs = [cls.a.register_host(POOL * BLOCK) for _ in range(SEGMENTS)]
        cls.dsts = [cls.b.register_host(POOL * BLOCK, f"py-trig-{i}") for i in range(SEGMENTS)]
        for s in cls.srcs:
            s.memoryview[:] = rng.integers(0, 256, POOL * BLOCK, dtype=np.uint8).tobytes()
        cls.a.register_layout("trig-src", [(s, 0, BLOCK, BLOCK) for s in cls.srcs], POOL)
        cls.b.register_layout("trig-dst", [(d, 0, BLOCK, BLOCK) for d in cls.dsts], POOL, export_name="trig-dst")

    @classmethod
    def tearDownClass(cls):
        cls.a.deregister_layout("trig-src")
        cls.b.deregister_layout("trig-dst")
        super().tearDownClass()

    def start(self, counter, value, ids, timeout=None):
        try:
            return stream.transfer_blocks(self.a, "trig-src", self.db.peer_address, "trig-dst", ids, ids,
                                          after=(counter, value), timeout=timeout)
        except b2b.B2BError as e:
            if e.code == grpc.StatusCode.UNIMPLEMENTED:
                self.skipTest("this daemon has no StartTransfer yet")
            raise

    def landed(self, ids):
        return all(bytes(d.memoryview[i * BLOCK:(i + 1) * BLOCK]) == bytes(s.memoryview[i * BLOCK:(i + 1) * BLOCK])
                   for s, d in zip(self.srcs, self.dsts) for i in ids)

    def test_waits_for_its_value(self):
        with stream.Counter(self.a, cuda=False) as c:
            h = self.start(c, 2, [1, 2])
            c.set(1)
            with self.assertRaises(b2b.DeadlineExceededError):
                h.wait(timeout=0.2)  # armed at 1: still running
            self.assertFalse(self.landed([1, 2]), "posted before the counter reached its value")
            before = time.time_ns()
            c.set(2)
            r = h.wait(timeout=20)
            self.assertEqual(r.blocks, 2 * SEGMENTS)
            self.assertTrue(self.landed([1, 2]))
            ph = r.phases
            self.assertGreaterEqual(ph.trigger_seen_unix_ns, before)
            self.assertGreaterEqual(ph.posted_unix_ns, ph.trigger_seen_unix_ns)
            self.assertGreaterEqual(ph.landed_unix_ns, ph.posted_unix_ns)
            self.assertGreater(ph.armed_ns, 0)

    def test_deadline_posts_nothing(self):
        with stream.Counter(self.a, cuda=False) as c:
            h = self.start(c, 5, [3, 4], timeout=0.05)
            with self.assertRaises(b2b.DeadlineExceededError):
                h.wait(timeout=20)
            c.set(5)
            self.assertFalse(self.landed([3, 4]))

    def test_cancel_withdraws(self):
        with stream.Counter(self.a, cuda=False) as c:
            h = self.start(c, 1, [5, 6])
            h.cancel()
            self.assertEqual(h.outcome.state, pb.TRANSFER_STATE_CANCELLED)
            c.set(1)
            # A later transfer on the same counter fires: the cancelled one
            # would have fired first, in the same scan.
            # Client.transfer_blocks(after=) starts the same kind of transfer.
            self.a.transfer_blocks("trig-src", self.db.peer_address, "trig-dst", [7], [7], after=(c, 1)).wait(timeout=20)
            self.assertFalse(self.landed([5, 6]))
            self.assertTrue(self.landed([7]))

    def test_bad_counter(self):
        with stream.Counter(self.a, cuda=False) as c:
            bad = stream.Counter(self.a, c.region, 8, cuda=False)
            bad.offset = 4  # not a multiple of 8: the daemon refuses it
            with self.assertRaises(b2b.InvalidArgumentError) as cm:
                self.start(bad, 1, [1])
            self.assertIn("after.counter_offset 4", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
