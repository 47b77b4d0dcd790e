"""Key notes and transfers armed on them (docs/notes.md): a pull armed on
``b2b.on_note(mailbox, key)`` waits in daemon A until daemon B's key note
naming ``key`` lands on the mailbox, then reads; every block checked, and
it must read the bytes B wrote after the arm (it did not run early). A
note before the arm fires it at once; a key never sent ends at the
deadline; bad triggers are refused with the field named."""

from __future__ import annotations

import json
import threading
import time
import unittest
import uuid

import daemon_harness
import grpc
import numpy as np

import b2b
from b2b.v1 import b2b_pb2 as pb

POOL, BLOCK = 64, 256


class KeyNoteTest(daemon_harness.DaemonPair):
    def setUp(self):
        tag = uuid.uuid4().hex[:6]
        self.rng = np.random.default_rng(7)
        # A: the reader (decode) with its mailbox; B: the source (prefill).
        self.mbox = self.a.register_host(4096, f"mbox-{tag}")
        self.sink = self.a.register_host(POOL * BLOCK)
        self.local = f"sink-{tag}"
        self.a.register_layout(self.local, [(self.sink, 0, BLOCK, BLOCK)], POOL)
        self.src = self.b.register_host(POOL * BLOCK, f"src-{tag}", readers=["*"])
        self.remote = f"srcl-{tag}"
        self.b.register_layout(self.remote, [(self.src, 0, BLOCK, BLOCK)], POOL, export_name=self.remote,
                               readers=["*"])
        self.scratch = self.b.register_host(4096)
        self.peer_a = self.da.peer_address

    def send_note(self, keys, payload=b"") -> None:
        """B writes 8 bytes into A's mailbox with a key note."""
        self.b.batch_transfer(self.scratch, self.peer_a, self.mbox.export_name, [0], [0], block_size=8,
                              notification=b2b.key_note(keys, payload))

    def arm(self, key, ids, timeout=20.0):
        return self.a.start_many([b2b.Blocks(self.local, self.peer_b, self.remote, ids, ids, op="read",
                                             after=b2b.on_note(self.mbox, key), timeout=timeout)])[0]

    def fill(self) -> np.ndarray:
        data = self.rng.integers(0, 256, POOL * BLOCK, dtype=np.uint8)
        self.src.array[:] = data
        return data

    def check(self, ids, data) -> None:
        got = np.asarray(self.sink.array).reshape(POOL, BLOCK)
        want = data.reshape(POOL, BLOCK)
        for i in ids:
            self.assertTrue(np.array_equal(got[i], want[i]), f"block {i}")

    def test_pull_waits_for_its_key(self):
        ids = list(range(0, POOL, 3))
        self.fill()
        w = self.a.watch(self.mbox)
        t = self.arm("req-1", ids)
        time.sleep(0.3)
        self.assertFalse(t.done(), "an armed pull ran before its key note")
        data = self.fill()  # what it must read: written after the arm
        self.send_note(["other", "req-1"], b'{"t":"ready"}')
        t.wait(20)
        self.assertIsNone(t.error)
        self.check(ids, data)
        ph = t.result.phases
        self.assertGreater(ph.trigger_seen_unix_ns, 0)
        n = next(iter(w))  # the watcher gets the whole note
        self.assertEqual(b2b.parse_key_note(n.notification), ([b"other", b"req-1"], b'{"t":"ready"}'))
        w.cancel()

    def test_note_before_arm_fires_at_once(self):
        data = self.fill()
        self.send_note(["early"])
        t = self.arm("early", [5, 6])
        t.wait(20)
        self.assertIsNone(t.error)
        self.check([5, 6], data)

    def test_key_never_sent_ends_at_deadline(self):
        t = self.arm("never", [1], timeout=0.4)
        with self.assertRaises(b2b.B2BError) as cm:
            t.wait(20)
        self.assertEqual(cm.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)

    def test_cancel_armed(self):
        t = self.arm("cancelled", [1])
        t.cancel()
        self.assertIsNotNone(t.error)
        self.send_note(["cancelled"])  # fires nothing, breaks nothing
        data = self.fill()
        t2 = self.arm("cancelled", [2])  # the key was seen: runs at once
        t2.wait(20)
        self.check([2], data)

    def test_refusals(self):
        cases = [
            (b2b.Blocks(self.local, self.peer_b, self.remote, [1], [1], op="read",
                        after=pb.TransferTrigger(note_region_id=self.mbox.id, note_key=b"k" * 65)),
             grpc.StatusCode.INVALID_ARGUMENT, "after.note_key is 65 bytes"),
            (b2b.Blocks(self.local, self.peer_b, self.remote, [1], [1], op="read",
                        after=pb.TransferTrigger(note_region_id=self.mbox.id)),
             grpc.StatusCode.INVALID_ARGUMENT, "after.note_key is 0 bytes"),
            (b2b.Blocks(self.local, self.peer_b, self.remote, [1], [1], op="read",
                        after=pb.TransferTrigger(note_region_id="no-such-region", note_key=b"k")),
             grpc.StatusCode.NOT_FOUND, "after.note_region_id"),
            (b2b.Blocks(self.local, self.peer_b, self.remote, [1], [1], op="read",
                        after=pb.TransferTrigger(counter_region_id=self.mbox.id, note_region_id=self.mbox.id,
                                                          note_key=b"k")),
             grpc.StatusCode.INVALID_ARGUMENT, "give one"),
        ]
        for item, code, text in cases:
            with self.subTest(text=text):
                t = self.a.start_many([item])[0]
                try:  # over gRPC refused at the start; over the ring in its completion
                    t.wait(20)
                except b2b.B2BError:
                    pass
                self.assertIsNotNone(t.error)
                self.assertEqual(t.error.code, code, t.error)
                self.assertIn(text, str(t.error))
        with self.assertRaises(b2b.B2BError):
            b2b.on_note(self.mbox, "k" * 65)
        with self.assertRaises(b2b.B2BError):
            b2b.key_note([])
        for one in ("abc", b"abc"):  # one key, not a list: not three keys of one character
            with self.assertRaises(b2b.InvalidArgumentError) as cm:
                b2b.key_note(one)
            self.assertIn("give a list of keys", str(cm.exception))


    def test_armed_note_alone_waits_for_its_key(self):
        """A note sent alone (no ids) armed on a key goes out only once the
        key lands (over the ring in KeyNoteRingTest)."""
        tag = uuid.uuid4().hex[:6]
        bbox = self.b.register_host(4096, f"bbox-{tag}")
        self.b.register_layout(f"bboxl-{tag}", [(bbox, 0, 8, 8)], 1, export_name=f"bboxl-{tag}")
        with self.b.watch(bbox, timeout=30) as w:
            key = f"alone-{tag}"
            h = self.a.start_many([b2b.Blocks(self.local, self.peer_b, f"bboxl-{tag}", [], [], notification=b"hello",
                                              after=b2b.on_note(self.mbox, key), timeout=20)])[0]
            self.assertEqual(type(h).__name__.startswith("Ring"), self.a.ring is not None, type(h).__name__)
            time.sleep(0.3)
            self.assertFalse(h.done(), "an armed note went before its key")
            self.send_note([key])
            h.wait(20)
            self.assertIsNone(h.error)
            self.assertEqual(next(iter(w)).notification, b"hello", "the armed note, after its key")
            self.assertGreater(h.result.phases.trigger_seen_unix_ns, 0)


