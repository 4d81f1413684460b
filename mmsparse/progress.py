"""The progress bar every `train-head` method shows (rich, on stderr)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def epoch_progress(console, total_steps: int | None, epochs: int, first: str = "epoch 1") \
        -> Iterator[tuple[object, Callable[..., None]]]:
    """A bar over `total_steps` optimizer steps (None: unknown until the first step).

    Yields (progress, update): call update(r, info) from a trainer's on_step with its record r
    (needs "epoch" and "step"; "total" updates the bar's length) and the text shown after the bar;
    print per-epoch lines with progress.console.print so they stay above the bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console) as prog:
        task = prog.add_task(first, total=total_steps, info="")

        def update(r: dict, info: str) -> None:
            prog.update(task, completed=r["step"], description=f"epoch {r['epoch']}/{epochs}", info=info,
                        **({"total": r["total"]} if "total" in r else {}))

        yield prog, update
