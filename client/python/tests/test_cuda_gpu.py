"""register_cuda's fields checked on a real GPU with real PyTorch.

Skipped without torch or a CUDA device. For tensors from the caching
allocator (a whole block, a view into one, a small-pool tensor sharing a
segment with others) it checks that what b2b would send -- the 64-byte
cudaIpcMemHandle, the byte offset and the size -- names exactly the tensor's
bytes: the offset against the allocator's own segment table, and the bytes
by opening the handle in a separate process through the CUDA driver API (as
the daemon does) and copying them out.
"""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

import daemon_harness  # noqa: F401  (puts the source tree's b2b on sys.path)

from b2b import _cuda

try:
    import torch

    HAVE_GPU = torch.cuda.is_available()
except Exception:  # no torch, or a broken CUDA install
    torch = None
    HAVE_GPU = False

# Opens a CUDA IPC handle in a fresh process with the driver API and writes
# [offset, offset+size) of the allocation to stdout.
_READER = r"""
import ctypes, sys
handle, offset, size, device = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        sys.exit(f"{what}: CUresult {r}")
class Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]
ck(cu.cuInit(0), "cuInit")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
ck(cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
h = Handle()
ctypes.memmove(ctypes.byref(h), handle, 64)
base = ctypes.c_uint64()
op = getattr(cu, "cuIpcOpenMemHandle_v2", None) or cu.cuIpcOpenMemHandle
ck(op(ctypes.byref(base), h, ctypes.c_uint(1)), "cuIpcOpenMemHandle")  # LAZY_ENABLE_PEER_ACCESS
buf = ctypes.create_string_buffer(size)
ck(cu.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(base.value + offset), ctypes.c_size_t(size)), "cuMemcpyDtoH")
ck(cu.cuIpcCloseMemHandle(base), "cuIpcCloseMemHandle")
sys.stdout.buffer.write(buf.raw)
"""

# Shares a tensor from an expandable-segments allocator; prints the outcome.
_EXPANDABLE = r"""
import sys, torch
sys.path[:0] = sys.argv[1:2]
import b2b
from b2b import _cuda
t = torch.ones(1 << 20, device="cuda")
try:
    _cuda.share_tensor(t)
    print("accepted")
except b2b.InvalidArgumentError as e:
    print("refused:", e)
except RuntimeError as e:
    print("torch refused:", e)
"""


def segment_base(ptr: int) -> int:
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return seg["address"]
    raise AssertionError(f"pointer {ptr:#x} is in no allocator segment")


@unittest.skipUnless(HAVE_GPU, "needs PyTorch with a CUDA device")
class RealTorchShareTest(unittest.TestCase):
    def check(self, t):
        s = _cuda.share_tensor(t)
        try:
            self.assertEqual(len(s.ipc_handle), 64)
            self.assertEqual(s.device, t.device.index)
            self.assertEqual(s.size, t.numel() * t.element_size())
            self.assertEqual(s.offset, t.data_ptr() - segment_base(t.data_ptr()))
            torch.cuda.synchronize()
            p = subprocess.run(
                [sys.executable, "-c", _READER, s.ipc_handle.hex(), str(s.offset), str(s.size), str(s.device)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120,
            )
            self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
            self.assertEqual(p.stdout, t.cpu().contiguous().view(torch.uint8).numpy().tobytes())
        finally:
            if s.release_counter is not None and s.ref_counter_handle:
                s.release_counter(s.ref_counter_handle, s.ref_counter_offset)
        return s

    def test_tensors_from_the_caching_allocator(self):
        raw = torch.cuda.current_device()
        g = torch.Generator(device="cuda").manual_seed(3)
        base = torch.randint(0, 1 << 30, (1 << 20,), dtype=torch.int32, device="cuda", generator=g)  # 4 MiB
        self.check(base)
        s = self.check(base[12345:13345])  # a view: storage offset 12345 elements
        self.assertEqual(s.offset - self.check(base).offset, 12345 * 4)
        # Small tensors share a 2 MiB segment: non-zero offsets inside the block.
        smalls = [torch.full((100 + i,), i, dtype=torch.int16, device="cuda") for i in range(5)]
        offsets = {self.check(t).offset for t in smalls}
        self.assertGreater(len(offsets), 1)
        self.assertEqual(raw, torch.cuda.current_device())

    def test_expandable_segments_refused(self):
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        p = subprocess.run([sys.executable, "-c", _EXPANDABLE, pkg], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        out = p.stdout.decode(errors="replace")
        self.assertEqual(p.returncode, 0, out)
        self.assertNotIn("accepted", out)
        self.assertIn("refused", out)


if __name__ == "__main__":
    unittest.main()
