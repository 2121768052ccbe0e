"""``python -m mmreplay``: the command line, imported lazily."""

from __future__ import annotations


def _run() -> None:
    from mmreplay.cli.main import main

    main()


if __name__ == "__main__":
    _run()
