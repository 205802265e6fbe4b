"""Tests for caliber_jax.prepare: outputs, eval-doc exclusion, per-passage determinism, the CLI."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_jax import prepare as prepare_lib
from caliber_jax import train as train_lib
from caliber_jax.data import corpus, length_cache, numgap, perturb, pipeline
from configs import demo

TOPIC_TEXT = {
    "alpha": "Revenue increased {n}2.4% to ${n},400 million in fiscal 201{n}, driven by pricing.",
    "beta": "Pension deficit narrowed to EUR {n}.2 billion in Q3 201{n} as rates rose {n}5 bps.",
    "gamma": "Lease costs were flat, and the company added new office space in {n} cities.",
    "delta": "Tax expense fell to ${n}15 million in 201{n}, compared with ${n},020 million before.",
}


def write_corpus(path, names):
    rows = []
    for number, name in enumerate(names):
        paragraphs = [
            f"Section {index} of {name}. " + TOPIC_TEXT[name].format(n=index + 1) * 3
            for index in range(6)
        ]
        rows.append(
            {
                "doc_name": name,
                "company": name.upper(),
                "financebench_eval_doc": name == "gamma",
                "text": "\n\n".join(paragraphs) + f"\f{number + 1}\n",
            }
        )
    corpus.save_jsonl(path, rows)
    return path


def test_prepare_writes_passages_numgap_and_stats(tmp_path):
    source = write_corpus(tmp_path / "c.jsonl", ["alpha", "beta", "gamma", "delta"])
    stats = prepare_lib.prepare(
        source,
        tmp_path / "out",
        seed=0,
        build_numgap=True,
        quotas_test={"magnitude": 4, "unit": 2},
        quotas_dev={"polarity": 2},
        bm25_k=5,
    )
    passages = corpus.load_jsonl(tmp_path / "out" / "passages.jsonl")
    assert {passage["doc_name"] for passage in passages} == {"alpha", "beta", "delta"}
    assert len(passages) == stats["passages"] == 18
    for passage in passages:
        assert set(passage) >= {"id", "text", "doc_name", "company", "category", "perturbed"}
        if passage["category"] is None:
            assert passage["perturbed"] is None
        else:
            assert 1 <= perturb.edit_distance(passage["text"], passage["perturbed"]) <= 30
    chosen = [passage["category"] for passage in passages if passage["category"]]
    assert stats["perturbable"] == len(chosen) == 18
    assert stats["chosen"] == {c: chosen.count(c) for c in perturb.CATEGORIES}
    assert all(stats["admits"][c] >= stats["chosen"][c] for c in perturb.CATEGORIES)
    assert stats["numgap"] == {
        "test": {"magnitude": 4, "polarity": 0, "period": 0, "unit": 2, "currency": 0},
        "dev": {"magnitude": 0, "polarity": 2, "period": 0, "unit": 0, "currency": 0},
    }
    assert len(numgap.load_numgap(tmp_path / "out" / "numgap_test.jsonl")) == 6
    assert stats["numgap_source"] == "every passage"  # nothing held out: training ones included
    assert json.loads((tmp_path / "out" / "stats.json").read_text()) == stats


def test_perturbation_depends_only_on_seed_and_passage_id(tmp_path):
    small = prepare_lib.prepare(write_corpus(tmp_path / "a.jsonl", ["alpha"]), tmp_path / "a")
    large = prepare_lib.prepare(
        write_corpus(tmp_path / "b.jsonl", ["delta", "alpha", "beta"]), tmp_path / "b"
    )
    assert small["passages"] < large["passages"]
    by_id = {row["id"]: row for row in corpus.load_jsonl(tmp_path / "b" / "passages.jsonl")}
    for row in corpus.load_jsonl(tmp_path / "a" / "passages.jsonl"):
        assert by_id[row["id"]] == row
    reseeded = prepare_lib.prepare(
        write_corpus(tmp_path / "c.jsonl", ["alpha"]), tmp_path / "c", seed=1
    )
    assert reseeded["passages"] == small["passages"]
    rows_a = corpus.load_jsonl(tmp_path / "a" / "passages.jsonl")
    rows_c = corpus.load_jsonl(tmp_path / "c" / "passages.jsonl")
    assert [row["perturbed"] for row in rows_a] != [row["perturbed"] for row in rows_c]


def test_categories_restrict_the_passage_perturbations(tmp_path):
    source = write_corpus(tmp_path / "c.jsonl", ["alpha", "beta"])
    stats = prepare_lib.prepare(source, tmp_path / "out", categories=["unit"])
    rows = corpus.load_jsonl(tmp_path / "out" / "passages.jsonl")
    assert {row["category"] for row in rows} == {"unit"}
    assert stats["chosen"]["unit"] == stats["admits"]["unit"] == len(rows) == 12
    assert sum(stats["admits"].values()) == 12


def test_include_eval_docs(tmp_path):
    source = write_corpus(tmp_path / "c.jsonl", ["gamma"])
    # Only evaluation filings: nothing usable unless they are let in (one clear error).
    with pytest.raises(ValueError, match="no usable documents .* outside the evaluation filings"):
        prepare_lib.prepare(source, tmp_path / "x")
    assert prepare_lib.prepare(source, tmp_path / "y", include_eval_docs=True)["passages"] == 6


def test_cli_reads_the_config_and_holds_out_whole_documents(tmp_path):
    source = write_corpus(tmp_path / "c.jsonl.gz", ["alpha", "beta", "delta"])
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "caliber_jax.prepare",
            f"--config={repo / 'configs' / 'demo.py'}",
            f"--config.prepare.input={source}",
            f"--config.data.dir={tmp_path / 'out'}",
            "--config.prepare.heldout_fraction=0.34",
            "--config.prepare.max_passages=0",
            "--config.prepare.max_val_passages=0",
            "--config.prepare.numgap_quotas_test={'magnitude': 2}",
            "--config.prepare.numgap_quotas_dev={'polarity': 1}",
            "--config.prepare.bm25_k=3",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=repo,
    )
    assert result.returncode == 0, result.stderr
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert result.stdout.strip().splitlines() == [
        f"prepare: {stats['documents']} documents -> {stats['passages']} passages "
        f"({stats['perturbable_share']:.1%} perturbable); train {stats['train_passages']}, "
        f"val {stats['val_passages']}; wrote {tmp_path / 'out' / 'stats.json'}"
    ]
    assert stats["passages"] == 18 and len(stats["heldout_documents"]) == 1
    train = corpus.load_jsonl(tmp_path / "out" / "train.jsonl")
    val = corpus.load_jsonl(tmp_path / "out" / "val.jsonl")
    heldout = set(stats["heldout_documents"])
    assert {row["doc_name"] for row in val} == heldout
    assert not heldout & {row["doc_name"] for row in train}
    assert len(train) + len(val) == 18
    # NumGap anchors and distractors come only from held-out documents.
    val_texts = {row["text"] for row in val}
    for name in ("numgap_dev.jsonl", "numgap_test.jsonl"):
        for record in corpus.load_jsonl(tmp_path / "out" / name):
            assert record["anchor"] in val_texts and record["distractor"] in val_texts
    # The student's token lengths are kept where train reads them, equal to tokenizing now.
    assert "token lengths of train, val kept" in result.stderr
    config = demo.get_config()
    config.data.dir = str(tmp_path / "out")
    tokenizer_dir = train_lib.student_tokenizer_dir(config)
    tokenize_fn = train_lib.TokenizeFn(tokenizer_dir)
    for split in ("train", "val"):
        cache = train_lib.lengths_cache(config, split, tokenizer_dir)
        texts, perturbed = pipeline.load_passages(tmp_path / "out" / f"{split}.jsonl")
        kept = length_cache.load(cache, len(texts))
        assert kept is not None, split
        for got, rows in zip(kept, (texts, perturbed), strict=True):
            want = pipeline.token_lengths(tokenize_fn, rows, config.data.max_length)
            np.testing.assert_array_equal(got, want)


def test_keep_token_lengths_lists_only_the_splits_it_could_write(tmp_path, caplog):
    """A data dir where the lengths' folder cannot be made (a file holds its name): nothing is
    listed as kept, a warning names the path, and the lengths are still the tokenizer's."""
    source = write_corpus(tmp_path / "c.jsonl", ["alpha", "beta", "delta"])
    config = demo.get_config()
    config.data.dir = str(tmp_path / "out")
    config.prepare.input = str(source)
    config.prepare.heldout_fraction = 0.34
    config.prepare.numgap = False
    config.prepare.numfine_items = 0
    prepare_lib.prepare_from_config(config)
    (tmp_path / "out" / "token_lengths").write_text("not a folder")
    with caplog.at_level("WARNING"):
        assert train_lib.keep_token_lengths(config) == []
    assert "token lengths not kept at" in caplog.text and "token_lengths" in caplog.text
    (tmp_path / "out" / "token_lengths").unlink()
    assert train_lib.keep_token_lengths(config) == ["train", "val"]
    # No student tokenizer yet: nothing tokenized, and it says so (None, not an empty list).
    config.model.tokenizer_dir, config.model.init_dir = "", str(tmp_path / "not_yet")
    assert train_lib.keep_token_lengths(config) is None


