"""LEAF: alignment-only distillation, i.e. Caliber with lambda = 0 (../papers/002).

python -m caliber_jax.train --config configs/leaf.py --workdir runs/leaf

The default is the Caliber paper's LEAF baseline: its own recipe with lambda = 0 (one epoch, the
same linear decay). `configs/leaf.py:paper` is LEAF's own schedule (002, sec. 3.2 and App. A.2):
30 epochs in 3 cycles of linear decay over 10 epochs each, 1e-4 -> 1e-5, the rate lowered at the
end of each epoch and reset to 1e-4 at each cycle; no warm-up is stated.
"""

from configs import caliber


def get_config(arg: str | None = None):
    config = caliber.get_config()
    config.loss.lam = 0.0
    if arg == "paper":
        config.num_epochs = 30.0
        config.optim.lr = 1e-4
        config.optim.warmup_frac = 0.0
        config.optim.schedule = "cyclic_linear"
        config.optim.cycles = 3
        config.optim.end_lr_frac = 0.1
        config.optim.epochs_per_cycle = 10
    elif arg:
        raise ValueError(f"configs/leaf.py: unknown variant {arg!r}; expected 'paper' or none")
    return config
