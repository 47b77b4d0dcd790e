#!/usr/bin/env python3
"""One daemon, two GPUs: an application's tensors on cuda:0 and cuda:1
(registered by their IPC handles, as an engine's are), a batch of
10,000 gapped, shuffled blocks from the first into the second through the
daemon to itself, over each transport; every block verified on the GPU.
This is the path of a prefill on GPU0 and a decode on GPU1 of one host
(one daemon per host). Prints the median of the daemon's elapsed time
(and the call's) per transport and size.

Usage: PYTHONPATH=client/python python3 one_daemon.py --b2bd BIN [--sizes 128,4096] [--iters 12]
"""
import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import b2b


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--b2bd", required=True)
    ap.add_argument("--sizes", default="128,4096,65536")
    ap.add_argument("--blocks", type=int, default=10000)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--transports", default="local,tcp")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="b2b-one-")
    sock, port = os.path.join(tmp, "s.sock"), free_port()
    shm = f"/dev/shm/b2b-one-{os.getpid()}"
    d = subprocess.Popen([a.b2bd, "--node-name", "one", "--socket", sock, "--shm-dir", shm,
                          "--peer-listen", f"127.0.0.1:{port}", "--data-listen", "127.0.0.1:0",
                          "--insecure", "--calibrate", "off"], stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "d.log"), "w"))
    ok = True
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        c = b2b.Client(sock)
        n = a.blocks
        print(f"{'transport':>9} {'block':>8} {'median ms':>10} {'call ms':>8}  verified")
        for size in [int(x) for x in a.sizes.split(",")]:
            slots = 2 * n
            src = torch.randint(0, 255, (slots * size,), dtype=torch.uint8, device="cuda:0")
            dst = torch.zeros(slots * size, dtype=torch.uint8, device="cuda:1")
            name = f"one-dst-{size}"
            rs, rd = c.register_cuda(src), c.register_cuda(dst, export_name=name)
            g = torch.Generator().manual_seed(size)
            so = torch.randperm(slots, generator=g)[:n] * size
            do = torch.randperm(slots, generator=g)[:n] * size
            idx = torch.arange(size)
            for tr in a.transports.split(","):
                els, calls = [], []
                for it in range(a.iters + 1):
                    dst.zero_()
                    torch.cuda.synchronize(1)
                    t0 = time.perf_counter()
                    r = c.batch_transfer(rs, f"127.0.0.1:{port}", name, so.tolist(), do.tolist(), block_size=size, transport=tr)
                    call = time.perf_counter() - t0
                    if it > 0:
                        els.append(r.elapsed * 1e3)
                        calls.append(call * 1e3)
                good = bool(torch.equal(dst[(do[:, None] + idx).reshape(-1).to("cuda:1")].cpu(),
                                        src[(so[:, None] + idx).reshape(-1).to("cuda:0")].cpu()))
                ok &= good
                print(f"{tr:>9} {size:>8} {statistics.median(els):>10.3f} {statistics.median(calls):>8.3f}  {good}", flush=True)
            c.deregister(rd)
            c.deregister(rs)
        c.close()
    finally:
        d.terminate()
        d.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
