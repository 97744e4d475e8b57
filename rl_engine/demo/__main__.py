"""CLI: ``python -m rl_engine.demo build DIR [--seed 0] [--force]``.

Without ``--force`` a complete build already in DIR with the same settings is reused; one
with other settings, or a non-empty DIR holding no build, is refused rather than replaced.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

PROG = "python -m rl_engine.demo"
_OWN_ENTRIES = {"model", "data", "manifest.json", "manifest.json.tmp"}


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see --help)\n")


def _fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    from rl_engine.demo.build import MODEL_SIZES

    parser = _OneLineParser(prog=PROG, description="Offline demo task builder.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    b = sub.add_parser("build", help="build model, tokenizer and data into DIR")
    b.add_argument("dir", metavar="DIR", type=Path)
    b.add_argument("--seed", type=int, default=0, help="seed for the split, init and SFT")
    b.add_argument("--force", action="store_true", help="rebuild even if DIR holds a build")
    b.add_argument("--size", choices=sorted(MODEL_SIZES), default="demo", help="model size")
    b.add_argument(
        "--sft-steps",
        type=int,
        default=None,
        help="fixed warm-start step count (default: the size's own budget)",
    )
    b.add_argument("--quiet", action="store_true", help="no progress output")
    return parser


def _build(args: argparse.Namespace) -> int:
    from rl_engine.demo.build import build_demo, existing_build

    out: Path = args.dir
    if not 0 <= args.seed < 2**32:
        _fail(f"--seed must be in [0, 2**32), got {args.seed}")
    if args.sft_steps is not None and args.sft_steps < 0:
        _fail(f"--sft-steps must be >= 0, got {args.sft_steps}")
    if out.exists() and not out.is_dir():
        _fail(f"{out} exists and is not a directory")
    if out.is_dir() and not args.force:
        found = existing_build(out)
        if found is not None:
            same = found.get("seed") == args.seed and found.get("model_size") == args.size
            if args.sft_steps is not None:
                same = same and found.get("sft", {}).get("max_steps") == args.sft_steps
            if not same:
                _fail(
                    f"{out} holds a build with seed {found.get('seed')} and size "
                    f"{found.get('model_size')!r}; pass --force to replace it"
                )
            print(
                f"reusing existing build in {out} (seed {found['seed']}, size "
                f"{found['model_size']!r}, warm-start accuracy "
                f"{found['warm_start']['test_accuracy']:.1%}); pass --force to rebuild"
            )
            return 0
        strangers = sorted(p.name for p in out.iterdir() if p.name not in _OWN_ENTRIES)
        if strangers:
            _fail(f"{out} is not empty and holds no complete demo build; pass --force to build there")
    try:
        m = build_demo(out, args.seed, sft_steps=args.sft_steps, model_size=args.size, progress=not args.quiet)
    except OSError as exc:
        _fail(f"cannot write the build to {out}: {exc}")
    print(
        f"built {out} in {m['build_seconds']:.1f} s: {m['model']['parameters']:,} parameters, "
        f"{m['sft']['steps']} SFT steps, warm-start held-out accuracy "
        f"{m['warm_start']['test_accuracy']:.1%}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "build":
        return _build(args)
    raise AssertionError(args.command)  # argparse only accepts known commands


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; the build in progress is incomplete", file=sys.stderr)
        sys.exit(130)