class KeyNoteRingTest(KeyNoteTest):
    """The same, with A's daemon serving the shared-memory ring: the armed
    pull rides an arena record (flags arena and note) and its end comes
    back on the completion ring."""

    a_args = ("--submit-socket", "{dir}/submit.sock")

    def arm(self, key, ids, timeout=20.0):
        t = super().arm(key, ids, timeout)
        if t.error is None:
            self.assertIsNotNone(self.a.ring, "no ring")
            self.assertTrue(type(t).__name__.startswith("Ring"), f"{type(t).__name__}: not on the ring")
        return t

    def test_pull_waits_for_its_key(self):
        ids = list(range(1, POOL, 5))
        self.fill()
        t = self.arm("ring-req", ids)
        time.sleep(0.3)
        self.assertFalse(t.done(), "an armed pull ran before its key note")
        data = self.fill()
        sent = time.time_ns()
        self.send_note(["ring-req"])
        t.wait(20)
        self.assertIsNone(t.error)
        self.check(ids, data)
        # The completion's tail carries the daemon's times, as gRPC's phases.
        ph = t.result.phases
        self.assertTrue(sent <= ph.trigger_seen_unix_ns <= ph.posted_unix_ns <= ph.landed_unix_ns <= time.time_ns(), ph)

    def test_many_armed_do_not_block_the_ring(self):
        """More armed pulls than the ring runs at once (64) wait without
        holding up a plain transfer posted after them."""
        data = self.fill()
        armed = [self.arm(f"k{i}", [i % POOL]) for i in range(100)]
        plain = self.a.start_many([b2b.Blocks(self.local, self.peer_b, self.remote, [7], [7], op="read")])[0]
        plain.wait(20)
        self.assertIsNone(plain.error)
        self.assertFalse(any(t.done() for t in armed))
        self.send_note([f"k{i}" for i in range(100)])
        for t in armed:
            t.wait(20)
            self.assertIsNone(t.error)
        self.check(sorted({i % POOL for i in range(100)}), data)


