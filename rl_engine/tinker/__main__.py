"""``python -m rl_engine.tinker serve``: the Tinker API on a port, for the models named on the command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rl_engine.tinker.server import TinkerServer
from rl_engine.tinker.service import CallRecord, TinkerService
from rl_engine.tinker.tracking import PosttrainRuns


def _model(spec: str) -> tuple[str, Path]:
    name, sep, folder = spec.partition("=")
    if not sep or not name or not Path(folder).is_dir():
        raise argparse.ArgumentTypeError(f"--model {spec!r}: expected NAME=FOLDER with a model folder")
    return name, Path(folder)


def _log_call(record: CallRecord) -> None:
    print(f"tinker call {record.kind} {record.seconds:.6f} s", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_engine.tinker")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the Tinker API")
    serve.add_argument("--model", type=_model, action="append", required=True, help="NAME=FOLDER (repeatable)")
    serve.add_argument("--root", type=Path, required=True, help="where checkpoints are written")
    serve.add_argument("--api-key-file", type=Path, help="a file holding a key this server accepts (tml-...)")
    serve.add_argument(
        "--posttrain",
        metavar="URL",
        help="accept Posttrain API tokens as keys (tml-<token>); each training client a run",
    )
    serve.add_argument("--idle-s", type=float, default=120.0, help="a session without a heartbeat this long ends")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument(
        "--log-calls", action="store_true", help="log each call's compute time (bench/tinker_overhead.py)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    keys: set[str] = set()
    if args.api_key_file is not None:
        keys.add(args.api_key_file.read_text().strip())
        if not next(iter(keys)).startswith("tml-"):
            parser.error("--api-key-file: the SDK only sends keys that start with 'tml-'")
    if not keys and args.posttrain is None:
        parser.error("give --api-key-file, --posttrain, or both")
    runs = PosttrainRuns(args.posttrain, args.root / "posttrain-runs") if args.posttrain else None
    on_call = _log_call if args.log_calls else None
    service = TinkerService(dict(args.model), args.root, on_call=on_call, runs=runs, idle_s=args.idle_s)
    server = TinkerServer((args.host, args.port), service, keys)
    print(f"tinker service at {server.url}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
