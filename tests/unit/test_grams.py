"""Terms of unspaced scripts (memq.workers.index.grams): bigrams, glued Latin words, normal forms."""

from __future__ import annotations

import unicodedata

from memq.workers.index.grams import bigrams, grams, query_terms


def test_an_unspaced_run_becomes_its_bigrams():
    assert grams("我喜欢机器学习") == ["我喜", "喜欢", "欢机", "机器", "器学", "学习"]
    assert bigrams("学") == ["学"]


def test_every_bigram_of_a_word_is_among_its_texts():
    for text, word in [("我喜欢机器学习", "学习"), ("私の名前は太郎です", "太郎"), ("ผมชอบกินข้าวมาก", "ข้าว")]:
        assert set(query_terms(word)) <= set(grams(text))


def test_latin_words_glued_to_a_run_stand_alone_and_english_has_no_grams():
    assert grams("私はPythonでADKを使っています")[:4] == ["私は", "python", "で", "adk"]
    assert grams("The ADK is a great toolkit.") == []
    assert query_terms("How about ADK?") == ["how", "about", "adk"]


def test_decomposed_text_meets_composed_queries():
    nfd = unicodedata.normalize("NFD", "제 이름은 민수입니다")
    assert grams(nfd) == grams("제 이름은 민수입니다")
    assert set(query_terms("민수")) <= set(grams(nfd))
