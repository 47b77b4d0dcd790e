"""b2b.kv region exports shared by several layouts (docs/kv.md, Exports and
Pulls), and its checks of ``heads`` and of views of a closed layout.

A region has one export, so when layouts (or views) over the same regions are
exported, the region's export grants what every open one needs, and a closing
layout's grants do not outlive it. Two real daemons for the transfers; a
stand-in client (no daemon) for the tables."""

from __future__ import annotations

import unittest
from types import SimpleNamespace
from unittest import mock

import daemon_harness

import grpc
import numpy as np

import b2b
from b2b import _cuda, kv
from b2b.v1 import b2b_pb2 as pb

POOL, HEADS, BS, HD = 16, 4, 4, 8  # HND blocks: 4 heads x 4 tokens x 8 dims of uint32
DT = np.dtype(np.uint32)
BLOCK = HEADS * BS * HD * DT.itemsize  # 512 bytes
HALF = BLOCK // 2  # two heads


class KVGrantsTest(daemon_harness.KVPair):
    def pool(self, client, heads=HEADS, seed=None, export=None):
        """An HND pool in a region of its own: a pattern (``seed``) or zeros."""
        r = self.host(client, POOL * heads * BS * HD * DT.itemsize, export)
        a = b2b.as_array(r, DT, (POOL, heads, BS, HD))
        a[...] = 0 if seed is None else np.random.default_rng(seed).integers(1, 2**32, a.shape, dtype=DT)
        return r, a

    def layouts_on_a(self):
        return {x.name for x in self.a.stub.ListLayouts(pb.ListLayoutsRequest()).layouts}

    def read_region(self, local, name):
        """Pull block 0 of the peer's region exported as ``name``."""
        return self.b.batch_transfer(local, self.da.peer_address, name, [0], [0], block_size=HALF, op="read", timeout=10)

    def write_region(self, local, name, offset):
        return self.b.batch_transfer(local, self.da.peer_address, name, [0], [offset], block_size=HALF, timeout=10)

    def test_view_readers_over_a_parent_without_readers(self):
        """A view with readers over a parent exported without them can be
        pulled; the parent stays writable; the view's readers end with it."""
        _, src = self.pool(self.a, seed=1)
        parent = self.layout(self.a, [src], name="g-vr", export_name="g-vr", kv_layout="HND")
        view = parent.view("g-vr-h0", heads=(0, 2), export_name="g-vr-h0", readers=["*"])
        half_region, half = self.pool(self.b, heads=2)
        dst = self.layout(self.b, [half], name="g-vr-dst", kv_layout="HND")
        dst.transfer_blocks(self.da.peer_address, "g-vr-h0", [0, 1], [3, 5], op="read", timeout=10)
        np.testing.assert_array_equal(half[0], src[3, :2])
        np.testing.assert_array_equal(half[1], src[5, :2])
        self.assertFalse(half[2:].any(), "only the pulled blocks changed")
        _, mine = self.pool(self.b, seed=2)
        whole = self.layout(self.b, [mine], name="g-vr-whole", kv_layout="HND")
        whole.transfer_blocks(self.da.peer_address, "g-vr", [2], [7], timeout=10)  # the parent: still written into
        np.testing.assert_array_equal(src[7], mine[2])
        names = [r.export_name for r in parent.regions]
        view.close()
        self.assertEqual([r.export_name for r in parent.regions], names, "still the parent's export")
        with self.assertRaises(b2b.PermissionDeniedError) as cm:  # the view's readers did not outlive it
            self.read_region(half_region, names[0])
        self.assertIn("grants no readers", str(cm.exception))

    def test_read_only_layout_takes_over_a_writable_ones_regions(self):
        """Two layouts over one pool, L1 writable without readers and L2
        read-only with readers: L2 can be pulled; once L1 closed, no peer
        writes into the pool by any region export name, and L2 can still be
        pulled."""
        _, src = self.pool(self.a, seed=3)
        before = src.copy()
        l1 = self.layout(self.a, [src], name="g-l1", export_name="g-e1", kv_layout="HND")
        l2 = self.layout(self.a, [src], name="g-l2", export_name="g-e2", kv_layout="HND", readers=["*"], read_only=True)
        local, mine = self.pool(self.b)
        la = self.layout(self.b, [mine], name="g-heir-dst", kv_layout="HND")

        def pull(i, j):
            la.transfer_blocks(self.da.peer_address, "g-e2", [i], [j], op="read", timeout=10)
            np.testing.assert_array_equal(mine[i], before[j])

        pull(0, 3)
        old = [r.export_name for r in l2.regions]
        self.assertEqual(old, [f"g-e1.{r.id}" for r in l1.regions], "one export per region, named after L1")
        l1.close()
        new = [r.export_name for r in l2.regions]
        self.assertEqual(new, [f"g-e2.{r.id}" for r in l2.regions], "re-exported as L2's")
        mine[...] = 0xEE
        for name in old + new:
            with self.assertRaises(b2b.B2BError) as cm:
                self.write_region(local, name, 5 * BLOCK)
            want = grpc.StatusCode.NOT_FOUND if name in old else grpc.StatusCode.PERMISSION_DENIED
            self.assertEqual(cm.exception.code, want, f"{name}: {cm.exception}")
        with self.assertRaises(b2b.PermissionDeniedError):
            la.transfer_blocks(self.da.peer_address, "g-e2", [0], [6], timeout=10)
        np.testing.assert_array_equal(src, before, "a peer wrote into the read-only pool")
        pull(1, 4)

    def test_closing_the_reader_layout_narrows_the_export(self):
        """L2 (readers, read-only) closes first: the region goes back to L1's
        grants, writable under L1's name, readers gone."""
        _, src = self.pool(self.a, seed=4)
        l1 = self.layout(self.a, [src], name="g-n1", export_name="g-n1", kv_layout="HND")
        l2 = self.layout(self.a, [src], name="g-n2", export_name="g-n2", kv_layout="HND", readers=["*"], read_only=True)
        local, mine = self.pool(self.b, seed=5)
        name = l1.regions[0].export_name
        self.read_region(local, name)  # granted while L2 is open
        l2.close()
        self.assertEqual(l1.regions[0].export_name, name)
        with self.assertRaises(b2b.PermissionDeniedError):
            self.read_region(local, name)
        self.write_region(local, name, 9 * BLOCK)
        np.testing.assert_array_equal(src.reshape(POOL, -1)[9, :HALF // DT.itemsize],
                                      mine.reshape(POOL, -1)[0, :HALF // DT.itemsize])

    def test_a_region_the_caller_exported_keeps_its_export(self):
        """b2b.kv changes only the exports it made: a layout that needs more
        than the caller's own export of a region is refused at register
        time, naming the region, the export and the grant."""
        region, src = self.pool(self.a, seed=6, export="g-own")
        before = self.layouts_on_a()
        for kw, grant in ((dict(readers=["*"], read_only=True), "readers ['*']"),):
            with self.assertRaises(b2b.InvalidArgumentError) as cm:
                kv.register(self.a, [src], name="g-own-l", export_name="g-own-l", kv_layout="HND", **kw)
            msg = str(cm.exception)
            for part in (f"region {region.id}", "'g-own'", "'g-own-l'", grant):
                self.assertIn(part, msg)
        self.assertEqual(self.layouts_on_a(), before, "nothing registered")
        self.assertEqual(region.export_name, "g-own")
        ok = self.layout(self.a, [src], name="g-own-w", export_name="g-own-w", kv_layout="HND")  # writable: served
        ok.close()
        self.assertEqual(region.export_name, "g-own", "the caller's export is left as it was")

    def test_view_of_a_closed_layout_is_refused(self):
        """As transfer_blocks is: same class and message, nothing registered."""
        _, src = self.pool(self.a, seed=7)
        la = kv.register(self.a, [src], name="g-closed", kv_layout="HND")
        la.close()
        before = self.layouts_on_a()
        with self.assertRaises(b2b.InvalidArgumentError) as tb:
            la.transfer_blocks(self.db.peer_address, "x", [0], [0])
        for kw in ({}, dict(export_name="g-closed-v", readers=["*"])):
            with self.assertRaises(b2b.InvalidArgumentError) as cm:
                la.view("g-closed-v", heads=(0, 2), **kw)
            self.assertTrue(str(cm.exception).startswith(str(tb.exception)), str(cm.exception))
            self.assertIn("'g-closed-v'", str(cm.exception))
        self.assertEqual(self.layouts_on_a(), before)
        la.close()
        self.assertEqual(self.layouts_on_a(), before)


# ---------------------------------------------------------------------------
# Tables, with a stand-in client and CUDA tensors (test_kv.py's kind).


class FakeTensor:
    is_cuda = True

    def __init__(self, ptr, shape):
        self.ptr, self.shape, self.device = ptr, tuple(shape), SimpleNamespace(index=0)

    def data_ptr(self):
        return self.ptr

    def stride(self):
        out, acc = [], 1
        for n in reversed(self.shape):
            out.insert(0, acc)
            acc *= n
        return tuple(out)

    def element_size(self):
        return 2


class FakeClient:
    """Records registrations and exports; an export sets the region's name."""

    def __init__(self):
        self.registered, self.layouts, self.exports = [], [], []
        self.timeout = 1

    def _register_cuda_share(self, keep, share, export_name, export_to, persist, dereg, readers=(), read_only=False):
        r = SimpleNamespace(id=f"r{len(self.registered)}", export_name=export_name or "", closed=False)
        r.close = lambda deregister=True: setattr(r, "closed", True)
        self.registered.append(r)
        if export_name:
            self.exports.append((r.id, export_name, tuple(export_to), tuple(readers), bool(read_only)))
        return r

    def register_layout(self, name, segments, num_blocks, export_name="", **kw):
        self.layouts.append(name)

    def deregister_layout(self, name):
        self.layouts.remove(name)

    def export(self, r, name, export_to=(), readers=(), read_only=False):
        r.export_name = name or ""
        self.exports.append((r.id, name, tuple(export_to), tuple(readers), bool(read_only)))


def fake_range(device, ptr):
    return 0x10000, 1 << 20


def fake_share(tensor, base, start, size):
    return _cuda.CudaShare(0, b"h" * 64, start - base, size, None, 0, None)


class TableTest(unittest.TestCase):
    def setUp(self):
        for p in (mock.patch.object(_cuda, "address_range", fake_range), mock.patch.object(_cuda, "share_range", fake_share)):
            p.start()
            self.addCleanup(p.stop)
        self.c = FakeClient()
        self.base = kv.register(self.c, [FakeTensor(0x10000, (8, HEADS, BS, HD))], name="u0", export_name="u0",
                                kv_layout="HND")
        self.addCleanup(self.base.close)

    def export(self):
        """The region's export as last set: (name, export_to, readers, read_only)."""
        return self.c.exports[-1][1:]

    def test_union_of_grants(self):
        """The region's one export grants what every open exported layout over
        it needs; closing them in turn narrows it back."""
        W, RO = dict(), dict(read_only=True)
        cases = [
            # grants of views u1, u2 over u0 (writable, every peer), and the union after each
            ("readers join", [dict(readers=["*"], **RO)], [((), ("*",), False)]),
            ("writers stay any peer", [dict(export_to=["x"])], [((), (), False)]),
            ("readers union", [dict(readers=["p"], **RO), dict(readers=["q", "p"])], [((), ("p",), False), ((), ("p", "q"), False)]),
            ("star absorbs", [dict(readers=["p"]), dict(readers=["*", "q"], **RO)], [((), ("p",), False), ((), ("*",), False)]),
        ]
        for label, views, want in cases:
            with self.subTest(label):
                opened = []
                for i, (grants, w) in enumerate(zip(views, want)):
                    opened.append(self.base.view(f"u{i + 1}", heads=(0, HEADS), export_name=f"u{i + 1}", **grants))
                    self.assertEqual(self.export(), ("u0.r0",) + w)
                for v in reversed(opened):
                    v.close()
                self.assertEqual(self.export(), ("u0.r0", (), (), False), "back to u0's own grants")
                self.assertEqual(self.c.layouts, ["u0"])

    def test_union_without_a_writable_base(self):
        cases = [
            # (base grants, view grants, the union)
            (dict(export_to=["x"]), dict(export_to=["y"]), (("x", "y"), (), False)),
            (dict(export_to=["x"]), dict(readers=["p"], read_only=True), (("x",), ("p",), False)),
            (dict(readers=["p"], read_only=True), dict(readers=["q"], read_only=True), ((), ("p", "q"), True)),
            (dict(readers=["p"], read_only=True), dict(export_to=["y"]), (("y",), ("p",), False)),
        ]
        for base, view, want in cases:
            with self.subTest(base=base, view=view):
                c = FakeClient()
                lay = kv.register(c, [FakeTensor(0x10000, (8, HEADS, BS, HD))], name="w0", export_name="w0",
                                  kv_layout="HND", **base)
                own = c.exports[-1][1:]
                v = lay.view("w1", heads=(0, 2), export_name="w1", **view)
                self.assertEqual(c.exports[-1][1:], ("w0.r0",) + want)
                v.close()
                self.assertEqual(c.exports[-1][1:], own)
                lay.close()

    def test_union_over_the_limit_is_refused(self):
        many = [f"p{i}" for i in range(600)]
        v1 = self.base.view("u1", heads=(0, HEADS), export_name="u1", readers=many)
        n = len(self.c.exports)
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            self.base.view("u2", heads=(0, HEADS), export_name="u2", readers=[f"q{i}" for i in range(600)])
        msg = str(cm.exception)
        for part in ("region r0", "'u0'", "'u2'", "readers", "1200 peers", "1024"):
            self.assertIn(part, msg)
        self.assertEqual(len(self.c.exports), n, "no export changed")
        self.assertEqual(self.c.layouts, ["u0", "u1"], "u2 not registered")
        v1.close()

    def test_heads_must_be_ints(self):
        """heads=(start, count) of ints (numpy's too); anything else is refused
        naming heads and the value, before anything is registered."""
        bad = [
            ((0.5, 1.7), "start 0.5 is float"),
            ((0, 2.0), "count 2.0 is float"),
            ((True, True), "start True is bool"),
            ((np.bool_(False), 2), "start False is bool"),
            (("0", "2"), "start '0' is str"),
            ("02", "start '0' is str"),
            ((0, 2, 9), "want (start, count)"),
            (2, "want (start, count)"),
            ((np.float64(0), 2), "is float64"),
        ]
        for heads, part in bad:
            for how in ("register", "view"):
                with self.subTest(heads=heads, how=how):
                    c = self.c if how == "view" else FakeClient()
                    n_layouts, n_regions = len(c.layouts), len(c.registered)
                    with self.assertRaises(b2b.InvalidArgumentError) as cm:
                        if how == "view":
                            self.base.view("h", heads=heads)
                        else:
                            kv.register(c, [FakeTensor(0x10000, (8, HEADS, BS, HD))], name="h", heads=heads, kv_layout="HND")
                    self.assertIn(f"heads={heads!r}", str(cm.exception))
                    self.assertIn(part, str(cm.exception))
                    self.assertEqual((len(c.layouts), len(c.registered)), (n_layouts, n_regions), "nothing registered")
        for heads in ((1, 2), (np.int64(1), np.int32(2))):
            v = self.base.view("ok", heads=heads)
            self.assertEqual(v.heads, (1, 2))
            head = BS * HD * 2  # one head of a FakeTensor block, in bytes
            self.assertEqual([(s.offset, s.block_len) for s in v.segments], [(head, 2 * head)])
            v.close()


if __name__ == "__main__":
    unittest.main()