def test_heldout_documents_is_seeded_and_order_free():
    names = [f"doc{i}" for i in range(20)]
    chosen = prepare_lib.heldout_documents(names, fraction=0.2, seed=3)
    assert len(chosen) == 4
    assert chosen == prepare_lib.heldout_documents(names[::-1], fraction=0.2, seed=3)
    assert chosen != prepare_lib.heldout_documents(names, fraction=0.2, seed=4)
    assert prepare_lib.heldout_documents(names[:1], fraction=0.5, seed=0) == set()


def test_mine_neighbours_skips_copies_numeric_duplicates_and_strangers():
    texts = [
        "Revenue grew 5% to $100 million in 2019 on higher pricing across segments.",
        "Revenue grew 5% to $100 million in 2019 on higher pricing across segments.",
        "Revenue fell 3% to $80 million in 2020 on lower pricing across segments and regions.",
        "Revenue grew 5% to $100 million in 2019 on pricing across segments.",
        "The weather in Paris was sunny all week.",
    ]
    found = prepare_lib.mine_neighbours(texts, k=5)
    # 0 and 3: the copy (1) and the same-numbers rewrite (Jaccard 1) are skipped -> 2, the
    # passage on the same topic with other numbers. 4 shares no term with anything -> None.
    assert found[0] == found[1] == found[3] == 2
    assert found[2] in (0, 1)
    assert found[4] is None
    assert prepare_lib.mine_neighbours([], k=5) == []


