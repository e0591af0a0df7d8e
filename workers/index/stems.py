"""Porter stems of a text, for BM25 on a backend without a stemmer.

The embedded index stems inside SQLite (FTS5's ``porter`` tokenizer);
Weaviate's BM25 has no stemmer, so the Weaviate backend stores these stems
in a property of their own and searches them with the query's stems. Both
split like FTS5's ``unicode61`` (letters and digits; ``_`` separates) and
run the same Porter algorithm (Snowball's implementation, a well-kept
library rather than a hand-written stemmer). "researching" and "research"
then meet: on LoCoMo dev that took multi-hop recall@10 from ~0.48 to ~0.53.
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata

import snowballstemmer

from memq.workers.index.grams import grams, has_unspaced, query_terms

_WORD = re.compile(r"[^\W_]+")
_local = threading.local()  # a Snowball stemmer keeps state while it stems: one per thread


@functools.lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    # Words repeat (a user's vocabulary is small): cached, a LoCoMo doc's stems
    # cost 20-50 us instead of ~930 us uncached, next to ~16 ms to embed it.
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = snowballstemmer.stemmer("porter")
    return stemmer.stemWord(word)


def stems(text: str) -> str:
    """The Porter stems of ``text``'s words, lowercased, space-separated."""
    words = (_stem(w) for w in _WORD.findall(unicodedata.normalize("NFC", text).lower()))
    return " ".join(w for w in words if w)  # Porter stems a lone "s" to nothing


def _stem_term(term: str) -> str:
    return term if has_unspaced(term) else _stem(term)


def stemmed_grams(text: str) -> str:
    """:func:`~memq.workers.index.grams.grams` of ``text``, its Latin words
    stemmed: what Weaviate stores in a doc's "grams" property."""
    return " ".join(t for t in map(_stem_term, grams(text)) if t)


def stemmed_query_grams(text: str) -> str:
    """A query's terms (:func:`~memq.workers.index.grams.query_terms`),
    stemmed like :func:`stemmed_grams`."""
    return " ".join(t for t in map(_stem_term, query_terms(text)) if t)
