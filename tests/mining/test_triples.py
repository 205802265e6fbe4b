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
    assert ("q", "c0", "n") in seen or all(t["pos_id"] != "c0" for t in kept)


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