def test_mine_heldout_neighbours_only_among_training_texts():
    train = [
        "Revenue grew 5% to $100 million in 2019 on higher pricing across segments.",
        "Operating costs rose 2% to $40 million in 2019 on wages across segments.",
        "The weather in Paris was sunny all week.",
    ]
    held_out = [
        "Revenue grew 7% to $120 million in 2020 on higher pricing across segments.",
        # Its copy in the held-out list ranks first in the shared index; it must not be picked.
        "Revenue grew 7% to $120 million in 2020 on higher pricing across segments.",
        "Revenue grew 5% to $100 million in 2019 on higher pricing across segments.",
        "Zebras graze quietly.",
    ]
    found = prepare_lib.mine_heldout_neighbours(train, held_out, k=5)
    # 0, 1: the training passage on the same topic with other numbers (row 0), never each other.
    # 2: its verbatim training copy is skipped -> the next topical one (row 1). 3: no shared term.
    assert found == [0, 0, 1, None]
    assert prepare_lib.mine_heldout_neighbours(train, [], k=5) == []
    assert prepare_lib.mine_heldout_neighbours([], held_out[:2], k=5) == [None, None]


def test_prepare_writes_training_queries(tmp_path):
    """`queries`: every passage of both splits gets the offline generator's question or null."""
    source = write_corpus(tmp_path / "c.jsonl", ["alpha", "beta", "gamma", "delta"])
    prepare_lib.prepare(source, tmp_path / "out", seed=0, heldout_fraction=0.34, queries=True)
    rows = [*corpus.load_jsonl(tmp_path / "out" / "train.jsonl"),
            *corpus.load_jsonl(tmp_path / "out" / "val.jsonl")]  # fmt: skip
    assert rows and all("query" in row for row in rows)
    assert [row["query"] for row in rows] == prepare_lib.make_queries(rows, style="plain")
    assert any(row["query"] for row in rows) and any(row["query"] is None for row in rows)


