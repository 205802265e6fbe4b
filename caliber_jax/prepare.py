"""Entry point: corpus file -> passages with one numeric perturbation each, splits, NumGap, stats.

    python -m caliber_jax.prepare --config configs/caliber.py [--config.prepare.input=F ...]

Writes into `config.data.dir`: `passages.jsonl` (every passage: {"id", "text", "doc_name", ...,
"category", "perturbed"}, the last two null when no rule fires), `train.jsonl` and `val.jsonl`
(a seeded share of whole documents is held out for validation), `stats.json` and, with
`prepare.numgap`, `numgap_dev.jsonl` / `numgap_test.jsonl` built from the held-out documents only,
so the NumGap test set never overlaps training text. FinanceBench evaluation filings are left out
unless `prepare.include_eval_docs`.
"""

import collections
import os
import random
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from caliber_jax import cli, paths
from caliber_jax.data import corpus, numgap, perturb
from caliber_jax.eval import numfine


def choose_perturbation(
    text: str, *, seed: int, categories: Sequence[str], rules: perturb.Rules
) -> tuple[dict[str, str], str | None]:
    """Returns (each firing category -> perturbed text, the category picked by `seed`)."""
    fired = perturb.perturb_all(text, seed=seed, categories=categories, rules=rules)
    if not fired:
        return fired, None
    return fired, random.Random(seed).choice(sorted(fired))


# The passage fields prepare derives (with `neighbour_k`, `queries`; "category" and "perturbed"
# always): a corpus record's own fields of these names are dropped, not read as prepare's.
DERIVED_FIELDS = ("query", "neighbour", "train_neighbour", "category", "perturbed")


