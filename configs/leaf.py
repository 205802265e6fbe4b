"""LEAF: alignment-only distillation, i.e. Caliber with lambda = 0 (../papers/002).

python -m caliber_jax.train --config configs/leaf.py --workdir runs/leaf
"""

from configs import caliber


def get_config(arg: str | None = None):
    config = caliber.get_config(arg)
    config.loss.lam = 0.0
    return config