def test_prepare_balance_rules_redraws_training_perturbations_only(tmp_path):
    source = write_corpus(tmp_path / "c.jsonl", ["alpha", "beta", "gamma", "delta"])
    options = dict(seed=0, heldout_fraction=0.34, build_numgap=False)
    prepare_lib.prepare(source, tmp_path / "plain", **options)
    prepare_lib.prepare(source, tmp_path / "balanced", balance_rules=True, **options)
    plain, balanced = (
        corpus.load_jsonl(tmp_path / d / "train.jsonl") for d in ("plain", "balanced")
    )
    assert [p["text"] for p in plain] == [p["text"] for p in balanced]
    assert balanced == prepare_lib.rebalance_rules(plain, categories=perturb.CATEGORIES, seed=0)
    for passage in balanced:
        if passage["perturbed"] is not None:
            options_here = perturb.candidate_edits(passage["text"], passage["category"])
            assert passage["perturbed"] in [p for _, p in options_here]
    assert any(a["perturbed"] != b["perturbed"] for a, b in zip(plain, balanced, strict=True))
    val = [corpus.load_jsonl(tmp_path / d / "val.jsonl") for d in ("plain", "balanced")]
    assert val[0] == val[1]


def test_prepare_balance_rules_records_what_train_jsonl_holds(tmp_path):
    """With `balance_rules`, passages.jsonl and stats.json's counts describe the redrawn training
    perturbations that train.jsonl holds, not the draws made before rebalancing."""
    source = write_corpus(tmp_path / "c.jsonl", ["alpha", "beta", "gamma", "delta"])
    stats = prepare_lib.prepare(
        source, tmp_path / "out", seed=0, heldout_fraction=0.34, balance_rules=True
    )
    passages = {p["id"]: p for p in corpus.load_jsonl(tmp_path / "out" / "passages.jsonl")}
    train = corpus.load_jsonl(tmp_path / "out" / "train.jsonl")
    val = corpus.load_jsonl(tmp_path / "out" / "val.jsonl")
    assert train and val
    for row in [*train, *val]:
        kept = passages[row["id"]]
        assert (kept["category"], kept["perturbed"]) == (row["category"], row["perturbed"])
    assert json.loads((tmp_path / "out" / "stats.json").read_text()) == stats

    def counts(rows):
        return {c: sum(row["category"] == c for row in rows) for c in perturb.CATEGORIES}

    assert stats["chosen"] == counts(passages.values())
    assert stats["train_chosen"] == counts(train) and sum(stats["train_chosen"].values()) > 0
    assert stats["perturbable"] == sum(p["category"] is not None for p in passages.values())


def test_prepare_polarity_scope_reaches_every_split_and_numgap(tmp_path):
    """With the "quantity" scope no passage, validation row or NumGap record swaps a
    cross-reference word ("discussed above"), which the paper's rule does swap."""
    reference = "As discussed above, the plan was adopted in 201{n}."
    rows = [
        {
            "doc_name": name,
            "text": "\n\n".join(
                f"Part {i} of {name}. " + (reference + " " + TOPIC_TEXT[name]).format(n=i + 1) * 3
                for i in range(6)
            ),
        }
        for name in ("alpha", "beta", "delta")
    ]
    source = tmp_path / "c.jsonl"
    corpus.save_jsonl(source, rows)
    quotas = {"polarity": 6}
    options = dict(
        seed=0, heldout_fraction=0.34, build_numgap=True, quotas_test=quotas, quotas_dev=quotas,
        categories=("polarity",), balance_rules=True,
    )  # fmt: skip
    stats = prepare_lib.prepare(
        source, tmp_path / "q", rules=perturb.Rules(polarity_scope="quantity"), **options
    )
    assert stats["polarity_scope"] == "quantity"
    written = [
        *corpus.load_jsonl(tmp_path / "q" / "passages.jsonl"),
        *corpus.load_jsonl(tmp_path / "q" / "train.jsonl"),
        *corpus.load_jsonl(tmp_path / "q" / "val.jsonl"),
        *numgap.load_numgap(tmp_path / "q" / "numgap_dev.jsonl"),
        *numgap.load_numgap(tmp_path / "q" / "numgap_test.jsonl"),
    ]
    perturbed = [row for row in written if row.get("perturbed")]
    assert len(perturbed) > 10
    assert not any("discussed below" in row["perturbed"] for row in perturbed)
    for row in perturbed:
        text = row.get("text", row.get("anchor"))
        edits = perturb.candidate_edits(
            text, "polarity", rules=perturb.Rules(polarity_scope="quantity")
        )
        assert row["perturbed"] in [p for _, p in edits]
    # The paper's rule offers the cross-reference swap on these very passages.
    assert any(
        "discussed below" in p for row in perturbed for _, p in perturb.candidate_edits(
            row.get("text", row.get("anchor")), "polarity")
    )  # fmt: skip


