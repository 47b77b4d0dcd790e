"""End-to-end tests against two real b2bd daemons (TCP transport, loopback)."""

from __future__ import annotations

import array
import mmap
import os
import time
import unittest
import zlib

import daemon_harness

import numpy as np

import b2b


def _crc32c_table():
    poly, table = 0x82F63B78, []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """Reference CRC32C (Castagnoli), independent of the daemon; for small inputs."""
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def layout(n: int, size: int, rng: np.random.Generator):
    """n blocks of size bytes at random, non-adjacent slots (as the Go e2e test)."""
    slot = size + 64
    return rng.permutation(n).astype(np.uint64) * np.uint64(slot), n * slot


def gather(buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The listed blocks of buf, concatenated (vectorised)."""
    offsets = offsets.astype(np.int64)
    lengths = lengths.astype(np.int64)
    starts = np.cumsum(lengths) - lengths
    idx = np.repeat(offsets - starts, lengths) + np.arange(int(lengths.sum()))
    return buf[idx]


def covered(size: int, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Boolean mask of the bytes the blocks cover."""
    m = np.zeros(size, dtype=bool)
    lengths = lengths.astype(np.int64)
    starts = np.cumsum(lengths) - lengths
    m[np.repeat(offsets.astype(np.int64) - starts, lengths) + np.arange(int(lengths.sum()))] = True
    return m


class TwoDaemons(daemon_harness.DaemonPair):
    """Daemons a (source) and b (destination), with a per-test random
    generator and the byte and checksum comparison of blocks."""

    def setUp(self):
        self.rng = np.random.default_rng(zlib.crc32(self.id().encode()))

    def random_fill(self, region: b2b.HostRegion) -> None:
        region.array[:] = self.rng.integers(0, 256, region.size, dtype=np.uint8)

    def assert_blocks_equal(self, src, so, dst, do, lengths):
        """Byte comparison plus per-block CRC32C from both daemons."""
        lengths = np.broadcast_to(np.asarray(lengths, dtype=np.uint64), so.shape)
        got, want = gather(dst.array, do, lengths), gather(src.array, so, lengths)
        if not np.array_equal(got, want):
            # Name the first bad block.
            ends = np.cumsum(lengths.astype(np.int64))
            first = int(np.searchsorted(ends, int(np.argmax(got != want)), side="right"))
            self.fail(f"block {first} differs (src {so[first]}, dst {do[first]}, len {lengths[first]})")
        cs = self.a.checksum(src, so, lengths=lengths, per_block=True)
        cd = self.b.checksum(dst, do, lengths=lengths, per_block=True)
        self.assertEqual(cs.blocks, len(so))
        self.assertEqual(cs.bytes, int(lengths.sum()))
        self.assertEqual(cs.algorithm, "crc32c")
        self.assertEqual(cs.block_digests.dtype, np.dtype("<u8"))
        self.assertEqual(cs.block_digests.shape, (len(so),))
        np.testing.assert_array_equal(cs.block_digests, cd.block_digests)
        self.assertEqual(cs.digest, cd.digest)
        return cs


class TransferTest(TwoDaemons):
    def test_10k_uniform_blocks_verified(self):
        n, size = 10000, 128
        so, src_size = layout(n, size, self.rng)
        do, dst_size = layout(n, size, self.rng)
        before_a = self.a.status()
        with self.a.register_host(src_size) as src, self.b.register_host(dst_size, "uniform-dst") as dst:
            self.random_fill(src)
            self.assertFalse(dst.array.any())  # fresh shm is zeroed
            r = self.a.batch_transfer(src, self.peer_b, "uniform-dst", so, do, block_size=size)
            self.assertEqual((r.blocks, r.bytes, r.transport), (n, n * size, "tcp"))
            self.assertGreater(r.elapsed, 0)
            cs = self.assert_blocks_equal(src, so, dst, do, size)
            # The daemon's per-block digests are real CRC32Cs of the blocks' bytes
            # (checked on a sample against a local reference implementation) ...
            for k in self.rng.choice(n, 25, replace=False):
                block = dst.array[int(do[k]) : int(do[k]) + size].tobytes()
                self.assertEqual(int(cs.block_digests[k]), crc32c(block))
            # ... and the batch digest is the CRC32C of the packed per-block digests.
            self.assertEqual(cs.digest, crc32c(cs.block_digests.astype("<u8").tobytes()))
            # Nothing outside the listed blocks was written.
            outside = ~covered(dst_size, do, np.full(n, size, dtype=np.uint64))
            self.assertFalse(dst.array[outside].any())
            # A one-byte change shows up in exactly that block's digest.
            k = int(self.rng.integers(n))
            dst.array[int(do[k]) + 5] ^= 0xFF
            cd = self.b.checksum(dst, do, block_size=size, per_block=True)
            self.assertEqual(np.flatnonzero(cd.block_digests != cs.block_digests).tolist(), [k])
            self.assertNotEqual(cd.digest, cs.digest)
        after_a = self.a.status()
        self.assertEqual(after_a.batches_sent - before_a.batches_sent, 1)
        self.assertEqual(after_a.bytes_sent - before_a.bytes_sent, n * size)

    def test_warm_then_batches(self):
        """warm() moves no byte and names the transport; batches after it
        land; it is refused as batch_transfer refuses the same request."""
        n, size = 500, 4096
        so, src_size = layout(n, size, self.rng)
        do, dst_size = layout(n, size, self.rng)
        with self.a.register_host(src_size) as src, self.b.register_host(dst_size, "warm-dst", readers=["*"]) as dst:
            self.random_fill(src)
            self.random_fill(dst)
            before = dst.array.copy(), src.array.copy()
            for op in ("write", "read", "write"):
                self.assertEqual(self.a.warm(src, self.peer_b, "warm-dst", transport="tcp", op=op), "tcp")
            np.testing.assert_array_equal(dst.array, before[0])
            np.testing.assert_array_equal(src.array, before[1])
            self.a.batch_transfer(src, self.peer_b, "warm-dst", so, do, block_size=size)
            self.assert_blocks_equal(src, so, dst, do, size)
            with self.assertRaises(b2b.NotFoundError) as w:
                self.a.warm(src, self.peer_b, "no-such-export")
            with self.assertRaises(b2b.NotFoundError) as g:
                self.a.batch_transfer(src, self.peer_b, "no-such-export", so[:1], do[:1], block_size=1)
            self.assertEqual(str(w.exception), str(g.exception))

    def test_pull_op_read_verified(self):
        """op="read" pulls the peer's blocks (at dst offsets) into the local
        region (at src offsets); an export without readers refuses it."""
        n, size = 2000, 4096
        lo, local_size = layout(n, size, self.rng)
        ro, remote_size = layout(n, size, self.rng)
        with self.a.register_host(local_size) as local, self.b.register_host(
            remote_size, "pull-src", readers=["*"]
        ) as remote, self.b.register_host(remote_size, "pull-wo") as write_only:
            self.random_fill(remote)
            r = self.a.batch_transfer(local, self.peer_b, "pull-src", lo, ro, block_size=size, op="read")
            self.assertEqual((r.blocks, r.bytes, r.transport), (n, n * size, "tcp"))
            # The remote is the source: compare its blocks with the local ones.
            self.assert_blocks_equal_across(remote, ro, local, lo, size)
            local.array[:] = 0
            with self.assertRaises(b2b.PermissionDeniedError):
                self.a.batch_transfer(local, self.peer_b, "pull-wo", lo, ro, block_size=size, op="read")
            self.assertFalse(local.array.any())
            with self.assertRaises(b2b.InvalidArgumentError):
                self.a.batch_transfer(local, self.peer_b, "pull-src", lo, ro, block_size=size, op="sideways")

    def assert_blocks_equal_across(self, src, so, dst, do, size):
        lengths = np.full(len(so), size, dtype=np.uint64)
        np.testing.assert_array_equal(gather(dst.array, do, lengths), gather(src.array, so, lengths))

    def test_receiver_counters(self):
        with self.a.register_host(1 << 16) as src, self.b.register_host(1 << 16, "count-dst") as dst:
            before = self.b.status()
            offs = np.arange(16, dtype=np.uint64) * np.uint64(4096)
            self.a.batch_transfer(src, self.peer_b, "count-dst", offs, offs, block_size=1000)
            after = self.b.status()
        self.assertEqual(after.batches_received - before.batches_received, 1)
        self.assertEqual(after.bytes_received - before.bytes_received, 16000)

    def test_10k_per_block_lengths_verified(self):
        n = 10000
        lengths = self.rng.integers(1, 600, n).astype(np.uint64)
        # Source: blocks at random non-overlapping places; destination: packed with gaps, in shuffled order.
        gap = 16
        src_slots = np.cumsum(lengths + gap) - (lengths + gap)
        perm = self.rng.permutation(n)
        so = src_slots[perm].astype(np.uint64)
        src_size = int(src_slots[-1] + lengths[-1] + gap)
        lens = lengths[perm]
        dperm = self.rng.permutation(n)
        dst_slots = np.empty(n, dtype=np.uint64)
        dst_slots[dperm] = (np.cumsum(lens[dperm] + 8) - (lens[dperm] + 8)).astype(np.uint64)
        do = dst_slots
        dst_size = int((lens + 8).sum())
        with self.a.register_host(src_size) as src, self.b.register_host(dst_size, "var-dst") as dst:
            self.random_fill(src)
            r = self.a.batch_transfer(src, self.peer_b, "var-dst", so, do, lengths=lens)
            self.assertEqual((r.blocks, r.bytes), (n, int(lens.sum())))
            self.assert_blocks_equal(src, so, dst, do, lens)
            self.assertFalse(dst.array[~covered(dst_size, do, lens)].any())

    def test_input_types_and_reused_descriptors(self):
        n, size = 200, 64
        so, src_size = layout(n, size, self.rng)
        do, dst_size = layout(n, size, self.rng)
        with self.a.register_host(src_size) as src, self.b.register_host(dst_size, "types-dst") as dst:
            variants = [
                dict(src_offsets=so.tolist(), dst_offsets=do.tolist(), lengths=[size] * n),
                dict(src_offsets=array.array("Q", so.tolist()), dst_offsets=array.array("Q", do.tolist()), block_size=size),
                dict(src_offsets=so.astype(np.int64), dst_offsets=do.astype(np.uint32), block_size=np.int32(size)),
            ]
            for kw in variants:
                with self.subTest(types=[type(v).__name__ for v in kw.values()]):
                    self.random_fill(src)
                    r = self.a.batch_transfer(src, self.peer_b, "types-dst", **kw)
                    self.assertEqual(r.blocks, n)
                    self.assert_blocks_equal(src, so, dst, do, size)
            d = b2b.Descriptors(so, do, block_size=size)
            for _ in range(3):
                self.random_fill(src)
                r = self.a.batch_transfer(src.id, self.peer_b, dst, descriptors=d, transport="tcp", timeout=30)
                self.assertEqual((r.blocks, r.transport), (n, "tcp"))
                self.assert_blocks_equal(src, so, dst, do, size)
            with self.assertRaises(TypeError):
                self.a.batch_transfer(src, self.peer_b, dst, so, do, descriptors=d)

    def test_deregister_destination_right_after_transfer(self):
        """BatchTransfer returns only after the destination acknowledged the
        batch, so the batch no longer uses the destination region: releasing
        it at once must succeed (not FAILED_PRECONDITION "in use")."""
        offs = np.arange(16, dtype=np.uint64) * np.uint64(4096)
        failures = []
        with self.a.register_host(1 << 16) as src:
            for i in range(300):
                dst = self.b.register_host(1 << 16, "dereg-race", deregister_on_close=False)
                self.a.batch_transfer(src, self.peer_b, "dereg-race", offs, offs, block_size=1000)
                try:
                    self.b.deregister(dst)
                except b2b.FailedPreconditionError as e:
                    failures.append((i, e.message))
                    for _ in range(100):  # clean up once the daemon lets go
                        try:
                            self.b.deregister(dst)
                            break
                        except b2b.FailedPreconditionError:
                            time.sleep(0.01)
                dst.close()
        if failures:
            self.fail(
                f"{len(failures)} of 300 deregistrations of the destination failed right after "
                f"BatchTransfer returned; first (iteration {failures[0][0]}): {failures[0][1]}"
            )

    def test_deadline_exceeded(self):
        # 10,000 x 4 KiB (40 MiB) over loopback TCP cannot finish within 1 ms.
        n, size = 10000, 4096
        so, src_size = layout(n, size, self.rng)
        do, dst_size = layout(n, size, self.rng)
        with self.a.register_host(src_size) as src, self.b.register_host(dst_size, "slow-dst") as dst:
            with self.assertRaises(b2b.DeadlineExceededError) as cm:
                self.a.batch_transfer(src, self.peer_b, "slow-dst", so, do, block_size=size, timeout=0.001)
            self.assertEqual(cm.exception.code.name, "DEADLINE_EXCEEDED")
            # The daemons stay healthy: the same batch then completes and verifies.
            self.random_fill(src)
            r = self.a.batch_transfer(src, self.peer_b, "slow-dst", so, do, block_size=size, timeout=60)
            self.assertEqual(r.bytes, n * size)
            self.assert_blocks_equal(src, so, dst, do, size)


class NotificationTest(TwoDaemons):
    def test_watcher_hears_each_batch_after_it_landed(self):
        n, size = 1000, 4096
        offs = (np.arange(n, dtype=np.uint64)[::-1] * np.uint64(size)).copy()
        with self.a.register_host(n * size) as src, self.b.register_host(n * size, "kv") as dst:
            with self.b.watch(dst, timeout=60) as w:
                for rnd in range(1, 4):
                    self.random_fill(src)
                    self.a.batch_transfer(src, self.peer_b, "kv", offs, offs, block_size=size, notification=b"r%d" % rnd)
                    got = next(w)
                    self.assertEqual(
                        (got.notification, got.sender, got.region, got.blocks, got.bytes, got.dropped),
                        (b"r%d" % rnd, "a", "kv", n, n * size, 0),
                    )
                    # Notified only after the bytes were in place.
                    self.assertTrue(np.array_equal(src.array, dst.array))
                # A batch without a notification is not announced; the next one is.
                self.a.batch_transfer(src, self.peer_b, "kv", offs, offs, block_size=size)
                self.a.batch_transfer(src, self.peer_b, "kv", offs[:1], offs[:1], block_size=size, notification=b"last")
                self.assertEqual(next(w).notification, b"last")
            self.assertEqual(list(w), [])  # cancelled: iteration just ends

    def test_watch_errors(self):
        with self.assertRaises(b2b.NotFoundError):
            self.b.watch("r-nope")
        with self.a.register_host(4096) as src, self.b.register_host(4096, "kv-big") as dst:
            with self.assertRaises(b2b.InvalidArgumentError) as cm:
                self.a.batch_transfer(src, self.peer_b, dst, [0], [0], block_size=8, notification=b"x" * 4097)
            self.assertIn("notification", cm.exception.message)
            with self.assertRaises(TypeError):
                self.a.batch_transfer(src, self.peer_b, dst, [0], [0], block_size=8, notification="text")


class ErrorTest(TwoDaemons):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.n, cls.size = 1000, 128
        rng = np.random.default_rng(5)
        cls.so, src_size = layout(cls.n, cls.size, rng)
        cls.do, dst_size = layout(cls.n, cls.size, rng)
        cls.src = cls.a.register_host(src_size)
        cls.dst = cls.b.register_host(dst_size, "err-dst")

    def transfer(self, **kw):
        args = dict(src=self.src, peer=self.peer_b, dst_region="err-dst", src_offsets=self.so, dst_offsets=self.do, block_size=self.size)
        args.update(kw)
        return self.a.batch_transfer(**args)

    def test_unknown_source_region(self):
        with self.assertRaises(b2b.NotFoundError) as cm:
            self.transfer(src="r-does-not-exist")
        self.assertIn("r-does-not-exist", cm.exception.message)
        self.assertIn("src_region_id", cm.exception.message)

    def test_unknown_destination_export(self):
        with self.assertRaises(b2b.NotFoundError) as cm:
            self.transfer(dst_region="no-such-export")
        self.assertIn("no-such-export", cm.exception.message)

    def test_zero_length_names_field_and_index(self):
        lens = np.full(self.n, self.size, dtype=np.uint64)
        lens[417] = 0
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            self.transfer(block_size=None, lengths=lens)
        self.assertIn("lengths[417]", cm.exception.message)
        self.assertIsInstance(cm.exception, ValueError)

    def test_mismatched_array_lengths(self):
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            self.transfer(dst_offsets=self.do[:-1])
        self.assertIn("dst_offsets", cm.exception.message)
        # The daemon enforces the same rule on its own (raw stub, no local check).
        from b2b.errors import from_rpc_error
        from b2b.v1 import b2b_pb2 as pb
        import grpc

        req = pb.BatchTransferRequest(
            src_region_id=self.src.id, peer=self.peer_b, dst_region="err-dst",
            descriptors=pb.Descriptors(src_offsets=self.so.tobytes(), dst_offsets=self.do[:-1].tobytes(), block_length=self.size),
        )
        with self.assertRaises(grpc.RpcError) as cm2:
            self.a.stub.BatchTransfer(req, timeout=30)
        e = from_rpc_error(cm2.exception)
        self.assertIsInstance(e, b2b.InvalidArgumentError)
        self.assertIn(f"dst_offsets has {self.n - 1} entries", e.message)

    def test_out_of_range_offsets(self):
        so = self.so.copy()
        so[12] = self.src.size - self.size + 1  # one byte past the end
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            self.transfer(src_offsets=so)
        self.assertIn("src_offsets[12]", cm.exception.message)
        do = self.do.copy()
        do[34] = self.dst.size
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            self.transfer(dst_offsets=do)
        self.assertIn("dst_offsets[34]", cm.exception.message)
        self.assertIn(str(self.dst.size), cm.exception.message)

    def test_overlapping_destinations(self):
        do = self.do.copy()
        do[7] = do[3] + 1
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            self.transfer(dst_offsets=do)
        self.assertIn("overlap", cm.exception.message)

    def test_unknown_peer_is_unavailable(self):
        port = daemon_harness.free_port()  # nothing listens there
        with self.assertRaises(b2b.UnavailableError) as cm:
            self.transfer(peer=f"127.0.0.1:{port}", timeout=20)
        self.assertIn(str(port), cm.exception.message)

    def test_local_type_and_shape_checks(self):
        with self.assertRaises(TypeError):
            self.transfer(src_offsets=self.so.astype(np.float64))
        with self.assertRaises(b2b.InvalidArgumentError):
            self.transfer(src_offsets=self.so.reshape(10, -1), dst_offsets=self.do.reshape(10, -1))
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "negative"):
            self.transfer(src_offsets=self.so.astype(np.int64) - 10**9)
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "both set"):
            self.transfer(lengths=np.full(self.n, self.size))
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "transport"):
            self.transfer(transport="carrier-pigeon")
        with self.assertRaises(TypeError):
            self.transfer(src=12)

    def test_checksum_errors(self):
        with self.assertRaises(b2b.NotFoundError):
            self.a.checksum("r-nope", [0], block_size=1)
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            self.a.checksum(self.src, [0, self.src.size], block_size=1)
        self.assertIn("offsets[1]", cm.exception.message)
        with self.assertRaisesRegex(b2b.InvalidArgumentError, "algorithm"):
            self.a.checksum(self.src, [0], block_size=1, algorithm="md5")

    def test_checksum_algorithms(self):
        self.src.array[:64] = np.arange(64, dtype=np.uint8)
        c1 = self.a.checksum(self.src, [0, 32], block_size=32, algorithm="crc32c", per_block=True)
        self.assertEqual(c1.block_digests.tolist(), [crc32c(bytes(range(32))), crc32c(bytes(range(32, 64)))])
        c2 = self.a.checksum(self.src, [32, 0], lengths=[32, 32])
        self.assertIsNone(c2.block_digests)
        self.assertNotEqual(c1.digest, c2.digest)  # order matters
        x = self.a.checksum(self.src, [0, 32], block_size=32, algorithm="xxh64", per_block=True)
        self.assertEqual(x.algorithm, "xxh64")
        self.assertNotEqual(x.block_digests.tolist(), c1.block_digests.tolist())
        # Per-block digests agree with single-block requests.
        np.testing.assert_array_equal(
            x.block_digests,
            [self.a.checksum(self.src, [o], block_size=32, algorithm="xxh64", per_block=True).block_digests[0] for o in (0, 32)],
        )


