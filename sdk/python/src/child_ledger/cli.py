"""python -m child_ledger worker module:handler --queue q ..."""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Any, Callable, List, Optional

from .client import Ledger
from .errors import LedgerError, ProblemError
from .worker import Worker


def _load(spec: str) -> Callable[..., Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"handler must be module:function, not {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise SystemExit(f"{spec} is not callable")
    return obj  # type: ignore[no-any-return]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m child_ledger", description="child-ledger worker.")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="run a handler on a queue's children",
                       description="Claim children of QUEUE, run HANDLER (module:function) on each, record outcomes.")
    w.add_argument("handler", help="module:function (the current directory is on sys.path)")
    w.add_argument("--queue", required=True, help="queue to claim from")
    w.add_argument("--url", default=None, help="service URL (default $LEDGER_URL, else http://127.0.0.1:8080)")
    w.add_argument("--token", default=None, help="bearer token with the worker role (default $LEDGER_TOKEN)")
    w.add_argument("--concurrency", type=int, default=8, help="handlers running at once (default 8)")
    w.add_argument("--batch", type=int, default=None, help="children per claim (default: concurrency, max 1000)")
    w.add_argument("--lease-seconds", type=int, default=60, help="lease length (default 60)")
    w.add_argument("--wait-seconds", type=int, default=None,
                   help="claim long poll, 0-20 (default 10; 1 with --exit-when-empty)")
    w.add_argument("--grace-seconds", type=float, default=30, help="time in-flight handlers get on stop (default 30)")
    w.add_argument("--name", default=None, help="worker label shown as claimed_by")
    w.add_argument("--exit-when-empty", action="store_true",
                   help="exit once a claim comes back empty and nothing claimed is in flight")
    w.add_argument("-v", "--verbose", action="count", default=0, help="-v info, -vv debug logging")
    t = sub.add_parser("wait", help="wait for a parent to complete and print its verdict",
                       description="Follow PARENT's event stream until it completes; print its verdict and counts. "
                                   "Exit 0 when it succeeded, 1 when it failed or was cancelled.")
    t.add_argument("parent", help="the parent's id")
    t.add_argument("--url", default=None, help="service URL (default $LEDGER_URL, else http://127.0.0.1:8080)")
    t.add_argument("--token", default=None, help="bearer token with the reader role (default $LEDGER_TOKEN)")
    t.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit 3)")
    return p


def _wait(args: argparse.Namespace) -> int:
    with Ledger(args.url, args.token) as ledger:
        try:
            parent = ledger.wait(args.parent, timeout=args.timeout)
        except TimeoutError:
            print(f"{args.parent} did not complete within {args.timeout} s", file=sys.stderr)
            return 3
    counts = parent["counts"]
    print(f"{parent['verdict']}: {counts['processed']} processed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped", flush=True)
    return 0 if parent["verdict"] == "succeeded" else 1


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "wait":
        try:
            return _wait(args)
        except LedgerError as err:
            print(f"child-ledger wait: {type(err).__name__}: {err}", file=sys.stderr)
            return 2
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        handler = _load(args.handler)
        ledger = Ledger(args.url, args.token)
        worker = Worker(ledger, args.queue, handler, concurrency=args.concurrency, batch=args.batch,
                        lease_seconds=args.lease_seconds, wait_seconds=args.wait_seconds,
                        grace_seconds=args.grace_seconds, name=args.name, exit_when_empty=args.exit_when_empty)
        stats = worker.run()
    except ProblemError as err:
        hint = " — check --token/LEDGER_TOKEN" if err.status in (401, 403) else ""
        print(f"child-ledger worker: {type(err).__name__}: {err}{hint}", file=sys.stderr)
        return 2
    except (LedgerError, ValueError) as err:
        print(f"child-ledger worker: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"worker": worker.name, **stats}), flush=True)
    return 0


def worker_main() -> int:
    """The ``child-ledger-worker`` console script: ``python -m child_ledger worker`` without the word."""
    return main(["worker", *sys.argv[1:]])
