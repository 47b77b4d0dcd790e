"""b2b.connector (KVConnectorBase_V1 over b2bd): the scenarios of vLLM's
connector unit tests that apply (tests/v1/kv_connector/unit: the remote
prefill and remote decode lifecycles, aborts, the prefiller's abort
timeout, transfer failures reported as load errors), against two real
daemons, every byte of every block checked."""

from __future__ import annotations

import importlib
import threading
import time
import unittest
import uuid
from typing import Any, Dict, List, Optional, Set, Tuple

from daemon_harness import Daemon

import b2b
from b2b.connector import B2BConnector, B2BConnectorMetadata, Role, Settings
from b2b.connector.testing import Pool, Request, config


def sched(engine: str = "p", **kw: Any) -> B2BConnector:
    kw.setdefault("peer_address", "127.0.0.1:1")
    return B2BConnector(config(engine, socket="/nonexistent", **kw), Role.SCHEDULER)


class SchedulerHalfTest(unittest.TestCase):
    """No daemon: the bookkeeping vLLM's scheduler sees."""

    def test_loadable_by_module_path_without_vllm(self):
        mod = importlib.import_module("b2b.connector")
        self.assertIs(getattr(mod, "B2BConnector"), B2BConnector)
        for m in ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta", "request_finished",
                  "register_kv_caches", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                  "get_finished", "get_block_ids_with_load_errors", "bind_connector_metadata",
                  "clear_connector_metadata", "shutdown"):
            self.assertTrue(callable(getattr(B2BConnector, m)), m)

    def test_decode_matches_whole_remote_prompt(self):
        s = sched("d")
        r = Request("a", list(range(40)), {"do_remote_prefill": True, "remote_block_ids": [1, 2, 3]})
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (40, True))
        self.assertEqual(s.get_num_new_matched_tokens(r, 16), (24, True))
        self.assertEqual(s.get_num_new_matched_tokens(r, 40), (0, False))  # all computed here
        self.assertEqual(s.get_num_new_matched_tokens(Request("b", [1, 2], None), 0), (0, False))
        self.assertEqual(s.get_num_new_matched_tokens(Request("c", [1, 2], {"do_remote_decode": True}), 0), (0, False))

    def test_decode_meta_carries_ids_once(self):
        s = sched("d")
        r = Request("a", list(range(40)), {"do_remote_prefill": True, "remote_block_ids": [7, 8, 9],
                                           "remote_engine_id": "p", "remote_peer": "x:1", "remote_request_id": "pa"})
        s.update_state_after_alloc(r, [3, 4, 5], 40)
        m = s.build_connector_meta(None)
        self.assertIsInstance(m, B2BConnectorMetadata)
        got = m.reqs_to_recv["a"]
        self.assertEqual((got.local_block_ids, got.remote_block_ids, got.remote_engine, got.remote_peer,
                          got.remote_request_id), ([3, 4, 5], [7, 8, 9], "p", "x:1", "pa"))
        self.assertEqual(s.build_connector_meta(None).reqs_to_recv, {})  # once
        # A preempted request is recomputed here, not loaded twice.
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (0, False))

    def test_decode_nothing_to_load_releases_prefill(self):
        s = sched("d")
        r = Request("a", list(range(40)), {"do_remote_prefill": True, "remote_block_ids": [7], "remote_engine_id": "p",
                                           "remote_peer": "x:1"})
        s.update_state_after_alloc(r, [], 0)
        m = s.build_connector_meta(None)
        self.assertEqual(m.reqs_to_recv, {})
        self.assertEqual(list(m.reqs_to_release), ["a"])

    def test_decode_aborted_before_load_releases_prefill(self):
        s = sched("d")
        r = Request("a", list(range(40)), {"do_remote_prefill": True, "remote_block_ids": [7], "remote_engine_id": "p",
                                           "remote_peer": "x:1"}, status="FINISHED_ABORTED")
        self.assertEqual(s.request_finished(r, []), (False, None))
        self.assertEqual(list(s.build_connector_meta(None).reqs_to_release), ["a"])

    def test_prefill_holds_blocks_and_hands_params(self):
        s = sched("p", release_timeout_s=30)
        r = Request("a", list(range(40)), {"do_remote_decode": True})
        delay, params = s.request_finished(r, [4, 5, 6])
        self.assertTrue(delay)
        self.assertEqual(params["remote_block_ids"], [4, 5, 6])
        self.assertEqual((params["remote_engine_id"], params["remote_peer"], params["do_remote_prefill"]),
                         ("p", "127.0.0.1:1", True))
        dl = s.build_connector_meta(None).reqs_to_send["a"]
        self.assertAlmostEqual(dl - time.monotonic(), 30, delta=5)

    def test_prefill_short_prompt_and_aborts(self):
        s = sched("p")
        self.assertFalse(s.request_finished(Request("b", [1], {"do_remote_decode": True}), [])[0])
        ab = Request("c", list(range(40)), {"do_remote_decode": True}, status="FINISHED_ABORTED")
        self.assertEqual(s.request_finished(ab, [1, 2]), (False, None))
        self.assertEqual(s.request_finished(Request("d", [1], None), [1]), (False, None))
        self.assertEqual(s.build_connector_meta(None).reqs_to_send, {})

    def test_block_ids_per_group_and_stopped_requests(self):
        s = sched("p")
        delay, params = s.request_finished(Request("a", list(range(40)), {"do_remote_decode": True}), ([4, 5, 6],))
        self.assertEqual((delay, params["remote_block_ids"]), (True, [4, 5, 6]))
        with self.assertRaisesRegex(ValueError, "2 KV cache groups"):
            s.request_finished(Request("b", [1], {"do_remote_decode": True}), ([1], [2]))
        # Only a length-capped request is read by decode; any other end frees now.
        stopped = Request("c", list(range(40)), {"do_remote_decode": True}, status="FINISHED_STOPPED")
        self.assertEqual(s.request_finished(stopped, [1, 2]), (False, None))
        d = sched("d")
        r = Request("e", list(range(40)), {"do_remote_prefill": True, "remote_block_ids": ([7, 8],),
                                           "remote_engine_id": "p", "remote_peer": "x:1"})
        d.update_state_after_alloc(r, ([1, 2],), 40)
        got = d.build_connector_meta(None).reqs_to_recv["e"]
        self.assertEqual((got.local_block_ids, got.remote_block_ids), ([1, 2], [7, 8]))

    def test_push_prefill_saves_allocated_blocks(self):
        s = sched("p", mode="push")
        s.update_state_after_alloc(Request("a", list(range(40)), {"do_remote_decode": True}), [9, 8, 7], 0)
        self.assertEqual(s.build_connector_meta(None).reqs_to_save["a"].block_ids, [9, 8, 7])

    def test_physical_order(self):
        import numpy as np
        from b2b.connector.worker import physical
        a = np.zeros((2, 5, 4, 16, 8), dtype=np.uint16)  # [2, blocks, heads, block_size, dim] in memory
        v = a.swapaxes(2, 3)
        self.assertEqual(physical(v).shape, (2, 5, 4, 16, 8))
        self.assertTrue(physical(v).flags["C_CONTIGUOUS"])
        self.assertIs(physical(a), a)
        k = a[0]
        self.assertIs(physical(k), k)  # 4-D: [blocks, ...]
        self.assertEqual(physical(k.swapaxes(1, 2)).strides, k.strides)

    def test_settings_refuse_bad_values(self):
        with self.assertRaisesRegex(ValueError, "mode 'both'"):
            Settings.from_config(config("p", socket="s", mode="both"))
        with self.assertRaisesRegex(ValueError, "kv_layout 'XYZ'"):
            Settings.from_config(config("p", socket="s", kv_layout="xyz"))
        self.assertEqual(B2BConnector.get_required_kvcache_layout(config("p", socket="s", kv_layout="hnd")), "HND")