class RegionTest(TwoDaemons):
    def ids(self, client):
        return {r.id for r in client.list_regions()}

    def test_host_region_mapping_and_info(self):
        with self.a.register_host(3 * mmap.PAGESIZE + 100, "map-test") as r:
            self.assertEqual(r.size, 3 * mmap.PAGESIZE + 100)
            self.assertEqual(r.export_name, "map-test")
            self.assertEqual(r.info.kind, "host")
            self.assertIn("tcp", r.info.registered_with)
            self.assertEqual(r.array.dtype, np.uint8)
            self.assertEqual(r.array.shape, (r.size,))
            self.assertEqual(len(r.memoryview), r.size)
            # Both views and the shm file are the same memory.
            r.array[10:20] = 42
            self.assertEqual(bytes(r.memoryview[10:20]), b"\x2a" * 10)
            r.memoryview[100:104] = b"b2b!"
            with open(r.shm_path, "rb") as f:
                f.seek(100)
                self.assertEqual(f.read(4), b"b2b!")
            # And the daemon reads what we wrote.
            want = self.a.checksum(r, [0], block_size=r.size).digest
            r.array[5000] ^= 1
            self.assertNotEqual(self.a.checksum(r, [0], block_size=r.size).digest, want)
            info = {x.id: x for x in self.a.list_regions()}[r.id]
            self.assertEqual((info.size, info.export_name, info.shm_path), (r.size, "map-test", r.shm_path))

    def test_register_host_file(self):
        page = mmap.PAGESIZE
        name = "imported.bin"
        path = os.path.join(self.da.shm_dir, name)
        content = self.rng.integers(0, 256, 4 * page, dtype=np.uint8)
        with open(path, "wb") as f:
            f.write(content.tobytes())
        try:
            # Pages 1..2 of the file, by relative path.
            with self.a.register_host_file(name, offset=page, size=2 * page, export_name="imported") as r:
                self.assertEqual((r.size, r.info.shm_offset), (2 * page, page))
                self.assertEqual(os.path.realpath(r.shm_path), os.path.realpath(path))
                np.testing.assert_array_equal(r.array, content[page : 3 * page])
                r.array[:8] = 0xAB  # writes reach the file
                with open(path, "rb") as f:
                    f.seek(page)
                    self.assertEqual(f.read(8), b"\xab" * 8)
                # Peers can write into it.
                with self.b.register_host(page) as src:
                    self.random_fill(src)
                    self.b.batch_transfer(src, self.da.peer_address, "imported", [0], [page], block_size=page)
                    np.testing.assert_array_equal(r.array[page:], src.array)
            self.assertTrue(os.path.exists(path))  # imported files are not deleted
            # Whole file, absolute path, size 0.
            with self.a.register_host_file(path) as r:
                self.assertEqual(r.size, 4 * page)
                self.assertEqual(bytes(r.memoryview[page : page + 8]), b"\xab" * 8)
        finally:
            os.unlink(path)

    def test_register_host_file_errors(self):
        with self.assertRaises(b2b.NotFoundError):
            self.a.register_host_file("does-not-exist.bin")
        outside = os.path.join(self.da.dir, "outside.bin")
        with open(outside, "wb") as f:
            f.write(b"\0" * mmap.PAGESIZE)
        with self.assertRaises(b2b.PermissionDeniedError) as cm:
            self.a.register_host_file(outside)
        self.assertIn("outside the shm directory", cm.exception.message)
        path = os.path.join(self.da.shm_dir, "small.bin")
        with open(path, "wb") as f:
            f.write(b"\0" * mmap.PAGESIZE)
        try:
            with self.assertRaisesRegex(b2b.InvalidArgumentError, "host_file.offset"):
                self.a.register_host_file(path, offset=100)
        finally:
            os.unlink(path)

    def test_deregister(self):
        r = self.a.register_host(4096, "dereg")
        self.assertIn(r.id, self.ids(self.a))
        self.assertTrue(os.path.exists(r.shm_path))
        self.a.deregister(r)
        self.assertTrue(r.deregistered)
        self.assertNotIn(r.id, self.ids(self.a))
        self.assertFalse(os.path.exists(r.shm_path))  # the daemon's own file is removed
        with self.assertRaises(b2b.NotFoundError):
            self.a.deregister(r.id)
        # Still mapped here until closed; close does not deregister twice.
        r.array[0] = 1
        r.close()
        # The export name is free again.
        with self.a.register_host(4096, "dereg") as again:
            self.assertEqual(again.export_name, "dereg")

    def test_context_manager_closes_and_deregisters(self):
        with self.a.register_host(8192) as r:
            view = r.array[100:200]  # a view that outlives the region
            view[:] = 9
            rid = r.id
        self.assertTrue(r.closed)
        self.assertNotIn(rid, self.ids(self.a))
        with self.assertRaises(ValueError):
            r.array
        # The mapping lives on under the surviving view (never pulled from under it).
        self.assertTrue((view == 9).all())
        # close(deregister=False) keeps it in the daemon.
        r2 = self.a.register_host(4096, deregister_on_close=False)
        with r2:
            pass
        self.assertIn(r2.id, self.ids(self.a))
        self.a.deregister(r2)

    def test_client_close_releases_its_regions(self):
        with self.da.client() as c:
            kept = c.register_host(4096, deregister_on_close=False)
            dropped = c.register_host(4096, "dropped-on-close")
            self.assertTrue({kept.id, dropped.id} <= self.ids(self.a))
        self.assertTrue(c.closed)
        self.assertTrue(dropped.closed)
        ids = self.ids(self.a)
        self.assertNotIn(dropped.id, ids)
        self.assertIn(kept.id, ids)
        with self.assertRaises(b2b.UnavailableError):
            c.status()
        self.a.deregister(kept.id)
        kept.close()

    def test_export(self):
        with self.b.register_host(4096) as dst, self.a.register_host(4096) as src:
            self.random_fill(src)
            with self.assertRaises(b2b.InvalidArgumentError):
                self.a.batch_transfer(src, self.peer_b, dst, [0], [0], block_size=16)  # dst not exported
            info = self.b.export(dst, "late-export")
            self.assertEqual((info.export_name, dst.export_name), ("late-export", "late-export"))
            self.a.batch_transfer(src, self.peer_b, dst, [0], [0], block_size=4096)
            np.testing.assert_array_equal(dst.array, src.array)
            with self.b.register_host(4096) as other:
                with self.assertRaises(b2b.AlreadyExistsError):
                    self.b.export(other, "late-export")
            self.b.export(dst, None)
            self.assertEqual(dst.export_name, "")
            with self.assertRaises(b2b.NotFoundError):
                self.a.batch_transfer(src, self.peer_b, "late-export", [0], [0], block_size=16)
        with self.assertRaises(b2b.NotFoundError):
            self.b.export("r-nope", "x")

    def test_status(self):
        self.assertEqual(self.b.wait_ready(timeout=10).node_name, "b")
        st = self.b.status()
        self.assertEqual(st.node_name, "b")
        self.assertEqual(st.peer_address, self.peer_b)
        tcp = [t for t in st.transports if t.kind == "tcp"]
        self.assertEqual(len(tcp), 1)
        self.assertTrue(tcp[0].available)
        self.assertIn(str(self.db.data_port), tcp[0].detail)
        self.assertGreaterEqual(st.max_descriptors, 10000)
        n0 = st.regions
        with self.b.register_host(4096):
            self.assertEqual(self.b.status().regions, n0 + 1)
        self.assertEqual(self.b.status().regions, n0)

    def test_register_errors(self):
        with self.assertRaises(b2b.InvalidArgumentError) as cm:
            self.a.register_host(0)
        self.assertIn("host_alloc.size", cm.exception.message)
        with self.assertRaises(TypeError):
            self.a.register_host(1.5)
        with self.a.register_host(4096, "taken"):
            with self.assertRaises(b2b.AlreadyExistsError):
                self.a.register_host(4096, "taken")


if __name__ == "__main__":
    unittest.main()
