#!/usr/bin/env python3
"""device.py's stand-in for a GPU, against a live daemon (B2BD_BIN, else
bin/b2bd): what the device process fills the engine reads, what the engine
writes the device process checks, one altered element is caught, a failing
op comes back as DeviceError, and the process ends with its pipe.
Run: python3 deploy/disagg/device_test.py"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python", "tests"))
import b2b  # noqa: E402
from b2b.connector.testing import Pool  # noqa: E402
from daemon_harness import Daemon  # noqa: E402
from device import Device, DeviceError  # noqa: E402


class DeviceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon("device").start()
        cls.client = b2b.Client(cls.d.socket)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.d.stop()
        cls.d.cleanup()

    def test_fill_and_check(self):
        for layout in ("NHD", "HND"):
            with self.subTest(layout=layout):
                pools = [Pool(self.client, layers=2, num_blocks=8, block_size=4, heads=2, dim=8, kv_layout=layout, head0=h)
                         for h in (0, 2)]
                dev = Device(pools)
                try:
                    ids, seed, n = [5, 1, 6], 77, 10  # two whole blocks and a part
                    for r in range(2):
                        for layer in range(2):
                            dev.call("fill_layers", r, layer, [(ids, seed, n)])
                        self.assertEqual(pools[r].check(ids, seed, n), 0, "the device's fill, read here")
                        self.assertEqual(dev.call("check", r, ids, seed, n), 0)
                    pools[1].fill([2, 3, 4], 9, 12)  # written here, checked there
                    self.assertEqual(dev.call("check", 1, [2, 3, 4], 9, 12), 0)
                    pools[1].array[1, 0, 3, 0, 0, 0] ^= 1  # one element of token 4
                    self.assertEqual(dev.call("check", 1, [2, 3, 4], 9, 12), 1)
                    self.assertGreater(dev.call("check", 0, [2, 3, 4], 9, 12), 0, "rank 0 never had that request")
                    with self.assertRaises(DeviceError):
                        dev.call("check", 5, ids, seed, n)  # no such rank
                    self.assertEqual(dev.call("check", 0, ids, seed, n), 0, "the process goes on after a failed op")
                finally:
                    dev.close()
                    for p in pools:
                        p.close()
                self.assertEqual(dev.p.returncode, 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