class KeyNoteFormatTest(unittest.TestCase):
    def test_round_trip_and_garbage(self):
        n = b2b.key_note(["a", b"\x00\xff" * 32], b"payload")
        self.assertEqual(b2b.parse_key_note(n), ([b"a", b"\x00\xff" * 32], b"payload"))
        for bad in (b"", b2b.notes.KEY_MAGIC, b2b.notes.KEY_MAGIC + b"\x00", b2b.notes.KEY_MAGIC + b"\x01\x05ab",
                    b2b.notes.KEY_MAGIC + b"\x01\x00", b"plain json"):
            self.assertIsNone(b2b.parse_key_note(bad), bad)


if __name__ == "__main__":
    unittest.main()


class ChannelKeysTest(unittest.TestCase):
    """The connector's channel packs a step's notes per peer rank into as
    few writes as fit 4,096 bytes; keyed notes put their keys (once each)
    in the write's key note, and a write never carries more than 255 keys
    or more than 4,096 bytes."""

    class FakeClient:
        def __init__(self):
            self.items = []

        def start_many(self, items, timeout=None):
            self.items += items

            class H:
                id, error, outcome = 1, None, None
            return [H() for _ in items]

    def channel(self):
        from b2b.connector.channel import Channel
        ch = Channel.__new__(Channel)  # no daemon: only flush's packing
        ch.client, ch.transport, ch.timeout = self.FakeClient(), None, 1.0
        ch._out, ch._inflight, ch._src_layout = {}, [], "src"
        ch._posting = threading.Lock()
        return ch

    def test_packing(self):
        ch = self.channel()
        ch.queue("p", "e", 0, {"t": "where", "req": "a"})
        ch.queue("p", "e", 0, {"t": "ready", "req": "a"}, key=b"K1")
        ch.queue("p", "e", 0, {"t": "ready", "req": "b"}, key=b"K1")  # the same key: once
        ch.queue("p", "e", 0, {"t": "ready", "req": "c"}, key=b"K2")
        ch.queue("p", "e", 1, {"t": "want", "req": "d"})  # another rank: another write
        self.assertEqual(ch.flush(), 2)
        by_layout = {x.remote_layout: x for x in ch.client.items}
        keys, payload = b2b.parse_key_note(by_layout["e.mboxl.r0"].notification)
        self.assertEqual(keys, [b"K1", b"K2"])
        self.assertEqual([n["req"] for n in json.loads(payload)["n"]], ["a", "a", "b", "c"])
        self.assertIsNone(b2b.parse_key_note(by_layout["e.mboxl.r1"].notification))
        self.assertEqual(list(by_layout["e.mboxl.r0"].local_ids), [])  # a note alone: no block

    def test_limits(self):
        ch = self.channel()
        for i in range(600):
            ch.queue("p", "e", 0, {"t": "ready", "req": str(i)}, key=b"%03d" % i + b"k" * 40)
        ch.flush()
        seen = []
        for x in ch.client.items:
            self.assertLessEqual(len(x.notification), 4096)
            keys, payload = b2b.parse_key_note(x.notification)
            self.assertLessEqual(len(keys), 255)
            body = json.loads(payload)
            reqs = [n["req"] for n in body["n"]] if body.get("t") == "multi" else [body["req"]]
            self.assertEqual(len(keys), len(reqs))
            seen += reqs
        self.assertEqual(seen, [str(i) for i in range(600)])


