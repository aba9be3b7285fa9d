"""The ``adattr`` command line, the top layer: it parses arguments and calls one function of the
layers below per command (see ``entry``)."""

from __future__ import annotations

from app.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