def test_prepare_scale_swaps_from_the_config_reach_training_and_numgap(tmp_path):
    """`prepare.scale_swaps = "all"` draws the reverse scale swaps (billion -> thousand,
    thousand -> billion) in training and NumGap; the paper's set never does."""
    rows = [
        {
            "doc_name": name,
            "text": "\n\n".join(
                f"Part {i} of {name}. Revenue was $1.{i} billion and fees were ${i + 2} thousand "
                f"in 201{i}. " + TOPIC_TEXT[name] * 2
                for i in range(6)
            ),
        }
        for name in ("alpha", "beta", "delta")
    ]
    source = tmp_path / "c.jsonl"
    corpus.save_jsonl(source, rows)
    seen = {}
    for scales in ("paper", "all"):
        config = demo.get_config()
        config.data.dir = str(tmp_path / scales)
        config.prepare.input = str(source)
        config.prepare.scale_swaps = scales
        config.prepare.categories = ("unit",)
        config.prepare.balance_rules = True
        config.prepare.heldout_fraction = 0.34
        config.prepare.numgap = True
        config.prepare.numgap_quotas_test = {"unit": 6}
        config.prepare.numgap_quotas_dev = {"unit": 6}
        config.prepare.max_passages = 0
        config.prepare.max_val_passages = 0
        config.prepare.numfine_items = 0
        stats = prepare_lib.prepare_from_config(config)
        assert stats["scale_swaps"] == scales
        out = tmp_path / scales
        train = [(r["text"], r["perturbed"]) for r in corpus.load_jsonl(out / "train.jsonl")]
        records = numgap.load_numgap(out / "numgap_test.jsonl") + numgap.load_numgap(
            out / "numgap_dev.jsonl"
        )
        pairs = train + [(r["anchor"], r["perturbed"]) for r in records]
        seen[scales] = {perturb.edit_rule(a, b, "unit") for a, b in pairs if b}
    config.prepare.scale_swaps = "every"
    with pytest.raises(ValueError, match=r"config.prepare.scale_swaps='every': expected one of"):
        prepare_lib.prepare_from_config(config)
    reverse = {"billion->thousand", "thousand->billion"}
    assert not seen["paper"] & reverse
    assert seen["all"] >= reverse | {"billion->million", "thousand->million"}


def test_prepare_category_weights_tilt_training_categories_only(tmp_path):
    source = write_corpus(tmp_path / "c.jsonl", ["alpha", "beta", "gamma", "delta"])
    options = dict(seed=0, heldout_fraction=0.34, build_numgap=False, balance_rules=True)
    prepare_lib.prepare(source, tmp_path / "even", **options)
    prepare_lib.prepare(source, tmp_path / "tilted", category_weights={"polarity": 20.0},
                        **options)  # fmt: skip
    counts = {}
    for name in ("even", "tilted"):
        train = corpus.load_jsonl(tmp_path / name / "train.jsonl")
        counts[name] = sum(p["category"] == "polarity" for p in train)
        admits = [p for p in train if perturb.candidate_edits(p["text"], "polarity")]
    assert counts["even"] < counts["tilted"] and counts["tilted"] >= 0.6 * len(admits)
    val = [corpus.load_jsonl(tmp_path / d / "val.jsonl") for d in ("even", "tilted")]
    assert val[0] == val[1]
    with pytest.raises(ValueError, match="balance_rules"):
        prepare_lib.prepare(source, tmp_path / "x", seed=0, category_weights={"polarity": 2.0})
    with pytest.raises(ValueError, match="category_weights"):
        prepare_lib.prepare(source, tmp_path / "x", category_weights={"polarty": 2.0}, **options)