class WhereKeyTest(unittest.TestCase):
    """A peer's "where" note whose key is missing or not a key must not
    break decode's step: its ids are kept and read when "ready" comes."""

    def test_bad_keys(self):
        from b2b.connector import worker as wk
        for bad in (None, "", "zz", "00" * 65, 7):
            self.assertIsNone(wk._note_key(bad), bad)
        self.assertEqual(wk._note_key("0aff"), b"\x0a\xff")

    def test_where_without_a_key_reads_on_ready(self):
        from b2b.connector import worker as wk
        w = wk.WorkerHalf.__new__(wk.WorkerHalf)
        ld = wk._Load(req=type("R", (), {"wait_ready": True, "remote_block_ids": None})(), deadline=0.0)
        w._loads, w._by_remote, w._ready_parts = {"d1": ld}, {"p1": "d1"}, {}
        readied = []
        w._ready = lambda rid, ids, at, pulls: readied.append((rid, ids))
        notes = [("peer", {"t": "where", "req": "p1", "ids": [4, 5], "key": "not-hex", "_at": 1})]
        w.chan = type("C", (), {"take": lambda self: notes})()
        w._start_pulls = lambda pulls, arm=False: None
        for attr in ("_released", "_early_ids", "_ids_parts", "_wants", "_pulled", "_computing", "_held", "_saves"):
            setattr(w, attr, {})
        w.s = type("S", (), {"release_timeout": 10.0})()
        w._swept, w._to_fire, w._to_arm = 0.0, [], []
        w._mark = lambda *a, **k: None
        w._take_notes()  # the bad key: nothing armed, nothing read, no exception
        self.assertEqual(readied, [])
        self.assertEqual(ld.where_ids, [4, 5])
        notes[:] = [("peer", {"t": "ready", "req": "p1", "_at": 2})]
        w._take_notes()
        self.assertEqual(readied, [("p1", [4, 5])])


