"""What every command group of the CLI shares: a handler's type, and how a group adds a command
to the parser (``add(name, handler, help)``: the subcommand, its help, its handler)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeAlias

from app.runtime.settings import Settings

Handler = Callable[[argparse.Namespace, Settings], int]
Add = Callable[[str, Handler, str], argparse.ArgumentParser]
# argparse's subparsers action (its class is private).
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
