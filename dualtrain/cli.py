"""The `dualtrain` command: ``dualtrain demo``, ``dualtrain --version``."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence

from dualtrain.version import __version__

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dualtrain` console script; returns the exit status."""
    parser = argparse.ArgumentParser(prog="dualtrain", description=__doc__)
    parser.add_argument("--version", action="version", version=f"dualtrain {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the end-to-end demo on synthetic data")
    demo.add_argument("--seed", type=_seed, default=0, help="seed of data and weights")
    demo.add_argument("--steps", type=_positive, default=60,
                      help="SGD steps of the one-Craft comparison (both frameworks)")  # fmt: skip
    demo.add_argument("--lr", type=_rate, default=0.3,
                      help="learning rate of the one-Craft comparison")  # fmt: skip
    demo.add_argument(
        "--nworld", type=_positive, default=2, help="Multiverse workers (1 leaves that part out)"
    )
    demo.add_argument("--backend", choices=("torch", "jax", "both"), default="both",
                      help="the framework(s) to run under")  # fmt: skip
    demo.add_argument("--out", type=_folder, default="dualtrain-demo",
                      help="folder for packs, DashBoard logs and checkpoints")  # fmt: skip
    demo.add_argument("--epochs", type=_positive, default=None,
                      help="epochs of the image pipeline (default 5; 4 with --quick)")  # fmt: skip
    demo.add_argument("--quick", action="store_true", help="smaller data, fewer steps")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from dualtrain.demo import run  # imports rich tables only when asked

        run(seed=args.seed, steps=args.steps, lr=args.lr, nworld=args.nworld,
            backend=args.backend, out=args.out, epochs=args.epochs, quick=args.quick)  # fmt: skip
    return 0


def _seed(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0; got {value}")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number; got {text}")
    return value


def _folder(text: str) -> str:
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"must be a folder (made if missing); {text} is a file")
    return text


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive int; got {value}")
    return value