class NotifyRegionTest(daemon_harness.DaemonPair):
    """NotifyRegion: a client's note to its own region reaches the region's
    watchers (sender "local") and fires the transfers armed there on its
    keys, over gRPC and over the ring; an empty or oversized note and an
    unknown region are refused naming the field."""

    a_args = ("--submit-socket", "{dir}/submit.sock")

    def test_local_note_fires_an_armed_note(self):
        tag = uuid.uuid4().hex[:6]
        sig = self.a.register_host(4096)  # not exported: armed keys only
        box = self.a.register_host(4096, f"nbox-{tag}")
        bbox = self.b.register_host(4096, f"nbbox-{tag}")
        self.b.register_layout(f"nbl-{tag}", [(bbox, 0, 8, 8)], 1, export_name=f"nbl-{tag}")
        self.a.register_layout(f"nal-{tag}", [(self.a.register_host(4096), 0, 8, 8)], 1)
        gr = b2b.Client(self.da.socket, ring=False)
        self.addCleanup(gr.close)
        for name, c in (("ring", self.a), ("grpc", gr)):
            if name == "ring":
                self.assertIsNotNone(c.ring, "no ring")
            key = f"go-{tag}-{name}"
            with self.b.watch(bbox, timeout=30) as w:
                h = self.a.start_many([b2b.Blocks(f"nal-{tag}", self.peer_b, f"nbl-{tag}", [], [], notification=name.encode(),
                                                  after=b2b.on_note(sig, key), timeout=20)])[0]
                time.sleep(0.2)
                self.assertFalse(h.done(), f"{name}: the armed note went before the local key")
                self.assertEqual(c.notify_region(sig, b2b.key_note([key])), 0)  # no watcher on sig
                h.wait(20)
                self.assertIsNone(h.error, name)
                self.assertEqual(next(iter(w)).notification, name.encode())
            with self.a.watch(box, timeout=30) as w:  # a local note reaches the region's own watchers
                self.assertEqual(c.notify_region(box, b"plain " + name.encode()), 1)
                n = next(iter(w))
                self.assertEqual((n.notification, n.sender), (b"plain " + name.encode(), "local"))
        for name, c in (("ring", self.a), ("grpc", gr)):
            for region, note, err, text in (
                (sig, b"", b2b.InvalidArgumentError, "notification is 0 bytes: want 1 to 4096"),
                (sig, b"x" * 4097, b2b.InvalidArgumentError, "notification is 4097 bytes: want 1 to 4096"),
                ("r-no-such", b"x", b2b.NotFoundError, "r-no-such"),
            ):
                with self.assertRaises(err, msg=f"{name}: {text}") as cm:
                    c.notify_region(region, note)
                self.assertIn(text, str(cm.exception), name)


class RingWatchTest(daemon_harness.DaemonPair):
    """A ring watch (op watch): a peer's notes to an exported region come
    back whole and in order as the ring's completions, 1 to 4096 bytes; a
    cancel ends it; an unexported region is refused naming it."""

    a_args = ("--submit-socket", "{dir}/submit.sock")

    def test_notes_come_over_the_ring(self):
        ring = self.a.ring
        self.assertIsNotNone(ring, "no ring")
        tag = uuid.uuid4().hex[:6]
        box = self.a.register_host(4096, f"rwbox-{tag}")
        src = self.b.register_host(4096)
        w = ring.watch(box.id)
        sent = [b"hi", bytes(range(256)) * 4, b"z" * 4096, b"{}"]
        for n in sent:
            self.b.batch_transfer(src, self.peer_a, f"rwbox-{tag}", [0], [0], block_size=8, notification=n)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < len(sent) and time.monotonic() < deadline:
            got += ring.take_notes(w)
            time.sleep(0.01)
        self.assertEqual([n.notification for n in got], sent)
        self.assertEqual({(n.sender, n.region, n.blocks, n.dropped) for n in got}, {("b", f"rwbox-{tag}", 1, 0)})
        ring.cancel_watch(w)
        deadline = time.monotonic() + 10
        while w.ended is None and time.monotonic() < deadline:
            ring.take_notes(w)
            time.sleep(0.01)
        self.assertIsInstance(w.ended, b2b.CancelledError)
        hidden = self.a.register_host(4096)
        with self.assertRaises(b2b.FailedPreconditionError) as cm:
            ring.watch(hidden.id)
        self.assertIn(f'region_id "{hidden.id}" is not exported', str(cm.exception))
        with self.assertRaises(b2b.NotFoundError):
            ring.watch("r-no-such")
        ring.ping()  # the ring serves on

    @property
    def peer_a(self):
        return self.da.peer_address
