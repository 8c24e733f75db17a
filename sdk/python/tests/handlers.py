"""Handlers the worker subprocesses of the tests run (python -m child_ledger worker handlers:NAME)."""
import os
import time

from child_ledger import Child

LOG = os.environ.get("HANDLER_LOG")
SLEEP = float(os.environ.get("HANDLER_SLEEP", "0"))


def _log(child: Child, what: str) -> None:
    if LOG:
        with open(LOG, "a") as out:  # one small O_APPEND write per line
            out.write(f"{what} {child.parent_id} {child.sequence} {child.attempt} {child.previous_attempt}\n")


def record(child: Child) -> dict:
    _log(child, "done")
    return {"pid": os.getpid()}


def slow(child: Child) -> dict:
    _log(child, "start")
    time.sleep(SLEEP)
    _log(child, "done")
    return {"pid": os.getpid()}


async def arecord(child: Child) -> None:
    _log(child, "done")
