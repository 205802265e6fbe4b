"""Rebuilds the bundled demo sample in data/sample/ from the shared FinanceBench data.

    python scripts/make_sample.py /path/to/shared/data/financebench data/sample

Three non-evaluation 10-K filings (public SEC records) and the 150 FinanceBench questions
(CC BY-NC 4.0, Patronus AI), gzipped.
"""

import gzip
import json
import shutil
import sys
from pathlib import Path

FILINGS = ("3M_2019_10K", "ACTIVISIONBLIZZARD_2017_10K", "AMCOR_2021_10K")


def main(source: Path, output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    kept = []
    with gzip.open(source / "filings.jsonl.gz", "rt", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            if record["doc_name"] in FILINGS:
                assert not record["financebench_eval_doc"], record["doc_name"]
                kept.append(line)
    missing = set(FILINGS) - {json.loads(line)["doc_name"] for line in kept}
    if missing:
        raise SystemExit(f"filings not found: {sorted(missing)}")
    with gzip.open(output / "filings.jsonl.gz", "wt", encoding="utf-8", compresslevel=9) as out:
        out.writelines(kept)
    with open(source / "financebench_open_source.jsonl", "rb") as src:
        with gzip.open(output / "financebench_open_source.jsonl.gz", "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
