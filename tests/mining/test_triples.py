"""Step 4: same-document triples, grade > 3 vs grade < 3; already-correct ones; dedup."""

from caliber_jax.mining import mining, triples


def _judged(query_id, doc, chunk, grade, score=0.5):
    return {
        "query_id": query_id,
        "query": f"text of {query_id}",
        "doc_name": doc,
        "chunk_id": chunk,
        "grade": grade,
        "score": score,
    }


def test_extraction_rules():
    judged = [
        _judged("q1", "A", "a1", 4),
        _judged("q1", "A", "a2", 1),
        _judged("q1", "A", "a3", 2),
        _judged("q1", "A", "a4", 3),  # grade 3: neither side
        _judged("q1", "A", "a5", None),  # invalid judgment: unused
        _judged("q1", "B", "b1", 1),  # another document: never paired with a1
        _judged("q1", "B", "b2", 4),
        _judged("q1", "B", "b3", 3),
        _judged("q2", "A", "a2", 4),
        _judged("q2", "A", "a1", 4),  # no negative: no triple
        _judged("q1", "A", "a2", 4),  # a repeat judgment of (q1, a2): the first one counts
    ]
    got = [
        (t["query_id"], t["doc_name"], t["pos_id"], t["neg_id"])
        for t in triples.extract_triples(judged)
    ]
    assert got == [("q1", "A", "a1", "a2"), ("q1", "A", "a1", "a3"), ("q1", "B", "b2", "b1")]


def test_correctness_selection_and_dedup():
    # cos .9 vs .75: d_pos + .1 = .2 > .25? no: .1 + .1 = .2 <= .25 -> correct (cosine distance)
    assert triples.is_correct(0.9, 0.75, margin=0.1, distance="cosine")
    assert not triples.is_correct(0.9, 0.85, margin=0.1, distance="cosine")
    # euclidean: sqrt(2 - 1.8) = .447; sqrt(2 - 1.5) = .707; .447 + .1 <= .707
    assert triples.is_correct(0.9, 0.75, margin=0.1, distance="euclidean")
    rows = [
        {
            "query_id": "q",
            "query": "q",
            "doc_name": "A",
            "pos_id": f"p{i}",
            "neg_id": "n",
            "pos_score": 0.5,
            "neg_score": 0.6,
        }
        for i in range(4)
    ]  # 4 hard
    rows += [
        {
            "query_id": "q",
            "query": "q",
            "doc_name": "A",
            "pos_id": f"c{i}",
            "neg_id": "n",
            "pos_score": 0.9,
            "neg_score": 0.1,
        }
        for i in range(10)
    ]  # 10 already correct
    kept = triples.select_triples(
        rows, margin=0.1, distance="cosine", correct_ratio=0.5, max_per_group=3, seed=0
    )
    assert sum(not t["correct"] for t in kept) == 3  # capped per (query, document)
    assert sum(t["correct"] for t in kept) == 2  # round(0.5 * 3)
    seen = {("q", "p0", "n")}
    fresh = triples.deduplicate(kept + kept, seen)
    assert len(fresh) == len({triples.triple_key(t) for t in kept} - {("q", "p0", "n")})
    assert seen == {("q", "p0", "n")}  # `mine_triples` adds what it keeps


def test_mine_triples_splits_by_document():
    judged = [
        _judged("q", "A", "a1", 4, 0.2),
        _judged("q", "A", "a2", 1, 0.9),
        _judged("q", "B", "b1", 4, 0.2),
        _judged("q", "B", "b2", 2, 0.9),
    ]
    out = mining.mine_triples(
        judged,
        {"A": "train", "B": "val"},
        set(),
        margin=0.1,
        distance="cosine",
        correct_ratio=1.0,
        max_per_group=10,
        seed=0,
    )
    assert [t["pos_id"] for t in out["train"]] == ["a1"]
    assert [t["pos_id"] for t in out["val"]] == ["b1"]


def _triple(query_id, doc, pos, neg, *, correct):
    """A triple the student already orders (cos .9 vs .1) or does not (.5 vs .6)."""
    return {
        "query_id": query_id,
        "query": f"text of {query_id}",
        "doc_name": doc,
        "pos_id": pos,
        "neg_id": neg,
        "pos_score": 0.9 if correct else 0.5,
        "neg_score": 0.1 if correct else 0.6,
    }


def _select(rows, ratio):
    return triples.select_triples(
        rows, margin=0.1, distance="cosine", correct_ratio=ratio, max_per_group=10, seed=0
    )


def test_correct_ratio_zero_keeps_no_correct_triple():
    rows = [_triple("q", "A", f"h{i}", "n", correct=False) for i in range(2)]
    rows += [_triple("q", "A", f"c{i}", "n", correct=True) for i in range(3)]
    assert [t["pos_id"] for t in _select(rows, 0.0)] == ["h0", "h1"]


def test_correct_triples_are_drawn_per_query_and_document():
    """Group (q1, A): 2 hard, no correct one; (q2, A): only correct ones (no hard triple to
    balance); (q1, B): 1 hard, 3 correct. Ratio 1: one correct triple, from (q1, B)."""
    rows = [_triple("q1", "A", f"a{i}", "n", correct=False) for i in range(2)]
    rows += [_triple("q2", "A", f"c{i}", "n", correct=True) for i in range(5)]
    rows += [_triple("q1", "B", "b0", "n", correct=False)]
    rows += [_triple("q1", "B", f"d{i}", "n", correct=True) for i in range(3)]
    kept = _select(rows, 1.0)
    assert [t["pos_id"] for t in kept if not t["correct"]] == ["a0", "a1", "b0"]
    correct = [t for t in kept if t["correct"]]
    assert len(correct) == 1 and correct[0]["query_id"] == "q1" and correct[0]["doc_name"] == "B"
    # Half a correct triple per hard one rounds half up per group: (q1, A) none to draw from,
    # (q1, B) floor(0.5 * 1 + 0.5) = 1.
    assert sum(t["correct"] for t in _select(rows, 0.5)) == 1


def test_deduplication_comes_before_the_ratio():
    """An earlier iteration's hard triple is dropped first, then the ratio is set: 1 hard and
    1 correct remain (deduplicating after the ratio left 1 hard with 2 correct)."""
    judged = [
        {"query_id": "q", "query": "text of q", "doc_name": "A", "chunk_id": c, "grade": g,
         "score": s}
        for c, g, s in [("h0", 4, 0.5), ("h1", 4, 0.5), ("c0", 4, 0.9), ("c1", 4, 0.9),
                        ("n", 1, 0.6), ("m", 1, 0.1)]
    ]  # fmt: skip
    # Triples: (h0|h1) x n hard (cos .5 vs .6); (h0|h1) x m, (c0|c1) x (n|m) correct: 2 hard,
    # 6 correct, and h0 x n was kept by an earlier iteration.
    seen = {("text of q", "h0", "n")}
    out = mining.mine_triples(
        judged,
        {"A": "train"},
        seen,
        margin=0.1,
        distance="cosine",
        correct_ratio=1.0,
        max_per_group=10,
        seed=0,
    )["train"]
    assert sum(not t["correct"] for t in out) == 1 and sum(t["correct"] for t in out) == 1
    assert [t["pos_id"] for t in out if not t["correct"]] == ["h1"]
    # `seen` gains what was kept, not every extracted triple.
    assert seen == {("text of q", "h0", "n")} | {triples.triple_key(t) for t in out}
