"""Block-id transfers (register_layout / transfer_blocks) between two real daemons."""

from __future__ import annotations

import unittest

import daemon_harness

import numpy as np

import b2b

SEGMENTS, POOL, BLOCK = 4, 64, 1024


class LayoutTest(daemon_harness.DaemonPair):
    def test_blocks_land_at_other_ids(self):
        rng = np.random.default_rng(23)
        srcs = [self.a.register_host(POOL * BLOCK) for _ in range(SEGMENTS)]
        dsts = [self.b.register_host(POOL * BLOCK, f"py-kv-{i}") for i in range(SEGMENTS)]
        try:
            for s in srcs:
                s.memoryview[:] = rng.integers(0, 256, POOL * BLOCK, dtype=np.uint8).tobytes()
            self.a.register_layout("py-src", [(s, 0, BLOCK, BLOCK) for s in srcs], POOL)
            self.b.register_layout("py-dst", [(d, 0, BLOCK, BLOCK) for d in dsts], POOL, export_name="py-dst")
            src_ids = [int(x) for x in rng.permutation(POOL)[:16]]
            dst_ids = [int(x) for x in rng.permutation(POOL)[:16]]
            r = self.a.transfer_blocks("py-src", self.db.peer_address, "py-dst", src_ids, dst_ids)
            self.assertEqual(r.blocks, 16 * SEGMENTS)
            for s, d in zip(srcs, dsts):
                for i, j in zip(src_ids, dst_ids):
                    self.assertEqual(bytes(d.memoryview[j * BLOCK:(j + 1) * BLOCK]), bytes(s.memoryview[i * BLOCK:(i + 1) * BLOCK]))
            with self.assertRaises(b2b.InvalidArgumentError) as cm:
                self.a.transfer_blocks("py-src", self.db.peer_address, "py-dst", [1, 2], [5, 5])
            self.assertIn("remote_ids[1]", str(cm.exception))
            # A notification is bytes: an int is refused, not sent as that many zero bytes.
            with self.assertRaisesRegex(TypeError, "notification"):
                self.a.transfer_blocks("py-src", self.db.peer_address, "py-dst", [1], [2], notification=3)
        finally:
            for c, name in ((self.a, "py-src"), (self.b, "py-dst")):
                try:
                    c.deregister_layout(name)
                except b2b.NotFoundError:
                    pass
            for r in srcs + dsts:
                r.close()


if __name__ == "__main__":
    unittest.main()
