"""The stand-in for an engine's GPU: a process of its own that maps the
engine's KV pools (the daemon's shared memory, Pool.mapped) and runs the
model's work on them, prefill's layer fills and decode's checks.

A GPU's work takes no CPU and no interpreter lock from the engine's loop, the
connector or the daemons. On a thread of the engine, the stand-in's numpy
work took the lock between its calls and the engine's loop and the
connector's ring thread waited for it: handover minus wire over tcp went
from 0.54 to 0.80 ms at the median of 6 runs when decode checked on a thread
instead of not at all. In its own process, at the engine's --compute-nice,
it competes for the cores only.

Engine side: ``Device(pools, nice)`` starts it; ``call(op, rank, *args)``
runs ``Pool.op(*args)`` on rank ``rank``'s pool there and returns its
result. One caller at a time (each engine thread that needs one has its
own). The process ends when the engine closes its pipe, or dies."""

import os
import pickle
import subprocess
import sys
from typing import Any, List

HERE = os.path.dirname(os.path.abspath(__file__))


class DeviceError(RuntimeError):
    """The model's work failed in the device process (its traceback in
    the message), or the process is gone."""


class Device:
    def __init__(self, pools: List[Any], nice: int = 0) -> None:
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=None, close_fds=True)
        self._send({"pools": [p.spec() for p in pools], "nice": nice})
        if self._recv() != "ready":
            raise DeviceError("device process did not start")

    def _send(self, msg: Any) -> None:
        pickle.dump(msg, self.p.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.p.stdin.flush()

    def _recv(self) -> Any:
        try:
            return pickle.load(self.p.stdout)
        except EOFError:
            raise DeviceError(f"device process exited ({self.p.poll()})") from None

    def call(self, op: str, rank: int, *args: Any) -> Any:
        self._send((op, rank, args))
        ok, out = self._recv()
        if not ok:
            raise DeviceError(out)
        return out

    def close(self) -> None:
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.p.stdout.close()


def _serve() -> None:
    import traceback

    sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
    from b2b.connector.testing import Pool

    rd, wr = sys.stdin.buffer, sys.stdout.buffer
    spec = pickle.load(rd)
    if spec["nice"]:
        os.setpriority(os.PRIO_PROCESS, 0, spec["nice"])
    pools = [Pool.mapped(**s) for s in spec["pools"]]
    for p in pools:  # the pattern's tables now, not in the first request's compute (30 ms here)
        p._tables(1)
    ops = {"fill_layers", "fill", "check"}

    def reply(msg: Any) -> None:
        pickle.dump(msg, wr, protocol=pickle.HIGHEST_PROTOCOL)
        wr.flush()

    reply("ready")
    while True:
        try:
            op, rank, args = pickle.load(rd)
        except EOFError:
            return
        try:
            if op not in ops:
                raise ValueError(f"device: unknown op {op!r}")
            if op == "fill_layers":  # one layer of a step's requests: [(ids, seed, ntokens)]
                layer, reqs = args
                for ids, seed, n in reqs:
                    pools[rank].fill_layer(layer, ids, seed, n)
                reply((True, None))
            else:
                reply((True, getattr(pools[rank], op)(*args)))
        except Exception:  # noqa: BLE001 - handed back to the engine, which fails its row
            reply((False, traceback.format_exc()))


if __name__ == "__main__":
    _serve()
