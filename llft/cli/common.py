"""What every llft command shares: one-line errors, logging set-up, a
reader that stops reading."""
from __future__ import annotations

import argparse
import functools
import logging
import os
import sys

LOG_LEVELS = ["debug", "info", "warning", "error"]


class UsageError(Exception):
    """Bad command line or environment: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse, but errors are one line on stderr rather than usage + error."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def fail(prog: str, message: str, status: int = 2) -> int:
    print(f"{prog}: {message}", file=sys.stderr)
    return status


def reader_may_stop(main):
    """`llft-status | head` ends the pipe early: that is the reader's
    choice, not an error to print a traceback for."""
    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # the exit's flush fails silently
            return 141    # 128 + SIGPIPE, as a shell reports it
    return run


def setup_logging(level: str, log_file=None):
    root = logging.getLogger("llft")
    root.setLevel(logging.DEBUG)
    root.handlers.clear()
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(getattr(logging, level.upper()))
    console.setFormatter(logging.Formatter("llft: %(message)s"))
    root.addHandler(console)
    if log_file is not None:
        fh = logging.FileHandler(log_file)
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(fh)
