"""The relevance floor (``recall.min_similarity``) of each embedder's vectors.

Cosine similarities of two models are on different scales: MiniLM's
unrelated pairs sit near 0, multilingual-e5's near 0.7. So the floor is
calibrated per model on LoCoMo dev (``tests/bench/floor_calibration.py
--embedder ...``: the highest floor that costs vector recall@10 under a
third of a point) and recorded with every index generation when it is
created (:class:`memq.workers.index.backends.base.IndexMeta`); a search
applies the live generation's floor unless ``recall.min_similarity`` is set.

The names are the embedders' ``model`` strings, spelled out here so that
this module imports no model code (a unit test checks they agree).
"""

from __future__ import annotations

CALIBRATED: dict[str, float] = {
    "local:all-MiniLM-L6-v2-int8": 0.36,
    "local:multilingual-e5-small-q4": 0.80,
}
# A model nobody calibrated (an OpenAI-compatible endpoint's): MiniLM's
# floor, the one every model had before floors were per embedder.
DEFAULT = 0.36


def floor_for(model: str) -> float:
    """The floor a new generation of ``model`` records."""
    return CALIBRATED.get(model, DEFAULT)
