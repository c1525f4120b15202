"""Interactive SQL over the registry's tables (placeholder until the SQL shell lands)."""
from __future__ import annotations

import argparse
from collections.abc import Callable


def add_commands(sub: argparse._SubParsersAction, home_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add `sql`, `tables` and `history` to the `seclake` command line."""
