"""b2b.kv between two real daemons (host memory), and its CUDA grouping with
stand-in tensors (no GPU here; deploy/gpu/kv_exchange.py runs the real one)."""

from __future__ import annotations

import unittest
from types import SimpleNamespace
from unittest import mock

import daemon_harness

import grpc
import numpy as np

import b2b
from b2b import _cuda, kv

POOL, BS, HEADS, HD = 32, 4, 4, 8  # blocks of 4 tokens x 4 heads x 8 dims
DT = np.dtype(np.float32)
BLOCK = BS * HEADS * HD * DT.itemsize  # 512 bytes


def fill(a: np.ndarray, seed: int) -> None:
    """A per-block, per-tensor pattern: no two blocks alike."""
    a[...] = np.random.default_rng(seed).standard_normal(a.shape).astype(a.dtype)


class KVTest(daemon_harness.KVPair):
    def pools(self, layers=3):
        """Source: `layers` K and V tensors as views of ONE region; destination:
        one region per tensor, zeroed."""
        shape = (POOL, BS, HEADS, HD)
        one = POOL * BLOCK
        src_region = self.host(self.a, 2 * layers * one)
        src = {}
        for i in range(2 * layers):
            t = b2b.as_array(src_region, DT, shape, offset=i * one)
            fill(t, 100 + i)
            src[f"layer{i // 2}.{'kv'[i % 2]}"] = t
        dst = {k: b2b.as_array(self.host(self.b, one), DT, shape) for k in src}
        for t in dst.values():
            t[...] = 0
        return src_region, src, dst

    def test_dict_of_arrays_moves_blocks_to_other_ids(self):
        region, src, dst = self.pools()
        ls = self.layout(self.a, src, name="kv-src")
        ld = self.layout(self.b, dst, name="kv-dst", export_name="kv-dst")
        self.assertEqual(len(ls.segments), 6)
        self.assertEqual(ls.regions, (region,), "views of one region must share it")
        self.assertEqual([s.offset for s in ls.segments], [i * POOL * BLOCK for i in range(6)])
        self.assertEqual({(s.block_len, s.stride, s.num_blocks) for s in ls.segments}, {(BLOCK, BLOCK, POOL)})
        self.assertEqual(len(ld.regions), 6)
        self.assertTrue(all(r.export_name for r in ld.regions), "an exported layout's regions must be exported")

        rng = np.random.default_rng(7)
        src_ids = rng.permutation(POOL)[:12]  # int64 numpy
        dst_ids = rng.permutation(POOL)[:12].tolist()  # a list
        r = ls.transfer_blocks(self.db.peer_address, "kv-dst", src_ids, dst_ids)
        self.assertEqual(r.blocks, 12 * 6)
        moved = set(dst_ids)
        for k in src:
            for i, j in zip(src_ids, dst_ids):
                np.testing.assert_array_equal(dst[k][j], src[k][i], err_msg=f"{k}: block {i} -> {j}")
            for j in range(POOL):
                if j not in moved:
                    self.assertFalse(dst[k][j].any(), f"{k}: block {j} was not sent but changed")

    def test_stacked_kv_tensor_is_two_segments(self):
        shape = (2, POOL, BS, HEADS, HD)
        src = b2b.as_array(self.host(self.a, 2 * POOL * BLOCK), DT, shape)
        fill(src, 5)
        dst = b2b.as_array(self.host(self.b, 2 * POOL * BLOCK), DT, shape)
        dst[...] = 0
        ls = self.layout(self.a, [src], name="kv-stk-src")
        self.layout(self.b, [dst], name="kv-stk-dst", export_name="kv-stk-dst")
        self.assertEqual([(s.tensor, s.offset, s.block_len) for s in ls.segments],
                         [("0[0]", 0, BLOCK), ("0[1]", POOL * BLOCK, BLOCK)])
        ls.transfer_blocks(self.db.peer_address, "kv-stk-dst", np.array([3, 0, 31], np.uint32), [1, 30, 2])
        for i, j in ((3, 1), (0, 30), (31, 2)):
            np.testing.assert_array_equal(dst[:, j], src[:, i])
        self.assertFalse(dst[:, 0].any())

    def test_half_heads_two_decode_ranks(self):
        """Prefill at TP=1 (4 heads, heads-first blocks), decode at TP=2: each
        decode rank receives its two heads of every block."""
        layers = 2
        shape = (POOL, HEADS, BS, HD)  # HND: heads first inside a block
        half = (POOL, HEADS // 2, BS, HD)
        src = {f"l{i}": b2b.as_array(self.host(self.a, POOL * BLOCK), DT, shape) for i in range(layers)}
        for i, t in enumerate(src.values()):
            fill(t, 40 + i)
        ranks = []
        for rank in range(2):
            d = {k: b2b.as_array(self.host(self.b, POOL * BLOCK // 2), DT, half) for k in src}
            for t in d.values():
                t[...] = 0
            self.layout(self.b, d, name=f"kv-dec{rank}", export_name=f"kv-dec{rank}")
            ranks.append(d)
        full = self.layout(self.a, src, name="kv-pre")
        lo = full.view("kv-pre-h0", heads=(0, 2), kv_layout="HND")
        hi = kv.register(self.a, src, name="kv-pre-h1", heads=(2, 2), kv_layout="HND")  # the one-call form
        self.cleanup.append(hi)
        self.assertEqual([s.block_len for s in lo.segments], [BLOCK // 2] * layers)
        self.assertEqual([s.offset for s in hi.segments], [BLOCK // 2] * layers)
        self.assertEqual([s.stride for s in hi.segments], [BLOCK] * layers)
        src_ids, dst_ids = [5, 6, 7, 20], [0, 9, 1, 31]
        lo.transfer_blocks(self.db.peer_address, "kv-dec0", src_ids, dst_ids)
        hi.transfer_blocks(self.db.peer_address, "kv-dec1", src_ids, dst_ids)
        for k in src:
            for i, j in zip(src_ids, dst_ids):
                np.testing.assert_array_equal(ranks[0][k][j], src[k][i, :2])
                np.testing.assert_array_equal(ranks[1][k][j], src[k][i, 2:])
            for j in set(range(POOL)) - set(dst_ids):
                self.assertFalse(ranks[0][k][j].any() or ranks[1][k][j].any())

    def test_bad_input(self):
        _, src, dst = self.pools(layers=1)
        t = next(iter(src.values()))
        with self.assertRaises(ValueError) as cm:  # heads and tokens swapped: a block is not contiguous
            kv.register(self.a, {"swapped": t.transpose(0, 2, 1, 3)}, name="bad")
        self.assertIn("'swapped'", str(cm.exception))
        self.assertIn("dim 2 has stride", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            kv.register(self.a, [t, t[:16]], name="bad")
        self.assertIn("16 blocks", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            kv.register(self.a, [np.zeros((POOL, 8), np.uint8)], name="bad")
        self.assertIn("not in a region this client registered", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            kv.register(self.a, [t.transpose(0, 2, 1, 3)], name="bad", heads=(3, 2), kv_layout="HND")
        self.assertIn("heads=(3, 2)", str(cm.exception))
        self.assertEqual([], [x.name for x in self.a.stub.ListLayouts(b2b.v1.b2b_pb2.ListLayoutsRequest()).layouts
                              if x.name == "bad"], "a refused register must leave nothing behind")

        ls = self.layout(self.a, src, name="kv-bad-src")
        self.layout(self.b, dst, name="kv-bad-dst", export_name="kv-bad-dst")
        before = {k: v.copy() for k, v in dst.items()}
        with self.assertRaises(b2b.InvalidArgumentError) as cm:  # the daemon's check
            ls.transfer_blocks(self.db.peer_address, "kv-bad-dst", [0, POOL], [1, 2])
        self.assertIn(f"local_ids[1] = {POOL}", str(cm.exception))
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            ls.transfer_blocks(self.db.peer_address, "kv-bad-dst", [0, 1], [4, 4])
        self.assertIn("remote_ids[1]", str(cm.exception))
        with self.assertRaises(b2b.InvalidArgumentError) as cm:  # the client's: not a uint32
            ls.transfer_blocks(self.db.peer_address, "kv-bad-dst", [0, -1], [1, 2])
        self.assertIn("local_ids[1] = -1", str(cm.exception))
        with self.assertRaises(b2b.NotFoundError):
            ls.transfer_blocks(self.db.peer_address, "no-such-layout", [0], [1])
        for k in dst:
            np.testing.assert_array_equal(dst[k], before[k], err_msg=f"{k} changed by a refused transfer")

    def test_heads_need_the_layout(self):
        """heads=(start, count) on vLLM's default NHD pool: refused unless
        told the layout, then refused with the fix (a head slice of an NHD
        block is one piece per token); nothing is registered either time."""
        _, src, _ = self.pools(layers=1)  # [POOL, BS, HEADS, HD]: NHD
        for kw, want in (({}, "kv_layout='HND'"), ({"kv_layout": "NHD"}, "VLLM_KV_CACHE_LAYOUT=HND"),
                         ({"kv_layout": 2}, "VLLM_KV_CACHE_LAYOUT=HND"), ({"kv_layout": "XYZ"}, "kv_layout='XYZ'")):
            with self.subTest(**kw):
                with self.assertRaises(ValueError) as cm:
                    kv.register(self.a, src, name="kv-nhd", heads=(0, 2), **kw)
                self.assertIn(want, str(cm.exception))
        names = [x.name for x in self.a.stub.ListLayouts(b2b.v1.b2b_pb2.ListLayoutsRequest()).layouts]
        self.assertNotIn("kv-nhd", names)

    def test_vllm_permuted_hnd_view(self):
        """vLLM's HND cache is dense heads-first storage that the attention
        backend sees as an NHD-shaped view (permuted strides). Registered by
        that view with kv_layout="NHD", each half of the heads goes to its
        decode rank, byte for byte; the whole-block layout moves the storage."""
        storage_shape = (POOL, HEADS, BS, HD)  # HND in memory
        region = self.host(self.a, POOL * BLOCK)
        storage = b2b.as_array(region, DT, storage_shape)
        fill(storage, 77)
        nhd_view = storage.transpose(0, 2, 1, 3)  # [POOL, BS, HEADS, HD], HND strides
        self.assertEqual(nhd_view.shape, (POOL, BS, HEADS, HD))
        with self.assertRaises(ValueError) as cm:  # untold, a permuted block is refused as before
            kv.register(self.a, [nhd_view], name="kv-perm-untold")
        self.assertIn("kv_layout='HND' or 'NHD'", str(cm.exception))
        ranks = []
        for rank in range(2):
            d = b2b.as_array(self.host(self.b, POOL * BLOCK // 2), DT, (POOL, HEADS // 2, BS, HD))
            d[...] = 0
            self.layout(self.b, [d], name=f"kv-perm-dec{rank}", export_name=f"kv-perm-dec{rank}")
            ranks.append(d)
        whole_dst = b2b.as_array(self.host(self.b, POOL * BLOCK), DT, storage_shape)
        whole_dst[...] = 0
        self.layout(self.b, [whole_dst], name="kv-perm-whole", export_name="kv-perm-whole")
        full = self.layout(self.a, [nhd_view], name="kv-perm", kv_layout="NHD")
        self.assertEqual([(s.offset, s.block_len, s.stride) for s in full.segments], [(0, BLOCK, BLOCK)])
        halves = [full.view(f"kv-perm-h{r}", heads=(2 * r, 2)) for r in range(2)]
        self.assertEqual([(s.offset, s.block_len) for h in halves for s in h.segments], [(0, BLOCK // 2), (BLOCK // 2, BLOCK // 2)])
        src_ids, dst_ids = [3, 4, 30], [9, 0, 31]
        for r in range(2):
            halves[r].transfer_blocks(self.db.peer_address, f"kv-perm-dec{r}", src_ids, dst_ids)
        full.transfer_blocks(self.db.peer_address, "kv-perm-whole", src_ids, dst_ids)
        for i, j in zip(src_ids, dst_ids):
            np.testing.assert_array_equal(ranks[0][j], storage[i, :2])  # heads 0, 1 of every token
            np.testing.assert_array_equal(ranks[1][j], storage[i, 2:])
            np.testing.assert_array_equal(whole_dst[j], storage[i])
        for j in set(range(POOL)) - set(dst_ids):
            self.assertFalse(ranks[0][j].any() or ranks[1][j].any() or whole_dst[j].any())

    def test_close_withdraws_region_exports(self):
        """close() un-exports the regions the layout exported: a peer can no
        longer write into the closed pool by the region's export name."""
        src_region, src, dst = self.pools(layers=1)
        ld = kv.register(self.b, dst, name="kv-close-dst", export_name="kv-close-dst")
        names = [r.export_name for r in ld.regions]
        self.assertTrue(all(names), names)
        # A write by region name works while the layout is open.
        self.a.batch_transfer(src_region, self.db.peer_address, names[0], [0], [0], block_size=BLOCK)
        ld.close()
        self.assertEqual([r.export_name for r in ld.regions], [""] * len(names))
        for n in names:
            with self.assertRaises(b2b.NotFoundError):
                self.a.batch_transfer(src_region, self.db.peer_address, n, [0], [BLOCK], block_size=BLOCK)
        ls = self.layout(self.a, src, name="kv-close-src")
        with self.assertRaises(b2b.NotFoundError):
            ls.transfer_blocks(self.db.peer_address, "kv-close-dst", [0], [1])
        for t in dst.values():
            self.assertFalse(t[1].any(), "a write landed in a closed pool")

    def test_exports_kept_for_another_open_layout(self):
        """A region exported by one layout stays exported while another open
        exported layout of the client covers it: re-exported under that
        layout's name (the closed layout's names are gone)."""
        src_region, _, dst = self.pools(layers=1)
        a = kv.register(self.b, dst, name="kv-keep-a", export_name="kv-keep-a")
        b_ = kv.register(self.b, dst, name="kv-keep-b", export_name="kv-keep-b")
        names = [r.export_name for r in a.regions]
        self.assertEqual([r.export_name for r in b_.regions], names, "one export per region, named after kv-keep-a")
        a.close()
        self.assertEqual([r.export_name for r in b_.regions], [f"kv-keep-b.{r.id}" for r in b_.regions],
                         "still needed by kv-keep-b")
        for n in names:
            with self.assertRaises(b2b.NotFoundError):
                self.a.batch_transfer(src_region, self.db.peer_address, n, [0], [0], block_size=BLOCK)
        b_.close()
        self.assertEqual([r.export_name for r in b_.regions], [""] * len(names))

    def test_pull_with_readers(self):
        """The decode side pulls: prefill exports its layout to readers only
        (read_only), decode calls transfer_blocks(op="read"); the pulled
        blocks' CRC32C equal the source's, sync and async, and a write into
        the read-only layout is refused."""
        _, src, dst = self.pools(layers=2)
        pre = self.layout(self.a, src, name="kv-pull-src", export_name="kv-pull-src", readers=["*"], read_only=True)
        dec = self.layout(self.b, dst, name="kv-pull-dst")
        self.assertTrue(all(r.export_name for r in pre.regions))
        remote_ids, local_ids = [3, 17, 4], [0, 30, 12]
        r = dec.transfer_blocks(self.da.peer_address, "kv-pull-src", local_ids, remote_ids, op="read")
        self.assertEqual(r.blocks, len(local_ids) * len(src))
        h = dec.transfer_blocks(self.da.peer_address, "kv-pull-src", [5], [6], op="read", wait=False)
        self.assertEqual(h.wait(timeout=30).blocks, len(src))
        local_ids, remote_ids = local_ids + [5], remote_ids + [6]

        def crcs(client, layout, ids):
            out = []
            for seg in layout.segments:
                offs = [seg.offset + i * seg.stride for i in ids]
                out.append(client.checksum(seg.region, offs, block_size=seg.block_len, per_block=True).block_digests.tolist())
            return out

        self.assertEqual(crcs(self.b, dec, local_ids), crcs(self.a, pre, remote_ids))
        for k, t in dst.items():
            for j in set(range(POOL)) - set(local_ids):
                self.assertFalse(t[j].any(), f"{k} block {j} changed: it was not pulled")
        wr = self.layout(self.b, {k: v for k, v in dst.items()}, name="kv-pull-back")
        with self.assertRaises(b2b.B2BError) as cm:  # read_only: no peer writes it
            wr.transfer_blocks(self.da.peer_address, "kv-pull-src", [0], [0])
        self.assertIn(cm.exception.code, (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.FAILED_PRECONDITION), str(cm.exception))

    def test_async_handle(self):
        _, src, dst = self.pools(layers=1)
        ls = self.layout(self.a, src, name="kv-async-src")
        self.layout(self.b, dst, name="kv-async-dst", export_name="kv-async-dst")
        try:
            h = ls.transfer_blocks(self.db.peer_address, "kv-async-dst", [1, 2, 3], [30, 20, 10], wait=False)
        except b2b.UnimplementedError:
            self.skipTest("the daemon has no StartTransfer yet (branch h-async)")
        r = h.wait(timeout=30)
        self.assertTrue(h.done())
        self.assertEqual(r.blocks, 3 * len(src))
        for k in src:
            for i, j in ((1, 30), (2, 20), (3, 10)):
                np.testing.assert_array_equal(dst[k][j], src[k][i])
        h.cancel()  # after the end: nothing to stop, and the outcome stays
        self.assertEqual(h.wait().blocks, r.blocks)
        bad = ls.transfer_blocks(self.db.peer_address, "kv-async-dst", [1, 2], [5, 5], wait=False)
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            bad.wait(timeout=30)
        self.assertIn("remote_ids[1]", str(cm.exception))
        self.assertTrue(bad.failed)
        # A cancel is answered only once the transfer has ended: either it won the race
        # (its result stands) or it was cancelled (wait raises CANCELLED). Never "running".
        c = ls.transfer_blocks(self.db.peer_address, "kv-async-dst", list(range(POOL)), list(range(POOL)), wait=False)
        c.cancel()
        self.assertTrue(c.done())
        try:
            self.assertEqual(c.wait().blocks, POOL * len(src))
        except b2b.B2BError as e:
            self.assertEqual(e.code, grpc.StatusCode.CANCELLED, str(e))


# ---------------------------------------------------------------------------
# CUDA grouping, with stand-ins for torch tensors and the driver.


class FakeDevice:
    def __init__(self, index):
        self.index = index


class FakeCudaTensor:
    """What kv reads of a torch CUDA tensor: data_ptr, shape, stride, element_size."""

    is_cuda = True

    def __init__(self, ptr, shape, elem=2, stride=None, device=0):
        self.ptr, self.shape, self.elem, self.device = ptr, tuple(shape), elem, FakeDevice(device)
        if stride is None:
            stride, acc = [], 1
            for n in reversed(self.shape):
                stride.insert(0, acc)
                acc *= n
        self._stride = tuple(stride)

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return self._stride

    def element_size(self):
        return self.elem


class FakeClient:
    def __init__(self):
        self.registered, self.layouts, self.exports = [], [], []
        self.timeout = 1

    def _register_cuda_share(self, keep, share, export_name, export_to, persist, dereg, readers=(), read_only=False):
        r = SimpleNamespace(id=f"r{len(self.registered)}", export_name=export_name or "", keep=keep, share=share,
                            closed=False)
        r.close = lambda deregister=True: setattr(r, "closed", True)
        self.registered.append(r)
        return r

    def register_layout(self, name, segments, num_blocks, export_name="", export_to=(), persist=False, readers=(), read_only=False):
        self.layouts.append((name, [(s[0].id,) + tuple(s[1:]) for s in segments], num_blocks, export_name))

    def deregister_layout(self, name):
        pass

    def export(self, r, name, export_to=(), readers=(), read_only=False):
        self.exports.append((r.id, name))


ALLOCS = {0: [(0x10000, 1 << 20), (0x200000, 1 << 20)], 1: [(0x10000, 1 << 20)]}


def fake_range(device, ptr):
    for base, size in ALLOCS[device]:
        if base <= ptr < base + size:
            return base, size
    raise OSError(f"cuMemGetAddressRange: CUDA_ERROR_INVALID_VALUE for {ptr:#x}")


def fake_share(tensor, base, start, size):
    return _cuda.CudaShare(tensor.device.index, b"h" * 64, start - base, size, None, 0, None)


class CudaGroupingTest(unittest.TestCase):
    def register(self, tensors, **kw):
        c = FakeClient()
        with mock.patch.object(_cuda, "address_range", fake_range), mock.patch.object(_cuda, "share_range", fake_share):
            lay = kv.register(c, tensors, **kw)
        return c, lay

    def test_views_of_one_allocation_share_a_region(self):
        blk = 16 * 2 * 64 * 2  # [block_size 16, heads 2, head_dim 64] fp16
        n = 8
        # Two layers as views of allocation A (the second 4 KiB in), one in allocation B, one on device 1.
        ts = {
            "l0": FakeCudaTensor(0x10000 + 4096, (n, 16, 2, 64)),
            "l1": FakeCudaTensor(0x10000 + 4096 + n * blk, (n, 16, 2, 64)),
            "l2": FakeCudaTensor(0x200000, (n, 16, 2, 64)),
            "l3": FakeCudaTensor(0x10000, (n, 16, 2, 64), device=1),
        }
        c, lay = self.register(ts, name="g", export_name="g")
        self.assertEqual(len(c.registered), 3, "one region per distinct allocation")
        a = c.registered[0]
        self.assertEqual((a.share.offset, a.share.size), (4096, 2 * n * blk), "the region spans its tensors only")
        self.assertEqual(len(a.keep), 2)
        self.assertEqual(c.layouts, [("g", [("r0", 0, blk, blk), ("r0", n * blk, blk, blk), ("r1", 0, blk, blk),
                                            ("r2", 0, blk, blk)], n, "g")])
        self.assertEqual([r.export_name for r in c.registered], ["g.r0", "g.r1", "g.r2"])
        lay.close()
        self.assertTrue(all(r.closed for r in c.registered))

    def test_stacked_and_strided_pool(self):
        # vLLM's [2, num_blocks, block_size, heads, head_dim], and a pool whose blocks are padded (stride > block).
        st = FakeCudaTensor(0x200000, (2, 4, 16, 1, 8), elem=4)
        c, lay = self.register([st], name="s")
        blk = 16 * 8 * 4
        self.assertEqual(c.layouts[0][1], [("r0", 0, blk, blk), ("r0", 4 * blk, blk, blk)])
        padded = FakeCudaTensor(0x200000, (4, 16, 8), elem=4, stride=(256, 8, 1))
        c, lay = self.register([padded], name="p")
        self.assertEqual(c.layouts[0][1], [("r0", 0, 16 * 8 * 4, 1024)])
        with self.assertRaises(ValueError) as cm:
            self.register([FakeCudaTensor(0x200000, (4, 16, 8), stride=(128, 1, 16))], name="nc")
        self.assertIn("dim 2 has stride 32 bytes, want 2", str(cm.exception))


class PackIdsTest(unittest.TestCase):
    def test_pack(self):
        self.assertEqual(kv.pack_ids([1, 2]), b"\x01\x00\x00\x00\x02\x00\x00\x00")
        self.assertEqual(kv.pack_ids(np.array([7], np.int64)), b"\x07\x00\x00\x00")
        for bad, msg in (([2**32], "ids[0] = 4294967296"), (np.array([0, -2]), "ids[1] = -2")):
            with self.assertRaises(b2b.InvalidArgumentError) as cm:
                kv.pack_ids(bad)
            self.assertIn(msg, str(cm.exception))
            self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(TypeError):
            kv.pack_ids([1.5])


if __name__ == "__main__":
    unittest.main()
