"""The error a user's own input can cause (a CSV row, a flag value, a file): the CLI prints it as
one clear line instead of a stack trace. Each layer's other user errors (bad settings, a broker
down, missing jars) live beside the code that raises them; the CLI lists them all."""

from __future__ import annotations


class UserInputError(ValueError):
    """Bad input from the user (a CSV, a flag value); the message names the row or flag."""
