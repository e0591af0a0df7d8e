"""Searchable terms for scripts written without spaces between words.

Chinese, Japanese, Thai (and Lao, Khmer, Myanmar) run words together, and a
Korean word carries its particles ("민수입니다"): a tokenizer that splits at
spaces and punctuation sees a whole clause as one token, so a word inside it
is never found. The usual answer in search engines (Lucene's CJK analyzer,
Elasticsearch's ``cjk_bigram``) is overlapping character bigrams: "机器学习"
is indexed as "机器 器学 学习", and a query's word as its own bigrams, which
all occur in a text that contains the word. Unlike FTS5's ``trigram``
tokenizer it finds two-character words (most Chinese words, "太郎", "天気").
A Latin word glued to such a run ("私はPythonで") becomes a word of its own.

Only chunks that hold such a script yield grams, so an English text has none
and costs no index space. Both backends index and query these same terms
(a second property/column beside the stemmed words).
"""

from __future__ import annotations

import re
import unicodedata

# Han, kana, Hangul, Thai, Lao, Myanmar, Khmer (code point ranges of the blocks).
_UNSPACED = (
    "\u0e00-\u0e7f\u0e80-\u0eff\u1000-\u109f\u1100-\u11ff\u1780-\u17ff"
    "\u3040-\u309f\u30a0-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff\uf900-\ufaff\uff66-\uff9f"
    "\U00020000-\U0003134f"
)
_RUN = re.compile(f"[{_UNSPACED}]+")
# A chunk: letters/digits/marks of any script, split at spaces, punctuation and "_".
_CHUNK = re.compile(r"(?:[^\W_]|[\u0300-\u036f\u0e31\u0e34-\u0e3a\u0e47-\u0e4e])+")
_WORD = re.compile(r"[^\W_]+")


def normal(text: str) -> str:
    """NFC and lowercase: decomposed input ("Cafe\\u0301", jamo) meets composed."""
    return unicodedata.normalize("NFC", text).lower()


def bigrams(run: str) -> list[str]:
    """Overlapping character pairs of a run; a lone character stands for itself."""
    return [run] if len(run) < 2 else [run[i : i + 2] for i in range(len(run) - 1)]


def grams(text: str) -> list[str]:
    """The terms of ``text``'s chunks that hold an unspaced script: each run
    of such a script as its bigrams, the rest of the chunk as its words.
    Empty for a text without such a script."""
    out: list[str] = []
    for chunk in _CHUNK.findall(normal(text)):
        if not _RUN.search(chunk):
            continue
        at = 0
        for m in _RUN.finditer(chunk):
            out += _WORD.findall(chunk[at : m.start()])
            out += bigrams(m.group())
            at = m.end()
        out += _WORD.findall(chunk[at:])
    return out


def has_unspaced(text: str) -> bool:
    return _RUN.search(text) is not None


def query_terms(text: str) -> list[str]:
    """A query's terms for an index with grams: the words of its chunks, a
    chunk that holds an unspaced script as :func:`grams`; in order, once each."""
    out: list[str] = []
    for chunk in _CHUNK.findall(normal(text)):
        out += grams(chunk) if _RUN.search(chunk) else _WORD.findall(chunk)
    return list(dict.fromkeys(out))
