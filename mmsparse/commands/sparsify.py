"""`mmsparse sparsify` (being written)."""

import typer


def main(args: list[str] = typer.Argument(None)) -> None:
    """Not yet implemented."""
    raise NotImplementedError("sparsify")
