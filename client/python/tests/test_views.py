"""numpy (and, where importable, torch) views over host regions: an
application's pool allocated in a region and moved by the daemons."""

from __future__ import annotations

import importlib.util
import unittest

import daemon_harness

import numpy as np

import b2b

HAVE_TORCH = importlib.util.find_spec("torch") is not None


class Views(daemon_harness.DaemonPair):
    names = ("va", "vb")

    def test_array_is_the_region(self):
        with self.a.register_host(1 << 16) as r:
            f = b2b.as_array(r, np.float32, (16, 256), offset=4096)
            f[3, 7] = 1.5
            raw = r.array[4096 + (3 * 256 + 7) * 4: 4096 + (3 * 256 + 8) * 4]
            self.assertEqual(raw.view(np.float32)[0], 1.5)
            whole = b2b.as_array(r, np.uint64)
            self.assertEqual(whole.shape, ((1 << 16) // 8,))

    def test_refusals_name_the_value_and_limit(self):
        with self.a.register_host(4096) as r:
            cases = [
                (dict(dtype=np.uint8, shape=4097), ["4097", "4096 bytes"]),
                (dict(dtype=np.float32, shape=(10,), offset=2), ["offset 2", "element size 4"]),
                (dict(dtype=np.uint8, shape=1, offset=5000), ["offset 5000", "past the end"]),
                (dict(dtype=np.uint8, shape=(-1, 4)), ["negative"]),
                (dict(dtype=np.uint8, shape=1, offset=-8), ["offset -8"]),
            ]
            for kw, words in cases:
                with self.subTest(kw=kw):
                    with self.assertRaises(ValueError) as cm:
                        b2b.as_array(r, **kw)
                    for w in words:
                        self.assertIn(w, str(cm.exception))
            with self.assertRaises(TypeError):
                b2b.as_array(r.info, np.uint8)
            pool = b2b.as_array(r, np.uint8, (4, 1024))
            with self.assertRaises(ValueError) as cm:
                b2b.block_offsets(r, pool, [0, 4])
            self.assertIn("block id 4", str(cm.exception))
            with self.assertRaises(ValueError):
                b2b.block_offsets(r, np.zeros((4, 8), np.uint8))  # not in the region

    def test_pool_moves_between_daemons(self):
        # A "KV pool" of 64 blocks of (2, 4, 16) float16 at each end, inside
        # regions with a 4 KiB header; every other block moved to reversed slots.
        shape = (64, 2, 4, 16)
        block = int(np.prod(shape[1:])) * 2
        size = 4096 + shape[0] * block
        export = "views-pool"
        with self.b.register_host(size, export) as dr, self.a.register_host(size) as sr:
            src = b2b.as_array(sr, np.float16, shape, offset=4096)
            dst = b2b.as_array(dr, np.float16, shape, offset=4096)
            src[:] = np.random.default_rng(1).standard_normal(shape).astype(np.float16)
            dst[:] = 0
            ids = np.arange(0, 64, 2)
            so = b2b.block_offsets(sr, src, ids)
            do = b2b.block_offsets(dr, dst, ids[::-1])
            self.assertEqual(int(so[0]), 4096)
            self.assertEqual(int(so[1] - so[0]), 2 * block)
            r = self.a.batch_transfer(sr, self.db.peer_address, export, so, do, block_size=block, timeout=30)
            self.assertEqual(r.blocks, len(ids))
            np.testing.assert_array_equal(dst[ids[::-1]], src[ids])
            self.assertFalse(dst[1::2].any(), "blocks not sent must stay zero")

    def test_view_outlives_close(self):
        r = self.a.register_host(4096)
        v = b2b.as_array(r, np.uint8, 4096)
        v[:] = 9
        r.close()
        self.assertTrue((v == 9).all())  # the mapping stays while the view lives

    @unittest.skipIf(HAVE_TORCH, "torch is importable: the torch test runs instead")
    def test_as_tensor_without_torch(self):
        with self.a.register_host(4096) as r:
            with self.assertRaises(ImportError) as cm:
                b2b.as_tensor(r)
            self.assertIn("as_array", str(cm.exception))

    @unittest.skipUnless(HAVE_TORCH, "torch is not installed")
    def test_as_tensor(self):
        import torch

        with self.a.register_host(1 << 16) as r:
            t = b2b.as_tensor(r, torch.float32, (16, 256), offset=4096)
            t[2, 5] = 2.5
            self.assertEqual(b2b.as_array(r, np.float32, (16, 256), offset=4096)[2, 5], 2.5)
            offs = b2b.block_offsets(r, t, [0, 3])
            self.assertEqual(offs.tolist(), [4096, 4096 + 3 * 1024])


if __name__ == "__main__":
    unittest.main()
