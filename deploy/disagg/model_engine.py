"""An engine of the disaggregated-serving harness that runs a real model
(``disagg.py --model llama``): a ``transformers`` Llama with random weights
from a fixed seed (deploy/gpu/kv_llama.py builds it; nothing is
downloaded), its KV cache a paged CUDA pool that b2b.connector registers.

It is engine.py's Engine with two parts swapped:

* the pool (ModelPool): one CUDA tensor ``[layers, 2, num_blocks,
  block_size, kv_heads, head_dim]`` (vLLM's stacked NHD per layer).
  Prefill's "compute" of layer 0 runs the model on the request's prompt
  (batch 1); each layer's K/V is then copied into the request's blocks
  before the connector saves (push: writes) that layer.
* decode's run: it rebuilds the cache from its pool's blocks and decodes
  ``--steps`` tokens greedily, replying with every step's logits (raw
  bits) for the router to compare with a one-process reference.

As vLLM does when every prompt token's KV comes from elsewhere, decode
computes the last prompt token itself: it takes the KV of the first
``plen - 1`` tokens from the pool and feeds the last prompt token first.

The prompt is a function of (seed, length), known to every process.
torch and transformers are imported only here, so the synthetic harness
runs where they are not installed."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from types import SimpleNamespace
from typing import Any, List, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpu"))

import engine as eng  # noqa: E402

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")  # CUDA IPC needs cudaMalloc blocks
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def prompt_tokens(seed: int, plen: int, vocab: int) -> List[int]:
    import numpy as np

    return np.random.default_rng([seed, plen]).integers(0, vocab, size=plen).tolist()


def add_model_args(ap: argparse.ArgumentParser, prefix: str = "") -> None:
    """The model's shape (the router passes the same to both engines)."""
    ap.add_argument(f"--{prefix}hidden", type=int, default=512)
    ap.add_argument(f"--{prefix}attn-heads", type=int, default=8)
    ap.add_argument(f"--{prefix}kv-heads", type=int, default=2)
    ap.add_argument(f"--{prefix}vocab", type=int, default=1000)
    ap.add_argument(f"--{prefix}dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument(f"--{prefix}seed", type=int, default=1234)
    ap.add_argument(f"--{prefix}max-positions", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=16, help="greedy decode steps")


class Llama:
    """The model on one GPU, and the two halves of a request's work."""

    def __init__(self, a: Any, layers: int, device: int) -> None:
        import torch
        import kv_llama

        self.torch, self.kl = torch, kv_llama
        self.a, self.layers = a, layers
        torch.cuda.set_device(device)
        self.device = f"cuda:{device}"
        self.dtype = getattr(torch, DTYPES[a.dtype])
        cfg = SimpleNamespace(vocab=a.vocab, hidden=a.hidden, layers=layers, heads=a.attn_heads, kv_heads=a.kv_heads,
                              prompt=a.max_positions, steps=a.steps, attn="eager", seed=a.seed)
        self.model = kv_llama.build_model(torch, cfg, self.dtype, self.device)
        self.head_dim = a.hidden // a.attn_heads

    def prefill(self, prompt: Sequence[int]) -> List[tuple]:
        """[(k, v)] per layer of the whole prompt, each [1, kv_heads, seq, head_dim]."""
        torch = self.torch
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([list(prompt)], device=self.device),
                             past_key_values=self.kl.new_cache(), use_cache=True)
        return self.kl.cache_kv(out.past_key_values, self.layers)

    def decode(self, kv: List[tuple], prompt: Sequence[int]) -> tuple:
        """Tokens and each step's logits (raw bits, numpy) from a cache of
        the first len(prompt) - 1 tokens, the last prompt token fed first."""
        tokens, logits = self.kl.decode_steps(self.torch, self.model, self.kl.cache_from(kv), prompt[-1], self.a.steps)
        return tokens, [b for b, _ in logits]

    def reference(self, prompt: Sequence[int]) -> tuple:
        """One process's answer: prefill's cache, cut before the last token."""
        kv = [(k[:, :, :-1].contiguous(), v[:, :, :-1].contiguous()) for k, v in self.prefill(prompt)]
        return self.decode(kv, prompt)


MODEL: Any = None  # this engine's Llama, built before the pools