GEOM = dict(layers=3, heads=4, dim=8)


class Side:
    """One engine's scheduler and worker ranks with their pools."""

    def __init__(self, daemon: Daemon, engine: str, *, tp: int = 1, num_blocks: int = 64, block_size: int = 16,
                 kv_layout: str = "NHD", permuted: bool = False, **extra: Any) -> None:
        self.clients = [daemon.client() for _ in range(tp)]
        mk = lambda r: config(engine, socket=daemon.socket, block_size=block_size, tp_size=tp, tp_rank=r,
                              kv_layout=kv_layout, **extra)
        self.sched = B2BConnector(mk(0), Role.SCHEDULER, client=daemon.client())
        hp = GEOM["heads"] // tp
        self.pools = [Pool(c, layers=GEOM["layers"], num_blocks=num_blocks, block_size=block_size, heads=hp,
                           dim=GEOM["dim"], kv_layout=kv_layout, head0=r * hp) for r, c in enumerate(self.clients)]
        self.workers = [B2BConnector(mk(r), Role.WORKER, client=c) for r, c in enumerate(self.clients)]
        for w, p in zip(self.workers, self.pools):
            # permuted: HND as vLLM hands it over, a logical [2, blocks, block_size, heads, dim] view
            w.register_kv_caches({k: v.swapaxes(2, 3) for k, v in p.caches.items()} if permuted else p.caches)
        self.sending: Dict[str, int] = {}
        self.recving: Dict[str, int] = {}
        self.errors: Set[int] = set()

    def step(self, compute: Optional[List[Tuple[str, List[int], int, int]]] = None) -> None:
        """One engine step in vLLM's order; ``compute``: (request, ids, seed, tokens) prefilled now."""
        meta = self.sched.build_connector_meta(None)
        for w, p in zip(self.workers, self.pools):
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            for li, name in enumerate(p.names):
                w.wait_for_layer_load(name)
                for _, ids, seed, n in compute or ():
                    p.fill_layer(li, ids, seed, n)
                w.save_kv_layer(name, p.caches[name], None)
            w.wait_for_save()
            s, r = w.get_finished(set())
            for rid in s or ():
                self.sending[rid] = self.sending.get(rid, 0) + 1
            for rid in r or ():
                self.recving[rid] = self.recving.get(rid, 0) + 1
            self.errors |= w.get_block_ids_with_load_errors()
            w.clear_connector_metadata()

    def check(self, ids: List[int], seed: int, n: int) -> int:
        return sum(p.check(ids, seed, n) for p in self.pools)

    def close(self) -> None:
        for w in self.workers:
            w.shutdown()
        for p in self.pools:
            p.close()
        for c in self.clients:
            c.close()
        self.sched.sched = None