def test_prepare_stores_training_neighbours(tmp_path):
    source = write_corpus(tmp_path / "c.jsonl", ["alpha", "beta", "gamma", "delta"])
    prepare_lib.prepare(source, tmp_path / "out", seed=0, heldout_fraction=0.34, neighbour_k=5)
    train = corpus.load_jsonl(tmp_path / "out" / "train.jsonl")
    val = corpus.load_jsonl(tmp_path / "out" / "val.jsonl")
    assert all("neighbour" not in passage for passage in val)
    # Validation passages name theirs among the training rows (validation scores the trained
    # objective), as the mining function finds them.
    want = prepare_lib.mine_heldout_neighbours(
        [p["text"] for p in train], [p["text"] for p in val], k=5
    )
    assert [p["train_neighbour"] for p in val] == want
    assert any(row is not None for row in want)
    rows = [passage["neighbour"] for passage in train]
    assert any(row is not None for row in rows)
    for index, row in enumerate(rows):
        if row is not None:
            assert 0 <= row < len(train) and row != index
            assert train[row]["text"] != train[index]["text"]
            assert numgap.numeric_jaccard(train[row]["text"], train[index]["text"]) <= 0.5
    # Without neighbour_k the training file has no such field (eq. 4 runs are unchanged).
    prepare_lib.prepare(source, tmp_path / "plain", seed=0, heldout_fraction=0.34)
    assert all("neighbour" not in p for p in corpus.load_jsonl(tmp_path / "plain" / "train.jsonl"))
    assert all(
        "train_neighbour" not in p for p in corpus.load_jsonl(tmp_path / "plain" / "val.jsonl")
    )


def test_prepare_reads_and_writes_file_urls_and_remote_paths(tmp_path, monkeypatch):
    """Input and output dir as file:// URLs, and as gs:// paths (etils' mock backend keeps
    them under the working directory): the same files, each written whole."""
    from etils.epath import testing as epath_testing

    source = write_corpus(tmp_path / "c.jsonl", ["alpha", "beta", "gamma", "delta"])
    options = dict(seed=0, build_numgap=True, quotas_test={"magnitude": 4}, quotas_dev={})
    local = prepare_lib.prepare(source, tmp_path / "local", **options)
    url = prepare_lib.prepare(f"file://{source}", f"file://{tmp_path / 'url'}", **options)
    assert {**url, "input": ""} == {**local, "input": ""}
    monkeypatch.chdir(tmp_path)
    with epath_testing.mock_epath():
        remote_source = "gs://bucket/c.jsonl"
        corpus.save_jsonl(remote_source, corpus.load_jsonl(source))
        remote = prepare_lib.prepare(remote_source, "gs://bucket/prep", **options)
        assert len(corpus.load_jsonl("gs://bucket/prep/passages.jsonl")) == local["passages"]
    assert {**remote, "input": ""} == {**local, "input": ""}
    written = tmp_path / "gs:" / "bucket" / "prep"
    names = sorted(path.name for path in written.iterdir())
    assert names == sorted(path.name for path in (tmp_path / "local").iterdir())
    for name in names:  # no temporary files left behind, and the same bytes as the local run
        assert (written / name).read_bytes() == (tmp_path / "local" / name).read_bytes() or (
            name == "stats.json"
        )


def _prepare_cli(tmp_path, *overrides):
    repo = Path(__file__).resolve().parents[1]
    return subprocess.run(
        [sys.executable, "-m", "caliber_jax.prepare", f"--config={repo / 'configs' / 'demo.py'}",
         f"--config.data.dir={tmp_path / 'out'}", *overrides],
        capture_output=True, text=True, check=False, cwd=repo, timeout=120,
    )  # fmt: skip


def test_cli_input_without_usable_documents_is_one_error_line(tmp_path):
    """A corpus whose records are all too short (or an empty file) is a user error: one line
    naming the file, exit 2, nothing written."""
    source = tmp_path / "short.jsonl"
    source.write_text(json.dumps({"doc_name": "x", "text": "Revenue was $5 million."}) + "\n")
    result = _prepare_cli(tmp_path, f"--config.prepare.input={source}")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: {source}: no usable documents (no record has a 'text' text that makes a passage "
        "of at least 200 characters outside the evaluation filings)"
    ]
    assert result.stdout == "" and not (tmp_path / "out" / "stats.json").exists()


