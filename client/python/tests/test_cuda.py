"""register_cuda without a GPU or torch: stand-in tensors, an in-process fake
daemon that records the requests, and the real daemon (which has no GPU here)."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import unittest
from concurrent import futures

import daemon_harness

import grpc

import b2b
from b2b import _cuda
from b2b.v1 import b2b_pb2 as pb
from b2b.v1 import b2b_pb2_grpc as pb_grpc

HANDLE = bytes(range(64))  # a stand-in cudaIpcMemHandle_t


def fake_tensor(
    *,
    storage_size_bytes,
    storage_offset_bytes,
    storage_offset,
    numel,
    element_size,
    handle=None,
    device=0,
    contiguous=True,
    is_cuda=True,
):
    """A stand-in for a torch CUDA tensor: only what register_cuda touches.

    Returns (tensor, released) where ``released`` collects the
    ``_release_ipc_counter_cuda`` calls made on its storage class.
    """
    released = []
    share = (
        device,
        HANDLE if handle is None else handle,
        storage_size_bytes,
        storage_offset_bytes,
        b"/torch_1234_5678",  # ref counter shm name
        7,  # ref counter slot
        b"\x00" * 64,  # event handle
        True,
    )

    class Storage:
        calls = 0

        def _share_cuda_(self):
            Storage.calls += 1
            return share

        @staticmethod
        def _release_ipc_counter_cuda(h, off):
            released.append((h, off))

    storage = Storage()

    class Tensor:
        def __init__(self):
            self.is_cuda = is_cuda
            self.device = f"cuda:{device}" if is_cuda else "cpu"

        def is_contiguous(self):
            return contiguous

        def element_size(self):
            return element_size

        def numel(self):
            return numel

        def storage_offset(self):
            return storage_offset

        def untyped_storage(self):
            return storage

    return Tensor(), released


class ShareArithmeticTest(unittest.TestCase):
    def test_offset_is_storage_in_block_plus_tensor_in_storage(self):
        # fp16 tensor = storage[100:1100], its storage 2 MiB + 512 B into the cudaMalloc block.
        t, _ = fake_tensor(
            storage_size_bytes=1 << 20, storage_offset_bytes=2097664, storage_offset=100, numel=1000, element_size=2, device=3
        )
        s = _cuda.share_tensor(t)
        self.assertEqual(s.device, 3)
        self.assertEqual(s.offset, 2097864)  # 2097664 + 100 * 2
        self.assertEqual(s.size, 2000)  # 1000 * 2
        self.assertEqual(s.ipc_handle, HANDLE)
        self.assertEqual((s.ref_counter_handle, s.ref_counter_offset), (b"/torch_1234_5678", 7))

    def test_whole_storage_at_block_start(self):
        t, _ = fake_tensor(storage_size_bytes=4096, storage_offset_bytes=0, storage_offset=0, numel=1024, element_size=4)
        s = _cuda.share_tensor(t)
        self.assertEqual((s.offset, s.size), (0, 4096))

    def test_tensor_ending_exactly_at_storage_end(self):
        t, _ = fake_tensor(storage_size_bytes=800, storage_offset_bytes=512, storage_offset=50, numel=50, element_size=8)
        s = _cuda.share_tensor(t)
        self.assertEqual((s.offset, s.size), (912, 400))

    def test_tensor_past_storage_end_is_refused(self):
        t, _ = fake_tensor(storage_size_bytes=800, storage_offset_bytes=0, storage_offset=51, numel=50, element_size=8)
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "run past its storage's 800 bytes"):
            _cuda.share_tensor(t)

    def test_handle_formats(self):
        self.assertEqual(_cuda.ipc_mem_handle(HANDLE), HANDLE)  # raw (older torch)
        for version in (2, 3):
            self.assertEqual(_cuda.ipc_mem_handle(bytes([version]) + b"c" + HANDLE), HANDLE)
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "expandable_segments"):
            _cuda.ipc_mem_handle(b"\x02e" + b"\x01" * 80)
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "unrecognised"):
            _cuda.ipc_mem_handle(b"\x02c" + HANDLE[:10])
        t, _ = fake_tensor(
            storage_size_bytes=64, storage_offset_bytes=0, storage_offset=0, numel=16, element_size=4, handle=b"\x02c" + HANDLE
        )
        self.assertEqual(_cuda.share_tensor(t).ipc_handle, HANDLE)

    def test_refusals(self):
        common = dict(storage_size_bytes=64, storage_offset_bytes=0, storage_offset=0, element_size=4)
        t, _ = fake_tensor(numel=16, contiguous=False, **common)
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "not contiguous"):
            _cuda.share_tensor(t)
        t, _ = fake_tensor(numel=16, is_cuda=False, **common)
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "not a CUDA device"):
            _cuda.share_tensor(t)
        t, _ = fake_tensor(numel=0, **common)
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "no elements"):
            _cuda.share_tensor(t)


class RecordingB2B(pb_grpc.B2BServicer):
    """A fake daemon that records RegisterRegion/DeregisterRegion requests."""

    def __init__(self):
        self.lock = threading.Lock()
        self.registered = []
        self.deregistered = []
        self.fail_register = None  # (code, message) to fail with

    def RegisterRegion(self, request, context):
        with self.lock:
            self.registered.append(request)
            fail = self.fail_register
        if fail is not None:
            context.abort(*fail)
        c = request.cuda_ipc
        return pb.RegisterRegionResponse(
            region=pb.Region(
                id=f"c{len(self.registered)}",
                export_name=request.export_name,
                size=c.size,
                kind=pb.MEMORY_KIND_CUDA,
                cuda_device=c.device,
            )
        )

    def DeregisterRegion(self, request, context):
        with self.lock:
            self.deregistered.append(request.region_id)
        return pb.DeregisterRegionResponse()


class RegisterCudaRequestTest(unittest.TestCase):
    """The whole register_cuda path over gRPC, against a recording fake daemon."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="b2b-fake-")
        self.sock = os.path.join(self.tmp, "fake.sock")
        self.servicer = RecordingB2B()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_B2BServicer_to_server(self.servicer, self.server)
        self.server.add_insecure_port("unix://" + self.sock)
        self.server.start()
        self.client = b2b.Client(self.sock, timeout=10)

    def tearDown(self):
        self.client.close()
        self.server.stop(None)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_request_fields_and_release(self):
        t, released = fake_tensor(
            storage_size_bytes=1 << 20, storage_offset_bytes=4096, storage_offset=256, numel=512, element_size=4, device=1
        )
        with self.client.register_cuda(t, export_name="gpu-dst") as r:
            self.assertIsInstance(r, b2b.CudaRegion)
            self.assertEqual(len(self.servicer.registered), 1)
            req = self.servicer.registered[0]
            self.assertEqual(req.WhichOneof("source"), "cuda_ipc")
            self.assertEqual(req.cuda_ipc.device, 1)
            self.assertEqual(req.cuda_ipc.ipc_handle, HANDLE)
            self.assertEqual(req.cuda_ipc.offset, 5120)  # 4096 + 256 * 4
            self.assertEqual(req.cuda_ipc.size, 2048)  # 512 * 4
            self.assertEqual(req.export_name, "gpu-dst")
            self.assertEqual((r.id, r.size, r.device, r.export_name), ("c1", 2048, 1, "gpu-dst"))
            self.assertIs(r.tensor, t)
            self.assertEqual(released, [])  # the daemon still maps it
        self.assertEqual(self.servicer.deregistered, ["c1"])
        self.assertEqual(released, [(b"/torch_1234_5678", 7)])  # given back exactly once
        self.assertIsNone(r.tensor)
        r.close()
        self.assertEqual(len(released), 1)

    def test_no_release_while_still_registered(self):
        t, released = fake_tensor(storage_size_bytes=64, storage_offset_bytes=0, storage_offset=0, numel=16, element_size=4)
        r = self.client.register_cuda(t, deregister_on_close=False)
        r.close()
        self.assertEqual(self.servicer.deregistered, [])
        self.assertEqual(released, [])
        self.assertIs(r.tensor, t)  # kept alive: the daemon may still map it
        self.client.deregister(r)
        self.assertEqual(self.servicer.deregistered, [r.id])
        self.assertEqual(released, [(b"/torch_1234_5678", 7)])

    def test_failed_registration_releases_counter(self):
        self.servicer.fail_register = (grpc.StatusCode.FAILED_PRECONDITION, "cuda_ipc: this daemon has no usable GPU")
        t, released = fake_tensor(storage_size_bytes=64, storage_offset_bytes=0, storage_offset=0, numel=16, element_size=4)
        with self.assertRaises(b2b.FailedPreconditionError) as cm:
            self.client.register_cuda(t)
        self.assertIn("no usable GPU", cm.exception.message)
        self.assertEqual(released, [(b"/torch_1234_5678", 7)])


class RegisterCudaRealDaemonTest(unittest.TestCase):
    """The real daemon, built without CUDA, refuses cleanly and the counter is given back."""

    @classmethod
    def setUpClass(cls):
        cls.d = daemon_harness.Daemon("cuda").start()

    @classmethod
    def tearDownClass(cls):
        code = cls.d.stop()
        log = cls.d.log()
        cls.d.cleanup()
        if code != 0:
            raise AssertionError(f"b2bd exited with {code}; log:\n{log}")

    def test_refused_without_gpu(self):
        with self.d.client() as c:
            st = c.status()
            if st.cuda_available:
                self.skipTest("this daemon has a GPU; a stand-in handle would be opened for real")
            t, released = fake_tensor(storage_size_bytes=64, storage_offset_bytes=0, storage_offset=0, numel=16, element_size=4)
            with self.assertRaises(b2b.FailedPreconditionError) as cm:
                c.register_cuda(t)
            self.assertIn("cuda_ipc", cm.exception.message)
            self.assertEqual(released, [(b"/torch_1234_5678", 7)])
            self.assertEqual(c.list_regions(), [])


if __name__ == "__main__":
    unittest.main()
