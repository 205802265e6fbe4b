"""Builds filings.jsonl.gz (the FinanceBench filings as text) from the public FinanceBench release.

    git clone https://github.com/patronus-ai/financebench
    pip install pypdfium2      # or: pip install -e ".[filings]"
    python scripts/build_filings.py --release financebench --output filings.jsonl.gz \\
        [--skip_missing] [--skip_unreadable] [--workers 2]

Reads `<release>/pdfs/<doc_name>.pdf`, `<release>/data/financebench_document_information.jsonl`
and `<release>/data/financebench_open_source.jsonl` (each can be given on its own instead); the
record schema is in `caliber_jax/data/filings.py`. The output is written whole or not at all.
Two of the release's 360 listed PDFs are cut short (INTEL_2023_8K_dated-2023-02-10 and -08-16):
`--skip_unreadable` leaves them out. 336 filings took 9 minutes on one busy core.
"""

import argparse
import sys
from pathlib import Path

from caliber_jax import cli
from caliber_jax.data import filings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", type=Path, help="The FinanceBench release folder (a clone).")
    parser.add_argument("--pdfs", type=Path, help="PDF folder (default: <release>/pdfs).")
    parser.add_argument(
        "--document_information",
        type=Path,
        help="default: <release>/data/financebench_document_information.jsonl",
    )
    parser.add_argument(
        "--questions", type=Path, help="default: <release>/data/financebench_open_source.jsonl"
    )
    parser.add_argument("--output", type=Path, required=True, help="filings.jsonl.gz to write.")
    parser.add_argument(
        "--skip_missing", action="store_true", help="Leave out filings whose PDF is absent."
    )
    parser.add_argument(
        "--skip_unreadable",
        action="store_true",
        help="Leave out (with a note) filings whose PDF cannot be read.",
    )
    parser.add_argument("--workers", type=int, default=1, help="Processes extracting text.")
    parser.add_argument("--traceback", action="store_true", help="Show tracebacks of errors.")
    args = parser.parse_args()
    defaults = {
        "pdfs": "pdfs",
        "document_information": "data/financebench_document_information.jsonl",
        "questions": "data/financebench_open_source.jsonl",
    }
    for name, relative in defaults.items():
        if getattr(args, name) is None:
            if args.release is None:
                parser.error(f"--{name} or --release is needed")
            setattr(args, name, args.release / relative)
    summary = filings.build_filings(
        args.pdfs,
        args.document_information,
        args.questions,
        args.output,
        skip_missing=args.skip_missing,
        skip_unreadable=args.skip_unreadable,
        workers=args.workers,
        log=lambda line: print(line, file=sys.stderr),
    )
    print(f"{summary['output']}: {summary['filings']} filings, {summary['characters']:,} "
          f"characters ({len(summary['missing'])} listed PDFs absent, "
          f"{len(summary['unreadable'])} unreadable)")  # fmt: skip


if __name__ == "__main__":
    cli.run_script(main)