def prepare(
    input_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    text_field: str = "text",
    min_chars: int = 200,
    max_chars: int = 1200,
    include_eval_docs: bool = False,
    seed: int = 0,
    categories: Sequence[str] = perturb.CATEGORIES,
    build_numgap: bool = False,
    quotas_test: Mapping[str, int] = numgap.PAPER_QUOTAS_TEST,
    quotas_dev: Mapping[str, int] = numgap.PAPER_QUOTAS_DEV,
    bm25_k: int = 10,
    heldout_fraction: float = 0.0,
    max_train_passages: int = 0,
    max_val_passages: int = 0,
    numfine_items: int = 0,
    neighbour_k: int = 0,
    queries: bool = False,
    balance_rules: bool = False,
    rules: perturb.Rules = perturb.PAPER_RULES,
    category_weights: Mapping[str, float] | None = None,
    queries_only: bool = False,
    mined_dev: int = 0,
    query_style: str = "plain",
) -> dict[str, Any]:
    """Cuts `input_path` into passages, perturbs them, optionally builds NumGap; returns stats.

    Each passage gets one perturbation, drawn uniformly among the `categories` that fire on it;
    it depends only on (`seed`, passage id, `categories`). NumGap uses its own quotas. All
    files are written atomically into `output_dir`.

    `heldout_fraction` of the documents (at least one when > 0 and there are two or more) go to
    `val.jsonl` and are the only source of NumGap (with none held out, NumGap comes from every
    passage, training ones included, and stats' "numgap_source" says so); the rest go to
    `train.jsonl`. The caps (0 = none) keep a seeded sample of each split. `neighbour_k` > 0 gives
    every training passage a "neighbour" field (`mine_neighbours`): the row in `train.jsonl` of a
    topical BM25 neighbour, or null; and every validation passage a "train_neighbour" field, its
    neighbour among the training passages (`mine_heldout_neighbours`), or null. `queries` gives
    every passage of both splits a "query" field (`make_queries`), a question about it or null.
    `balance_rules` draws the training passages' perturbations again so that every rule of a
    category (each scale swap, %/bps, each direction-word pair, ...) is about equally common
    (`rebalance_rules`), and passages.jsonl and stats.json's counts record those redrawn ones (stats
    "chosen" over every passage, "train_chosen" over train.jsonl); validation and NumGap are
    unchanged. `rules` (`perturb.Rules`: where direction words count, which scale words swap) holds
    for every split and NumGap.
    `category_weights` (with `balance_rules` only) draws the training category in proportion to
    these weights among those that fire (1 for a category left out), e.g. {"polarity": 3}.
    `numfine_items` > 0 also writes `numfine_test.jsonl`: NumFinE units (graded variants of one
    number) from the same held-out documents.
    `queries_only` (with `queries`) keeps only the training passages that get a question, before
    the cap: the mined phase's data, every row a (question, passage) pair.
    `mined_dev` > 0 (with `queries` and held-out documents) writes `mined_dev.jsonl`: up to that
    many questions of held-out passages, each asked of one passage only, in FinanceBench's
    format (`retrieval.load_financebench`), the retrieval dev set the mined recipe is chosen on.
    Preparing into a folder prepared before replaces its dataset: stats.json (written last, the
    mark of a finished prepare) and every optional file this run does not write are removed
    before the first write.
    """
    if (queries_only or mined_dev) and not queries:
        raise ValueError("prepare.queries_only and prepare.mined_dev need prepare.queries=True")
    tilted = len({(category_weights or {}).get(c, 1.0) for c in categories}) > 1
    if tilted and not balance_rules:
        raise ValueError("prepare.category_weights applies to the redrawn training perturbations: "
                         "set prepare.balance_rules too")  # fmt: skip
    unknown = sorted(set(category_weights or {}) - set(perturb.CATEGORIES))
    if unknown or any(w <= 0 for w in (category_weights or {}).values()):
        raise ValueError(f"prepare.category_weights={dict(category_weights)}: categories must be "
                         f"among {perturb.CATEGORIES}, weights > 0")  # fmt: skip
    if build_numgap:  # before any write: a bad quota found after train.jsonl was replaced
        # left the folder half old, half new
        numgap.check_quotas(quotas_test, "prepare.numgap_quotas_test")
        numgap.check_quotas(quotas_dev, "prepare.numgap_quotas_dev")
    records = corpus.load_records(input_path, text_field=text_field)
    passages = list(
        corpus.make_passages(
            records,
            min_chars=min_chars,
            max_chars=max_chars,
            exclude_eval_docs=not include_eval_docs,
        )
    )
    dropped = sorted({key for passage in passages for key in DERIVED_FIELDS if key in passage})
    if dropped:
        # A record's own "query" or "neighbour" would be read as prepare's: questions trained
        # (and embedded) with queries off, every row's neighbour a row number the user never meant.
        print(f"prepare: {input_path}: the records' field(s) {', '.join(map(repr, dropped))} "
              f"name what prepare writes itself: dropped", file=sys.stderr)  # fmt: skip
        for passage in passages:
            for key in dropped:
                passage.pop(key, None)
    if not passages:
        raise ValueError(
            f"{input_path}: no usable documents (no record has a '{text_field}' text that "
            f"makes a passage of at least {min_chars} characters"
            + ("" if include_eval_docs else " outside the evaluation filings")
            + ")"
        )
    admits = dict.fromkeys(perturb.CATEGORIES, 0)
    for passage in passages:
        fired, category = choose_perturbation(
            passage["text"],
            seed=perturb.derive_seed(seed, passage["id"]),
            categories=categories,
            rules=rules,
        )
        for name in fired:
            admits[name] += 1
        passage["category"] = category
        passage["perturbed"] = fired[category] if category is not None else None
    output_dir = paths.as_path(output_dir)  # local, file:// or gs://: writes go through epath
    heldout = heldout_documents(
        sorted({p["doc_name"] for p in passages}), fraction=heldout_fraction, seed=seed
    )
    train = [p for p in passages if p["doc_name"] not in heldout]
    heldout_passages = [p for p in passages if p["doc_name"] in heldout]
    asked: dict[str, str] = {}  # queries_only: the training questions, asked once
    if queries_only:
        questions = make_queries(train, style=query_style)
        asked = {p["id"]: q for p, q in zip(train, questions, strict=True) if q}
        train = [p for p in train if p["id"] in asked]
    train = sample(train, max_train_passages, seed=seed)
    # The cap is validation's alone: NumGap draws from every held-out passage (below).
    val = sample(heldout_passages, max_val_passages, seed=seed)
    if balance_rules:
        train = rebalance_rules(
            train,
            categories=categories,
            seed=seed,
            rules=rules,
            category_weights=category_weights,
        )
        # passages.jsonl (and the counts below) record the draws train.jsonl holds.
        redrawn = {p["id"]: p for p in train}
        passages = [redrawn.get(p["id"], p) for p in passages]
    if mined_dev and not heldout_passages:
        raise ValueError("prepare.mined_dev needs held-out documents (heldout_fraction > 0)")
    # A folder prepared before holds one dataset after this: its marker (stats.json, written
    # last) and every optional file this run does not write go before the first write.
    written = {"val.jsonl": bool(val), "mined_dev.jsonl": bool(mined_dev),
               "numgap_dev.jsonl": build_numgap, "numgap_test.jsonl": build_numgap,
               "numfine_test.jsonl": bool(numfine_items)}  # fmt: skip
    for name in ["stats.json", *(name for name, kept in written.items() if not kept)]:
        (output_dir / name).unlink(missing_ok=True)
    corpus.save_jsonl(output_dir / "passages.jsonl", passages)
    if neighbour_k:
        train_texts = [p["text"] for p in train]
        neighbours = mine_neighbours(train_texts, k=neighbour_k)
        train = [{**p, "neighbour": n} for p, n in zip(train, neighbours, strict=True)]
        # Validation rows get theirs among the training passages ("train_neighbour": a row of
        # train.jsonl), so that validation scores the objective being trained.
        found = mine_heldout_neighbours(train_texts, [p["text"] for p in val], k=neighbour_k)
        val = [{**p, "train_neighbour": n} for p, n in zip(val, found, strict=True)]
    if queries:
        # A training question per passage (the query-geometry term), from the offline
        # generator of the mining pipeline: the passage's own numeric facts, no FinanceBench.
        questions = ([asked[p["id"]] for p in train] if queries_only
                     else make_queries(train, style=query_style))  # fmt: skip
        train = [{**p, "query": q} for p, q in zip(train, questions, strict=True)]
        val_questions = make_queries(val, style=query_style)
        val = [{**p, "query": q} for p, q in zip(val, val_questions, strict=True)]
    corpus.save_jsonl(output_dir / "train.jsonl", train)
    if mined_dev:
        dev_records = mined_dev_records(heldout_passages, cap=mined_dev, seed=seed,
                                        style=query_style)  # fmt: skip
        corpus.save_jsonl(output_dir / "mined_dev.jsonl", dev_records)
    if val:
        corpus.save_jsonl(output_dir / "val.jsonl", val)
    chosen = count_categories(passages)
    perturbable = sum(chosen.values())
    stats: dict[str, Any] = {
        "input": str(input_path),
        "passages": len(passages),
        "documents": len({passage["doc_name"] for passage in passages}),
        "perturbable": perturbable,
        "perturbable_share": perturbable / len(passages) if passages else 0.0,
        "admits": admits,
        "chosen": chosen,
        "train_chosen": count_categories(train),
        "seed": seed,
        "categories": list(categories),
        "polarity_scope": rules.polarity_scope,
        "scale_swaps": rules.scales,
        "category_weights": dict(category_weights or {}),
        "include_eval_docs": include_eval_docs,
        "heldout_documents": sorted(heldout),
        "train_passages": min(len(train), max_train_passages or len(train)),
        "val_passages": min(len(val), max_val_passages or len(val)),
    }
    if build_numgap:
        source = heldout_passages or passages
        stats["numgap_source"] = "held-out documents" if heldout_passages else "every passage"
        texts = [passage["text"] for passage in source]
        splits = numgap.build_numgap(
            [{"id": passage["id"], "text": passage["text"]} for passage in source],
            quotas_test=quotas_test,
            quotas_dev=quotas_dev,
            seed=seed,
            bm25_k=bm25_k,
            rules=rules,
        )
        numgap.save_numgap(output_dir, splits)
        stats["numgap_eligible_anchors"] = sum(
            numgap.is_eligible(
                text,
                min_chars=numgap.ANCHOR_MIN_CHARS,
                max_chars=numgap.ANCHOR_MAX_CHARS,
                min_numeric_tokens=numgap.ANCHOR_MIN_NUMERIC_TOKENS,
            )
            for text in texts
        )
        stats["numgap"] = {
            split: {
                category: sum(record["category"] == category for record in records)
                for category in perturb.CATEGORIES
            }
            for split, records in splits.items()
        }
    if numfine_items:
        units = numfine.build_numfine(val or passages, seed=seed, max_items=numfine_items)
        corpus.save_jsonl(output_dir / "numfine_test.jsonl", units)
        stats["numfine_units"] = len(units)
    corpus.save_json(output_dir / "stats.json", stats)
    return stats