class ModelPool:
    """engine.Pool's interface over a CUDA tensor holding real K/V."""

    def __init__(self, client: Any, *, layers: int, num_blocks: int, block_size: int, heads: int, dim: int,
                 kv_layout: str = "NHD", head0: int = 0) -> None:
        if kv_layout != "NHD" or head0 != 0:
            raise ValueError(f"model_engine: kv_layout {kv_layout!r}, head0 {head0}: NHD and one rank only")
        m = MODEL
        torch = m.torch
        if heads != m.a.kv_heads or dim != m.head_dim:
            raise ValueError(f"model_engine: pool of {heads} heads x {dim}, the model has {m.a.kv_heads} x {m.head_dim}")
        self.torch, self.layers, self.num_blocks, self.block_size = torch, layers, num_blocks, block_size
        # NaN where nothing was written: a block id off by one poisons the logits.
        self.t = torch.full((layers, 2, num_blocks, block_size, heads, dim), float("nan"), dtype=m.dtype, device=m.device)
        torch.cuda.synchronize()
        self.caches = {f"model.layers.{i}.self_attn": self.t[i] for i in range(layers)}
        self.names = list(self.caches)
        self._kv: dict = {}

    def _ids(self, ids: Sequence[int]) -> Any:
        return self.torch.tensor(list(ids), dtype=self.torch.int64, device=self.t.device)

    def fill_layer(self, layer: int, ids: Sequence[int], seed: int, ntokens: int) -> None:
        """Layer ``layer`` of the request into its blocks; layer 0 runs the model."""
        torch, key = self.torch, tuple(ids)
        if layer == 0:
            self._kv[key] = MODEL.prefill(prompt_tokens(seed, ntokens, MODEL.a.vocab))
        kv = self._kv[key][layer] if layer < self.layers - 1 else self._kv.pop(key)[layer]
        nb, bs = len(ids), self.block_size
        idx = self._ids(ids)
        for j, x in enumerate(kv):
            seq = x[0].transpose(0, 1)  # [seq, kv_heads, head_dim]
            padded = torch.zeros((nb * bs,) + tuple(seq.shape[1:]), dtype=self.t.dtype, device=self.t.device)
            padded[: seq.shape[0]] = seq
            self.t[layer, j, idx] = padded.view(nb, bs, seq.shape[1], seq.shape[2])
        torch.cuda.synchronize()  # transfers are not ordered against GPU work

    def gather(self, ids: Sequence[int], seq: int) -> List[tuple]:
        """[(k, v)] per layer of the first ``seq`` tokens in blocks ``ids``."""
        blocks = self.t[:, :, self._ids(ids)]  # [layers, 2, nb, bs, heads, dim]
        flat = blocks.reshape(self.layers, 2, -1, blocks.shape[-2], blocks.shape[-1])[:, :, :seq]
        return [tuple(flat[i, j].transpose(0, 1).unsqueeze(0).contiguous() for j in (0, 1)) for i in range(self.layers)]

    def scribble(self, ids: Sequence[int]) -> None:
        self.t[:, :, self._ids(ids)] = float("nan")
        self.torch.cuda.synchronize()

    def fill(self, ids: Sequence[int], seed: int, ntokens: int) -> None:
        for layer in range(self.layers):
            self.fill_layer(layer, ids, seed, ntokens)

    def close(self) -> None:
        self.t = None


class ModelEngine(eng.Engine):
    pool_cls = ModelPool
    compute_thread = False  # the model runs on this engine's GPU, from the loop's thread (its CUDA device)

    def __init__(self, a: argparse.Namespace) -> None:
        global MODEL
        if a.tp != 1:
            raise ValueError(f"model_engine: --tp {a.tp}: one rank only")
        MODEL = Llama(a, a.layers, a.device)
        super().__init__(a)

    def launch(self, q: eng.Req, failed: bool) -> None:
        """Runs the request here, on the engine's thread (torch and CUDA;
        the forward pass synchronizes): not on engine.py's device thread."""
        if q.aborted:
            return super().launch(q, failed)
        torch, p = MODEL.torch, self.pools[0]
        out: dict = {"bad_tokens": 0, "load_failed": failed, "t_ready_ns": q.t_ready, "altered": False}
        torch.cuda.synchronize()
        if failed:  # vLLM's recompute policy: this engine computes the prompt
            self.stats["recomputed"] += 1
            p.fill(q.ids, q.seed, q.plen)
        if q.rid.split(".")[0] == str(self.a.alter_request):
            # The negative control: one received block (V of layer 0, the
            # request's first block) altered before the forward pass.
            p.t[0, 1, q.ids[0]] = 0
            torch.cuda.synchronize()
            out["altered"] = True
        t0 = time.perf_counter_ns()
        prompt = prompt_tokens(q.seed, q.plen, MODEL.a.vocab)
        out["tokens"], logits = MODEL.decode(p.gather(q.ids, q.plen - 1), prompt)
        out["logits"] = [x.tobytes() for x in logits]
        out["decode_ms"] = (time.perf_counter_ns() - t0) / 1e6
        self.stats["decoded"] += 1
        self.release(q)
        self.call("request_finished", self.sched.request_finished, q.r, q.ids)
        self.reply("ok", q.rid, out)


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", type=int, default=0, help="this engine's GPU")
    ap.add_argument("--alter-request", type=int, default=-1,
                    help="decode: the request index whose first received block is altered (negative control)")
    add_model_args(ap)


if __name__ == "__main__":
    eng.main(ModelEngine, add_args)
