"""Porter stems for the Weaviate backend's BM25 (the embedded index stems in FTS5)."""

from memq.workers.index.stems import stems


def test_inflections_share_a_stem():
    assert stems("Researching") == stems("research") == stems("researched") == "research"
    assert stems("activities") == stems("Activity")


def test_words_split_like_fts5_unicode61():
    assert stems("Caroline's pottery_class, 2023!") == "carolin potteri class 2023"  # a lone "s" stems to nothing
    assert stems("?! ...") == ""