def count_categories(passages: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Passages per perturbation category (every category, 0 where none was drawn)."""
    counts = dict.fromkeys(perturb.CATEGORIES, 0)
    for passage in passages:
        if passage["category"] is not None:
            counts[passage["category"]] += 1
    return counts


def mine_neighbours(texts: Sequence[str], *, k: int, max_jaccard: float = 0.5) -> list[int | None]:
    """A topical neighbour per text, picked the way NumGap picks its distractors.

    Among each text's top-`k` BM25 neighbours in `texts` (itself excluded), the one closest in
    length, skipping exact copies and numeric near-duplicates (numeric-token Jaccard above
    `max_jaccard`, `numgap.pick_distractor`): a passage about the same topic with other numbers.
    Only the given (training) texts are searched, so no held-out text leaks into training.

    Returns:
      Per text, the index of its neighbour in `texts`, or None when no candidate qualifies.
    """
    if not texts:
        return []
    index = numgap.Bm25Neighbours(texts)
    found: list[int | None] = []
    for start in range(0, len(texts), 1024):
        rows = range(start, min(start + 1024, len(texts)))
        for row, ranked in zip(rows, index.neighbours(rows, k=k + 1), strict=True):
            candidates = [doc for doc in ranked if doc != row]
            choice = numgap.pick_distractor(
                texts[row], [texts[doc] for doc in candidates], max_jaccard=max_jaccard
            )
            found.append(None if choice is None else candidates[choice])
    return found


def rebalance_rules(
    passages: list[dict[str, Any]],
    *,
    categories: Sequence[str],
    seed: int,
    rules: perturb.Rules = perturb.PAPER_RULES,
    category_weights: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """The passages with their "category" and "perturbed" drawn again by
    `perturb.perturb_balanced` under the rule weights of these passages (`perturb.rule_weights`):
    a rule that few passages admit is picked wherever it can be, a common one less often. The
    category is still drawn uniformly among those that fire (or by `category_weights`), so the
    category mix stays as it was; only the rule mix inside a category changes. Seeded per
    passage id."""
    texts = [p["text"] for p in passages]
    weights = perturb.rule_weights(texts, categories, rules=rules)
    out = []
    for passage in passages:
        chosen = perturb.perturb_balanced(
            passage["text"], perturb.derive_seed(seed, "balanced", passage["id"]), categories,
            weights, rules=rules, category_weights=category_weights,
        )  # fmt: skip
        category, perturbed = chosen if chosen is not None else (None, None)
        out.append({**passage, "category": category, "perturbed": perturbed})
    return out


def make_queries(passages: Sequence[dict[str, Any]], *, style: str) -> list[str | None]:
    """A question per passage from `querygen.OfflineQueryGenerator` in `style` (a line item and
    period it states, not the amount; "filing" also names the filing's company and fiscal
    period), or None when the passage states no numeric fact it can parse."""
    from caliber_jax.mining import querygen

    generated = querygen.OfflineQueryGenerator(style).generate(passages)
    return [query for query, _ in generated]


def mined_dev_records(
    passages: Sequence[dict[str, Any]], *, cap: int, seed: int, style: str
) -> list[dict[str, Any]]:
    """Up to `cap` (question, passage) pairs of `passages` (`make_queries`) as FinanceBench
    records: "financebench_id" "mined:<passage id>", "question", "evidence" [{"evidence_text"}],
    "doc_name". A question generated for more than one passage is left out (it would have several
    right answers and one graded); a seeded sample in corpus order."""
    asked = make_queries(passages, style=style)
    counts = collections.Counter(q for q in asked if q)
    pairs = [
        {"financebench_id": f"mined:{p['id']}", "question": q,
         "evidence": [{"evidence_text": p["text"]}], "doc_name": p["doc_name"]}
        for p, q in zip(passages, asked, strict=True) if q and counts[q] == 1
    ]  # fmt: skip
    return sample(pairs, cap, seed=seed)


def mine_heldout_neighbours(
    train_texts: Sequence[str], texts: Sequence[str], *, k: int, max_jaccard: float = 0.5
) -> list[int | None]:
    """`mine_neighbours` for held-out `texts`: each one's neighbour among `train_texts` only.

    One BM25 index over both lists (the held-out texts must be indexed to be queried), ranked
    over the training rows alone, so a held-out passage never gets another held-out one.

    Returns:
      Per text, the index of its neighbour in `train_texts`, or None.
    """
    if not texts or not train_texts:
        return [None] * len(texts)
    index = numgap.Bm25Neighbours([*train_texts, *texts])
    offset = len(train_texts)
    found: list[int | None] = []
    for start in range(0, len(texts), 1024):
        rows = range(start, min(start + 1024, len(texts)))
        ranked_rows = index.neighbours([offset + row for row in rows], k=k, candidates=offset)
        for row, ranked in zip(rows, ranked_rows, strict=True):
            choice = numgap.pick_distractor(
                texts[row], [train_texts[doc] for doc in ranked], max_jaccard=max_jaccard
            )
            found.append(None if choice is None else ranked[choice])
    return found


def heldout_documents(names: Sequence[str], *, fraction: float, seed: int) -> set[str]:
    """A seeded share of whole documents (by name), independent of their order."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"heldout_fraction={fraction} must be in [0, 1)")
    if fraction == 0.0 or len(names) < 2:
        return set()
    count = max(1, round(fraction * len(names)))
    ranked = sorted(names, key=lambda name: perturb.derive_seed(seed, "heldout", name))
    return set(ranked[:count])


def sample(rows: list[dict[str, Any]], cap: int, *, seed: int) -> list[dict[str, Any]]:
    """At most `cap` rows (0 = all), a seeded choice kept in corpus order."""
    if not cap or len(rows) <= cap:
        return rows
    keep = set(random.Random(seed).sample(range(len(rows)), cap))
    return [row for i, row in enumerate(rows) if i in keep]


def rules_from_config(options) -> perturb.Rules:
    """`perturb.Rules` of `config.prepare`; a bad value is one error naming its field."""
    scope, scales = options.get("polarity_scope", "paper"), options.get("scale_swaps", "paper")
    for field, value, allowed in (("polarity_scope", scope, perturb.POLARITY_SCOPES),
                                  ("scale_swaps", scales, perturb.SCALE_SETS)):  # fmt: skip
        if value not in allowed:
            raise ValueError(f"config.prepare.{field}={value!r}: expected one of {allowed}")
    return perturb.Rules(polarity_scope=scope, scales=scales)


def prepare_from_config(config) -> dict[str, Any]:
    """`prepare` with the fields of `config.prepare`, writing into `config.data.dir`."""
    options = config.prepare
    return prepare(
        options.input,
        config.data.dir,
        text_field=options.text_field,
        min_chars=options.min_chars,
        max_chars=options.max_chars,
        include_eval_docs=options.include_eval_docs,
        seed=config.seed,
        categories=tuple(options.categories),
        build_numgap=options.numgap,
        quotas_test=dict(options.numgap_quotas_test),
        quotas_dev=dict(options.numgap_quotas_dev),
        bm25_k=options.bm25_k,
        heldout_fraction=options.heldout_fraction,
        max_train_passages=options.max_passages,
        max_val_passages=options.max_val_passages,
        numfine_items=options.numfine_items,
        neighbour_k=options.get("neighbour_k", 0),
        queries=options.get("queries", False),
        balance_rules=options.get("balance_rules", False),
        rules=rules_from_config(options),
        category_weights=dict(options.get("category_weights", {})),
        queries_only=options.get("queries_only", False),
        mined_dev=options.get("mined_dev", 0),
        query_style=options.get("query_style", "plain"),
    )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = flags.FLAGS.config
    stats = prepare_from_config(config)
    from caliber_jax import train  # jax and the tokenizer: only now

    # The student's token lengths, which train's first launch would otherwise compute.
    kept = train.keep_token_lengths(config)
    where = paths.as_path(config.data.dir) / "token_lengths"
    if kept:
        line = f"token lengths of {', '.join(kept)} kept in {where}"
    elif kept is None:
        line = ("token lengths not kept: no student tokenizer at model.tokenizer_dir / "
                "model.init_dir yet (train computes them at its first launch)")  # fmt: skip
    else:
        line = (f"token lengths not kept: {where} could not be written (train computes them "
                "at its first launch)")  # fmt: skip
    print(f"[caliber_jax] {line}", file=sys.stderr)
    if stats.get("numgap_source") == "every passage":
        print("[caliber_jax] NumGap drawn from every passage, training ones included: no "
              "document is held out (prepare.heldout_fraction 0)", file=sys.stderr)  # fmt: skip
    # One summary line; everything else is in stats.json.
    print(
        f"prepare: {stats['documents']} documents -> {stats['passages']} passages "
        f"({stats['perturbable_share']:.1%} perturbable); train {stats['train_passages']}, "
        f"val {stats['val_passages']}; wrote {paths.as_path(config.data.dir) / 'stats.json'}"
    )


if __name__ == "__main__":
    # Defined only when run as a script, so that tests can import `prepare` freely.
    config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
    flags.mark_flag_as_required("config")
    cli.run(main)