def test_cli_config_typo_is_one_readable_line(tmp_path):
    """A mistyped override prints ml_collections' suggestion as plain text on one line (not the
    repr of a wrapped KeyError with its quotes and \\n escaped)."""
    result = _prepare_cli(tmp_path, "--config.optim.lrr=1e-4")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: command line: invalid config override or flag value: 'lrr' "
        'Did you mean "lr" instead of "lrr"?'
    ]


def test_cli_config_file_errors_are_one_line(tmp_path):
    """A config file's own error (an unknown variant) was printed with its Python traceback
    inside the flag error; a missing config file with an override after it was a traceback
    (OSError). One line each, exit 2."""
    repo = Path(__file__).resolve().parents[1]

    def run(*args):
        return subprocess.run([sys.executable, "-m", "caliber_jax.prepare", *args],
                              capture_output=True, text=True, check=False, cwd=repo,
                              timeout=120)  # fmt: skip

    variant = run(f"--config={repo / 'configs' / 'demo.py'}:numerc")
    assert variant.returncode == 2
    assert variant.stderr.strip().splitlines() == [
        f"error: flag --config={repo / 'configs' / 'demo.py'}:numerc: Error whilst parsing "
        "config file: ValueError: configs/demo.py: unknown variant 'numerc' (known: leaf, numeric)"
    ]
    missing = run(f"--config={tmp_path / 'dem.py'}", "--config.optim.lr=1e-4")
    assert missing.returncode == 2
    (line,) = missing.stderr.strip().splitlines()
    assert line.startswith("error: command line: invalid config override or flag value: ")
    assert f"No such file or directory: '{tmp_path / 'dem.py'}'" in line


def test_validation_cap_does_not_shrink_numgap(tmp_path):
    """NumGap draws from every held-out passage; `max_val_passages` caps validation alone."""
    source = write_corpus(tmp_path / "c.jsonl", ["alpha", "beta", "delta"])
    options = dict(seed=0, heldout_fraction=0.34, build_numgap=True, bm25_k=5,
                   quotas_test={"magnitude": 3}, quotas_dev={})  # fmt: skip
    uncapped = prepare_lib.prepare(source, tmp_path / "all", **options)
    capped = prepare_lib.prepare(source, tmp_path / "one", max_val_passages=1, **options)
    assert capped["val_passages"] == 1 < uncapped["val_passages"]
    assert capped["numgap"] == uncapped["numgap"]
    assert capped["numgap"]["test"]["magnitude"] == 3
    records = [(tmp_path / name / "numgap_test.jsonl").read_text() for name in ("all", "one")]
    assert records[0] == records[1]


def test_prepare_queries_only_and_mined_dev_set(tmp_path):
    """`queries_only` keeps the training passages that get a question (the mined phase's data);
    `mined_dev` writes held-out (question, passage) pairs in FinanceBench's format, each question
    asked of one passage; the evaluation filing (gamma) reaches neither."""
    from caliber_jax.eval import retrieval

    items = ["Operating income", "Research expenses"]
    rows = []
    for number, name in enumerate(["alpha", "beta", "gamma", "delta", "epsilon"]):
        paragraphs = [  # two paragraphs of six state a fact the offline generator asks about
            f"Section {i} of {name}. "
            + (f"{items[i]} of {name} increased {i + 2}.{number}% to ${i + 3}.{number} billion "
               f"in fiscal {2000 + 2 * number + i}, driven by pricing. " if i < 2 else
               f"The board of {name} met {i} times and reviewed its risk policies at length. ") * 3
            for i in range(6)
        ]  # fmt: skip
        rows.append({"doc_name": name, "company": name.upper(), "text": "\n\n".join(paragraphs),
                     "financebench_eval_doc": name == "gamma"})  # fmt: skip
    source = tmp_path / "c.jsonl"
    corpus.save_jsonl(source, rows)
    out = tmp_path / "out"
    everything = prepare_lib.prepare(source, tmp_path / "all", seed=0, heldout_fraction=0.5,
                                     queries=True)  # fmt: skip
    prepare_lib.prepare(source, out, seed=0, heldout_fraction=0.5, queries=True,
                        queries_only=True, mined_dev=50)  # fmt: skip
    all_train = corpus.load_jsonl(tmp_path / "all" / "train.jsonl")
    train = corpus.load_jsonl(out / "train.jsonl")
    assert train and all(row["query"] for row in train)
    assert [row["id"] for row in train] == [row["id"] for row in all_train if row["query"]]
    assert len(train) < len(all_train)  # some passages had no question and were left out
    heldout = set(everything["heldout_documents"])
    dev = corpus.load_jsonl(out / "mined_dev.jsonl")
    assert dev and {row["doc_name"] for row in dev} <= heldout
    assert all("gamma" not in row["doc_name"] for row in [*train, *dev])
    questions = [row["question"] for row in dev]
    assert len(set(questions)) == len(questions)
    queries, docs, qrels = retrieval.load_financebench(out / "mined_dev.jsonl")
    assert len(queries) == len(dev) and all(len(rel) == 1 for rel in qrels.values())
    with pytest.raises(ValueError, match="need prepare.queries=True"):
        prepare_lib.prepare(source, tmp_path / "bad", queries_only=True)