def pump(sides: List[Side], cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        for s in sides:
            s.step()
        time.sleep(0.005)


class ConnectorE2ETest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dp = Daemon("prefill").start()
        cls.dd = Daemon("decode").start()

    @classmethod
    def tearDownClass(cls):
        cls.dp.stop()
        cls.dd.stop()

    def sides(self, mode: str = "pull", ptp: int = 1, dtp: int = 1, pbs: int = 16, dbs: int = 16,
              layout: str = "NHD", num_blocks: int = 64, permuted: bool = False, **extra: Any) -> Tuple[Side, Side]:
        tag = uuid.uuid4().hex[:8]
        p = Side(self.dp, f"pre-{tag}", tp=ptp, block_size=pbs, kv_layout=layout, mode=mode, num_blocks=num_blocks,
                 head_splits=[2] if layout == "HND" else [], permuted=permuted, **extra)
        self.addCleanup(p.close)
        d = Side(self.dd, f"dec-{tag}", tp=dtp, block_size=dbs, kv_layout=layout, mode=mode, num_blocks=num_blocks,
                 permuted=permuted, **extra)
        self.addCleanup(d.close)
        return p, d

    def prefill(self, p: Side, rid: str, ids: List[int], seed: int, n: int) -> dict:
        r = Request(rid, list(range(n)), {"do_remote_decode": True})
        p.sched.update_state_after_alloc(r, ids, 0)
        p.step([(rid, ids, seed, n)])
        delay, params = p.sched.request_finished(r, ids)
        self.assertTrue(delay)
        return params

    def decode_req(self, d: Side, rid: str, params: dict, ids: List[int], n: int) -> Request:
        r = Request(rid, list(range(n)), dict(params))
        got, is_async = d.sched.get_num_new_matched_tokens(r, 0)
        self.assertEqual((got, is_async), (n, True))
        d.sched.update_state_after_alloc(r, ids, got)
        return r

    def test_pull_every_byte_and_free_after_pull(self):
        p, d = self.sides()
        d.pools[0].scribble(range(64))
        cases = [("a", [5, 9, 2, 30], [7, 1, 40, 3], 50, 11), ("b", [11], [12], 3, 12),  # shorter than a block
                 ("c", list(range(40, 48)), list(range(50, 58)), 128, 13)]  # a full last block
        params = {rid: self.prefill(p, rid, pids, seed, n) for rid, pids, _, n, seed in cases}
        self.assertEqual(p.sending, {})  # held until pulled
        for rid, _, dids, n, _ in cases:
            self.decode_req(d, rid, params[rid], dids, n)
        pump([p, d], lambda: len(d.recving) == 3 and len(p.sending) == 3)
        self.assertEqual(d.errors, set())
        for rid, _, dids, n, seed in cases:
            self.assertEqual(d.check(dids, seed, n), 0, rid)
        untouched = sorted(set(range(64)) - {i for c in cases for i in c[2]})
        self.assertTrue((d.pools[0].array[:, :, untouched] == 0xA5A5).all())
        self.assertGreater(d.check([7, 1, 40, 3], 99, 50), 0)  # the check can fail (wrong seed)

    def test_push_every_byte_ids_early_and_late(self):
        p, d = self.sides("push")
        rq = {"do_remote_prefill": True, "remote_engine_id": p.sched.settings.engine_id,
              "remote_peer": self.dp.peer_address}
        # early: decode's ids reach prefill before it computes (per-layer pushes)
        self.decode_req(d, "e", dict(rq, remote_request_id="e"), [3, 4, 5], 40)
        d.step()
        pump([p], lambda: "e" in p.workers[0].worker._early_ids, 5)
        self.prefill(p, "e", [20, 21, 22], 21, 40)
        # late: prefill computes first, the ids come after (one whole-layout push)
        self.prefill(p, "l", [30, 31], 22, 20)
        self.decode_req(d, "l", dict(rq, remote_request_id="l"), [8, 9], 20)
        pump([p, d], lambda: len(d.recving) == 2 and len(p.sending) == 2)
        self.assertEqual(d.errors, set())
        self.assertEqual(d.check([3, 4, 5], 21, 40), 0)
        self.assertEqual(d.check([8, 9], 22, 20), 0)
        # "e"'s layers were armed at the step's start, one write per layer,
        # and sent as each was computed (an early post would carry the
        # pool's zeros and fail the check).
        self.assertEqual(p.workers[0].worker.stats["push_armed"], GEOM["layers"])

    def test_pull_dispatched_together_arms_both_ends(self):
        """Decode asks first ("want"); prefill sends "where" at the first
        layer and arms "ready" in its daemon, decode arms its read on the
        step's key; the last layer's local note sends "ready", whose key
        starts the read: every byte lands."""
        p, d = self.sides()
        rq = {"do_remote_prefill": True, "remote_engine_id": p.sched.settings.engine_id,
              "remote_peer": self.dp.peer_address, "remote_request_id": "t"}
        d.pools[0].scribble(range(64))
        self.decode_req(d, "t", rq, [6, 7, 8], 40)
        d.step()
        pump([p], lambda: "t" in p.workers[0].worker._wants, 5)
        self.prefill(p, "t", [30, 31, 32], 31, 40)
        pump([p, d], lambda: "t" in d.recving and "t" in p.sending)
        self.assertEqual(d.errors, set())
        self.assertEqual(d.check([6, 7, 8], 31, 40), 0)
        self.assertEqual(p.workers[0].worker.stats["ready_armed"], 1)
        self.assertIn("fired", d.workers[0].worker.take_trace("t"), "the read did not start on the key")

    def test_push_ids_over_several_notes(self):
        # 1,000 four-digit ids (5,000 bytes) do not fit one 4 KiB note: they go in parts.
        p, d = self.sides("push", num_blocks=1100)
        n = 1000 * 16
        dids = list(range(1099, 99, -1))
        rq = {"do_remote_prefill": True, "remote_engine_id": p.sched.settings.engine_id,
              "remote_peer": self.dp.peer_address, "remote_request_id": "a"}
        self.decode_req(d, "a", rq, dids, n)
        d.step()
        self.prefill(p, "a", list(range(1000)), 23, n)
        pump([p, d], lambda: "a" in d.recving and "a" in p.sending)
        self.assertEqual(d.errors, set())
        self.assertEqual(d.check(dids, 23, n), 0)
        self.assertEqual(d.workers[0].worker.stats["notes_sent"], 4)

    def decode_hit(self, d: Side, rid: str, params: dict, cached: List[int], new: List[int], n: int, seed: int) -> None:
        """Decode already holds the prompt's first blocks (``cached``, its
        own prefix cache: filled here) and gives only its new blocks, as
        vLLM does (get_unhashed_block_ids)."""
        for pool in d.pools:
            pool.fill(cached, seed, len(cached) * pool.block_size)
        r = Request(rid, list(range(n)), dict(params))
        computed = len(cached) * d.pools[0].block_size
        got, is_async = d.sched.get_num_new_matched_tokens(r, computed)
        self.assertEqual((got, is_async), (n - computed, True))
        d.sched.update_state_after_alloc(r, new, got)

    def test_prefix_hit_loads_the_tail(self):
        """A decode prefix-cache hit: its new blocks take prefill's last
        blocks (vLLM's NIXL pairs from the tail), pull and push, equal and
        doubled decode blocks; every byte of the whole prompt checks."""
        for mode, dbs, pids, cached, new, n in [
            ("pull", 16, [5, 9, 2, 30], [60], [1, 40, 3], 64),
            ("pull", 16, [5, 9, 2, 30], [60, 61], [1, 40], 50),
            ("pull", 32, [5, 9, 2, 30, 11], [60], [1, 40], 70),  # one 32-token block cached: 2 prefill blocks skipped
            ("push", 16, [5, 9, 2, 30], [60], [1, 40, 3], 64),
        ]:
            with self.subTest(mode=mode, dbs=dbs, cached=cached):
                p, d = self.sides(mode, dbs=dbs)
                d.pools[0].scribble(range(64))
                if mode == "pull":
                    params = self.prefill(p, "h", pids, 51, n)
                else:
                    params = {"do_remote_prefill": True, "remote_engine_id": p.sched.settings.engine_id,
                              "remote_peer": self.dp.peer_address, "remote_request_id": "h"}
                self.decode_hit(d, "h", params, cached, new, n, 51)
                if mode == "push":
                    d.step()
                    self.prefill(p, "h", pids, 51, n)
                pump([p, d], lambda: "h" in d.recving and "h" in p.sending)
                self.assertEqual(d.errors, set())
                self.assertEqual(d.check(cached + new, 51, n), 0)

    def test_ids_that_do_not_fill_the_load_fail_it(self):
        """Fewer (or no, or malformed) remote block ids than decode's blocks
        need: the load fails and its ids come back as load errors
        (recomputed), rather than report blocks nothing wrote or raise in
        the scheduler; a load of no local block (the whole prompt was
        cached): finished at once, prefill frees its blocks."""
        p, d = self.sides()
        for rid, remote in (("few", [5, 9]), ("none", []), ("bad", [5, "x", 2]), ("bool", [5, True, 2])):
            params = self.prefill(p, rid, [5, 9, 2], 7, 40) if rid == "few" else None
            params = dict(params or {"do_remote_prefill": True, "remote_engine_id": p.sched.settings.engine_id,
                                     "remote_peer": self.dp.peer_address, "remote_request_id": rid})
            params["remote_block_ids"] = remote
            r = Request(rid, list(range(40)), params)
            d.sched.get_num_new_matched_tokens(r, 0)
            d.sched.update_state_after_alloc(r, [20, 21, 22], 40)
            pump([p, d], lambda: rid in d.recving)
            self.assertTrue({20, 21, 22} <= d.errors, (rid, d.errors))
        params = self.prefill(p, "all", [30, 31], 8, 32)
        r = Request("all", list(range(32)), dict(params))
        d.sched.update_state_after_alloc(r, [], 32)  # a load of no block: the whole prompt was cached
        pump([p, d], lambda: "all" in d.recving and "all" in p.sending)  # reported, and prefill freed

    def test_failed_pull_reports_load_errors(self):
        p, d = self.sides(load_timeout_s=5)
        params = self.prefill(p, "a", [1, 2, 3], 5, 40)
        for w in p.workers:
            w.shutdown()  # prefill's layouts are gone before decode pulls
        p.workers = []
        self.decode_req(d, "a", params, [10, 11, 12], 40)
        pump([d], lambda: "a" in d.recving)
        self.assertEqual(d.errors, {10, 11, 12})  # recomputed by the engine

    def test_prefiller_frees_after_release_timeout(self):
        p, d = self.sides(release_timeout_s=0.6)
        t0 = time.monotonic()
        self.prefill(p, "a", [1, 2], 5, 20)
        pump([p], lambda: "a" in p.sending)
        self.assertGreaterEqual(time.monotonic() - t0, 0.6)

    def test_decode_abort_before_load_frees_prefill(self):
        p, d = self.sides(release_timeout_s=60)
        params = self.prefill(p, "a", [1, 2], 5, 20)
        r = Request("a", list(range(20)), dict(params), status="FINISHED_ABORTED")
        self.assertEqual(d.sched.request_finished(r, []), (False, None))
        pump([p, d], lambda: "a" in p.sending, 10)

    def test_failed_push_reported_to_decode(self):
        p, d = self.sides("push", load_timeout_s=10)
        rq = {"do_remote_prefill": True, "remote_engine_id": p.sched.settings.engine_id,
              "remote_peer": self.dp.peer_address, "remote_request_id": "a"}
        self.decode_req(d, "a", rq, [3, 64], 20)  # 64 is past decode's pool: the daemon refuses the push
        d.step()
        self.prefill(p, "a", [1, 2], 5, 20)
        pump([p, d], lambda: "a" in d.recving)
        self.assertEqual(d.errors, {3, 64})
        self.assertEqual(p.workers[0].worker.stats["save_failures"], 1)

    def test_push_load_times_out_when_prefill_is_silent(self):
        p, d = self.sides("push", load_timeout_s=0.5)
        rq = {"do_remote_prefill": True, "remote_engine_id": p.sched.settings.engine_id,
              "remote_peer": self.dp.peer_address, "remote_request_id": "a"}
        self.decode_req(d, "a", rq, [3, 4], 20)
        pump([d], lambda: "a" in d.recving)
        self.assertEqual(d.errors, {3, 4})

    def test_decode_twice_prefill_tp(self):
        p, d = self.sides(dtp=2, layout="HND")
        params = self.prefill(p, "a", [5, 9, 2], 31, 40)
        d.pools[0].scribble(range(64))
        d.pools[1].scribble(range(64))
        self.decode_req(d, "a", params, [7, 1, 40], 40)
        pump([p, d], lambda: d.recving.get("a") == 2 and "a" in p.sending)
        self.assertEqual(d.errors, set())
        self.assertEqual(d.pools[0].check([7, 1, 40], 31, 40), 0)  # heads 0-1
        self.assertEqual(d.pools[1].check([7, 1, 40], 31, 40), 0)  # heads 2-3

    def test_decode_twice_prefill_tp_from_permuted_views(self):
        p, d = self.sides(dtp=2, layout="HND", permuted=True)
        params = self.prefill(p, "a", [5, 9, 2], 32, 40)
        self.decode_req(d, "a", params, [7, 1, 40], 40)
        pump([p, d], lambda: d.recving.get("a") == 2 and "a" in p.sending)
        self.assertEqual(d.errors, set())
        self.assertEqual(d.check([7, 1, 40], 32, 40), 0)

    def test_push_to_twice_prefill_tp(self):
        p, d = self.sides("push", dtp=2, layout="HND")
        rq = {"do_remote_prefill": True, "remote_engine_id": p.sched.settings.engine_id,
              "remote_peer": self.dp.peer_address}
        for pool in d.pools:
            pool.scribble(range(64))
        self.decode_req(d, "e", dict(rq, remote_request_id="e"), [3, 4, 5], 40)  # ids before the compute
        d.step()
        pump([p], lambda: len(p.workers[0].worker._early_ids.get("e", ({},))[0]) == 2, 10)
        self.prefill(p, "e", [20, 21, 22], 24, 40)
        self.prefill(p, "l", [30, 31], 25, 20)  # ids after the compute
        self.decode_req(d, "l", dict(rq, remote_request_id="l"), [8, 9], 20)
        pump([p, d], lambda: d.recving.get("e") == 2 and d.recving.get("l") == 2 and len(p.sending) == 2)
        self.assertEqual(d.errors, set())
        for pool in d.pools:  # each rank holds its half of the heads
            self.assertEqual(pool.check([3, 4, 5], 24, 40), 0)
            self.assertEqual(pool.check([8, 9], 25, 20), 0)

    def test_prefill_frees_only_after_every_rank_pulled(self):
        p, d = self.sides(dtp=2, layout="HND")
        params = self.prefill(p, "a", [5, 9], 31, 20)
        self.decode_req(d, "a", params, [7, 1], 20)
        meta = d.sched.build_connector_meta(None)
        w0 = d.workers[0]
        w0.bind_connector_metadata(meta)
        w0.start_load_kv(None)  # only rank 0 pulls
        w0.clear_connector_metadata()
        pump([p], lambda: p.workers[0].worker._pulled.get("a", (0,))[0] == 1, 10)
        p.step()
        self.assertNotIn("a", p.sending)
        d.workers[1].bind_connector_metadata(meta)
        d.workers[1].start_load_kv(None)
        d.workers[1].clear_connector_metadata()
        pump([p], lambda: "a" in p.sending, 10)

    def test_decode_block_twice_prefill_block(self):
        p, d = self.sides(pbs=16, dbs=32)
        params = self.prefill(p, "a", [5, 9, 2, 30, 11], 41, 70)  # 70 tokens: 5 prefill blocks, 3 decode blocks
        d.pools[0].scribble(range(64))
        self.decode_req(d, "a", params, [7, 1, 40], 70)
        pump([p, d], lambda: "a" in d.recving and "a" in p.sending)
        self.assertEqual(d.errors, set())
        self.assertEqual(d.check([7, 1, 40], 41, 70), 0)


    def early_req(self, p: Side, d: Side, rid: str, ids: List[int], n: int) -> Request:
        """Decode gets the request before prefill finished it: prefill's
        address, no block ids (the router sent it to both at once)."""
        rq = {"do_remote_prefill": True, "remote_engine_id": p.sched.settings.engine_id,
              "remote_peer": self.dp.peer_address, "remote_request_id": rid}
        return self.decode_req(d, rid, rq, ids, n)

    def test_pull_on_ready_every_byte_want_early_and_late(self):
        p, d = self.sides()
        d.pools[0].scribble(range(64))
        # early: decode's "want" reaches prefill before the compute; "ready" goes at its last layer
        self.early_req(p, d, "e", [3, 4, 5], 40)
        d.step()
        pump([p], lambda: "e" in p.workers[0].worker._wants, 5)
        self.prefill(p, "e", [20, 21, 22], 51, 40)
        self.assertIn("ready_sent", p.workers[0].worker.trace.get("e", {}))  # in the compute's own step
        # late: prefill computed first; "ready" answers the want
        self.prefill(p, "l", [30, 31], 52, 20)
        self.early_req(p, d, "l", [8, 9], 20)
        pump([p, d], lambda: len(d.recving) == 2 and len(p.sending) == 2)
        self.assertEqual(d.errors, set())
        self.assertEqual(d.check([3, 4, 5], 51, 40), 0)
        self.assertEqual(d.check([8, 9], 52, 20), 0)
        self.assertEqual(p.workers[0].worker._computing, {})  # forgotten once pulled
        untouched = sorted(set(range(64)) - {3, 4, 5, 8, 9})
        self.assertTrue((d.pools[0].array[:, :, untouched] == 0xA5A5).all())

    def test_pull_on_ready_mismatched_tp_and_block(self):
        for kw, pids, dids, n in ((dict(dtp=2, layout="HND"), [5, 9, 2], [7, 1, 40], 40),
                                  (dict(pbs=16, dbs=32), [5, 9, 2, 30, 11], [7, 1, 40], 70)):
            with self.subTest(**kw):
                p, d = self.sides(**kw)
                for pool in d.pools:
                    pool.scribble(range(64))
                self.early_req(p, d, "a", dids, n)
                d.step()
                want = len(d.workers)
                pump([p], lambda: len(p.workers[0].worker._wants.get("a", ({},))[0]) == want, 10)
                self.prefill(p, "a", pids, 61, n)
                pump([p, d], lambda: d.recving.get("a") == want and "a" in p.sending)
                self.assertEqual(d.errors, set())
                for pool in d.pools:
                    self.assertEqual(pool.check(dids, 61, n), 0)

    def test_pull_on_ready_times_out_when_prefill_is_silent(self):
        p, d = self.sides(load_timeout_s=1)
        self.early_req(p, d, "a", [3, 4], 20)  # prefill never computes it
        pump([p, d], lambda: "a" in d.recving, 10)
        self.assertEqual(d.errors, {3, 4})

    def test_one_read_per_step_for_all_requests(self):
        p, d = self.sides()
        d.pools[0].scribble(range(64))
        cases = [("a", [5, 9], [7, 1], 20, 31), ("b", [11, 12, 13], [20, 21, 22], 40, 32), ("c", [40], [50], 9, 33)]
        params = {rid: self.prefill(p, rid, pids, seed, n) for rid, pids, _, n, seed in cases}
        for rid, _, dids, n, _ in cases:
            self.decode_req(d, rid, params[rid], dids, n)
        pump([p, d], lambda: len(d.recving) == 3 and len(p.sending) == 3)  # prefill freed each: its note named all
        self.assertEqual(d.errors, set())
        for rid, _, dids, n, seed in cases:
            self.assertEqual(d.check(dids, seed, n), 0, rid)
        self.assertEqual(d.workers[0].worker.stats["pull_starts"], 1)

    def test_one_write_per_layer_and_landed_notes(self):
        p, d = self.sides("push")
        rq = {"do_remote_prefill": True, "remote_engine_id": p.sched.settings.engine_id,
              "remote_peer": self.dp.peer_address}
        cases = [("a", [3, 4], [20, 21], 20, 41), ("b", [5], [22], 16, 42), ("c", [6, 7, 8], [23, 24, 25], 33, 43)]
        for rid, dids, _, n, _ in cases:
            self.decode_req(d, rid, dict(rq, remote_request_id=rid), dids, n)
        d.step()
        pump([p], lambda: len(p.workers[0].worker._early_ids) == 3, 5)
        comp = []
        for rid, _, pids, n, seed in cases:
            r = Request(rid, list(range(n)), {"do_remote_decode": True})
            p.sched.update_state_after_alloc(r, pids, 0)
            comp.append((rid, pids, seed, n))
        p.step(comp)  # all three computed in one step: one write per layer
        self.assertEqual(p.workers[0].worker.stats["push_starts"], GEOM["layers"])
        # Decode has them by the writes' own notes, before prefill polled its writes or sent done.
        pump([d], lambda: len(d.recving) == 3)
        self.assertEqual(d.errors, set())
        for rid, dids, _, n, seed in cases:
            self.assertEqual(d.check(dids, seed, n), 0, rid)
            self.assertIn("landed_seen", d.workers[0].worker.trace.get(rid, {}), rid)
        pump([p], lambda: len(p.sending) == 3)

    def test_notes_of_a_step_share_writes(self):
        p, d = self.sides()
        src, dst = d.workers[0].worker.chan, p.workers[0].worker.chan
        dst.on_note = None  # the channel alone: its worker would take the notes first
        failed: List[Exception] = []
        for i in range(40):
            src.queue(self.dp.peer_address, p.sched.settings.engine_id, 0, {"t": "x", "i": i})
        src.queue(self.dp.peer_address, "no-such-engine", 0, {"t": "x", "i": -1}, on_error=failed.append)
        # 40 small notes in one write, and the bad mailbox's: both start in
        # one call; the bad one's failure reaches its on_error once seen.
        self.assertEqual(src.flush(), 2)
        deadline = time.monotonic() + 10
        while not failed and time.monotonic() < deadline:
            src.reap()
            time.sleep(0.01)
        self.assertEqual(len(failed), 1)
        self.assertIsInstance(failed[0], b2b.B2BError)
        got: List[int] = []
        while len(got) < 40 and time.monotonic() < deadline:
            got += [n["i"] for _, n in dst.take() if n.get("t") == "x"]
            time.sleep(0.01)
        self.assertEqual(got, list(range(40)))  # each note, once, in order


class ConnectorRingE2ETest(ConnectorE2ETest):
    """Every scenario above again, the clients on each daemon's
    shared-memory ring (its submit socket): the connector's starts, notes
    and polls take the ring, and the engine's wake-ups come from it."""

    @classmethod
    def setUpClass(cls):
        ring = ["--submit-socket", "{dir}/submit.sock"]
        cls.dp = Daemon("prefill", extra_args=ring).start()
        cls.dd = Daemon("decode", extra_args=ring).start()

    def test_wakeup_on_a_note_and_on_a_ring_completion(self):
        p, d = self.sides()
        self.assertIsNotNone(d.clients[0].ring)  # else this would not test the ring
        # The channels watch their mailboxes and pools over the ring (op
        # watch), not over WatchNotifications streams.
        for side in (p, d):
            chan = side.workers[0].worker.chan
            self.assertTrue(chan.on_ring)
            self.assertEqual(chan._watches, [], "a stream where the ring should carry the notes")
        woke = threading.Event()
        d.workers[0].set_wakeup(woke.set)
        # A peer's note wakes the engine.
        p.workers[0].worker.chan.queue(self.dd.peer_address, d.sched.settings.engine_id, 0, {"t": "x"})
        p.workers[0].worker.chan.flush()
        self.assertTrue(woke.wait(10), "no wake-up for a note")
        # A transfer of this side's ending on its ring wakes it too (no
        # note comes back to it: it writes into prefill's mailbox).
        woke.clear()
        chan = d.workers[0].worker.chan
        chan.queue(self.dp.peer_address, p.sched.settings.engine_id, 0, {"t": "y"})
        self.assertEqual(chan.flush(), 1)
        self.assertTrue(woke.wait(10), "no wake-up for a ring completion")

    def test_note_writes_are_reaped(self):
        # Every note write's outcome is taken (by the step's poll), so none
        # stays in the client's ring, callback or not.
        p, d = self.sides()
        chan, ring = d.workers[0].worker.chan, d.clients[0].ring
        for i in range(50):
            chan.queue(self.dp.peer_address, p.sched.settings.engine_id, 0, {"t": "z", "i": i})
            chan.flush()
        deadline = time.monotonic() + 10
        while chan.pending() or ring._pending:
            self.assertLess(time.monotonic(), deadline, f"{len(ring._pending)} ring tags never taken")
            d.step()
            time.sleep(0.005)

    def test_flush_in_parts_keeps_the_order(self):
        # A flush in parts (flush_begin under the worker's lock, flush_post
        # without it) holds its place: a flush that comes meanwhile starts
        # its writes only after them.
        p, d = self.sides()
        chan, peer, eng = d.workers[0].worker.chan, self.dp.peer_address, p.sched.settings.engine_id
        self.assertIsNone(chan.flush_begin())  # nothing queued: nothing held
        chan.queue(peer, eng, 0, {"t": "o", "i": 0})
        batch = chan.flush_begin()
        self.assertIsNotNone(batch)
        self.assertFalse(chan.queued())
        later = threading.Event()

        def flush_later():
            chan.queue(peer, eng, 0, {"t": "o", "i": 1})
            chan.flush()
            later.set()

        t = threading.Thread(target=flush_later)
        t.start()
        self.assertFalse(later.wait(0.3), "a flush started before the held one")
        started = chan.flush_post(batch)
        self.assertTrue(later.wait(10))
        t.join()
        self.assertEqual(chan.flush_settle(started, batch[1]), 1)
        deadline = time.monotonic() + 10
        while chan.pending():
            self.assertLess(time.monotonic(), deadline, "note writes never ended")
            d.step()
            time.sleep(0.005)


if __name__ == "__main__":
    unittest.main()
