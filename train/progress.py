"""What a run says while it trains: a progress line every LOG_EVERY steps, and each epoch's evaluation.

The line format is kept stable for scripts that grep it:

    step     40/80  epoch 1/2  loss 0.4321  accuracy 0.8750  12,345 examples/s
"""

from __future__ import annotations

from collections.abc import Callable

Say = Callable[[str], None]


def format_metrics(metrics: dict[str, float | list]) -> str:
    """loss first, then every other metric as `name value`, two spaces apart."""
    parts = []
    for name, value in metrics.items():
        shown = f"{value:.4f}" if isinstance(value, float) else "[" + ", ".join(_flat(value)) + "]"
        parts.append(f"{name} {shown}")
    return "  ".join(parts)


def _flat(value) -> list[str]:
    if isinstance(value, list):
        return [text for item in value for text in _flat(item)]
    return [f"{value:.4f}"]


class Lines:
    """Plain lines: container logs, CI, `| tee`."""

    def __init__(self, say: Say, total_steps: int, steps_per_epoch: int, epochs: int) -> None:
        self.say, self.total, self.steps_per_epoch, self.epochs = say, total_steps, steps_per_epoch, epochs

    def log(self, step: int, metrics: dict[str, float | list], examples_per_sec: float | None) -> None:
        epoch = -(-step // self.steps_per_epoch)
        speed = f"{examples_per_sec:,.0f} examples/s" if examples_per_sec else "(first call: tracing)"
        self.say(f"step {step:>7}/{self.total}  epoch {epoch}/{self.epochs}  {format_metrics(metrics)}  {speed}")

    def evaluated(self, epoch: int, metrics: dict[str, float | list]) -> None:
        self.say(f"epoch {epoch} eval: {format_metrics(metrics)}")