def test_preparing_again_replaces_the_dataset(tmp_path, monkeypatch):
    """A folder prepared again holds one dataset: the earlier run's validation split and NumGap
    files, which this run does not write, are gone (train would validate on passages it now
    trains on), and an interrupted prepare leaves no stats.json, the mark of a finished one."""
    source = write_corpus(tmp_path / "c.jsonl", ["alpha", "beta", "gamma", "delta"])
    out = tmp_path / "out"
    prepare_lib.prepare(source, out, seed=0, heldout_fraction=0.34, build_numgap=True,
                        quotas_test={"magnitude": 2}, quotas_dev={"magnitude": 1},
                        numfine_items=2, bm25_k=5)  # fmt: skip
    held = {row["doc_name"] for row in corpus.load_jsonl(out / "val.jsonl")}
    assert held and (out / "numgap_test.jsonl").is_file()
    stats = prepare_lib.prepare(source, out, seed=0, heldout_fraction=0.0)
    names = {path.name for path in out.iterdir()}
    assert names == {"passages.jsonl", "train.jsonl", "stats.json"}
    assert held <= {row["doc_name"] for row in corpus.load_jsonl(out / "train.jsonl")}
    assert json.loads((out / "stats.json").read_text()) == stats

    def fail_on_train(path, rows):
        if Path(path).name == "train.jsonl":
            raise OSError("disk full")
        return saved(path, rows)

    saved = corpus.save_jsonl
    monkeypatch.setattr(corpus, "save_jsonl", fail_on_train)
    with pytest.raises(OSError, match="disk full"):
        prepare_lib.prepare(source, out, seed=1)
    assert not (out / "stats.json").exists()


def test_records_fields_named_like_prepares_outputs_are_dropped(tmp_path, capsys):
    """A record's own "query" or "neighbour" was read as prepare's: questions trained (and
    embedded) with queries off, every neighbour row 0. They are dropped with one line."""
    plain = corpus.load_jsonl(write_corpus(tmp_path / "c.jsonl", ["alpha", "beta"]))
    rows = [{**row, "query": "the user's own note", "neighbour": 0, "train_neighbour": 1}
            for row in plain]  # fmt: skip
    source = tmp_path / "own_fields.jsonl"
    corpus.save_jsonl(source, rows)
    out = tmp_path / "out"
    prepare_lib.prepare(source, out, seed=0, heldout_fraction=0.5)
    assert "'neighbour', 'query', 'train_neighbour' name what prepare writes" in (
        capsys.readouterr().err
    )
    for name in ("passages.jsonl", "train.jsonl", "val.jsonl"):
        for row in corpus.load_jsonl(out / name):
            assert not {"query", "neighbour", "train_neighbour"} & set(row), name
            assert row["company"] in ("ALPHA", "BETA")  # other fields stay
    assert pipeline.load_queries(out / "train.jsonl") is None
    assert pipeline.load_neighbours(out / "train.jsonl") is None


def test_a_bad_numgap_quota_is_refused_before_any_write(tmp_path):
    source = write_corpus(tmp_path / "c.jsonl", ["alpha", "beta", "delta"])
    out = tmp_path / "out"
    prepare_lib.prepare(source, out, seed=0)
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    with pytest.raises(ValueError, match=r"prepare.numgap_quotas_test: bad quota 'magnitude': -1"):
        prepare_lib.prepare(source, out, seed=1, build_numgap=True,
                            quotas_test={"magnitude": -1}, heldout_fraction=0.34)  # fmt: skip
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
