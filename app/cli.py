"""The `surge` command: `surge serve [...]` and `surge build-tiny --size s|m|l --out DIR`."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from app.logs import configure_logging
from app.settings import add_serve_arguments, settings_from_namespace


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="surge", description="OpenAI-compatible LLM inference server")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over the OpenAI API")
    add_serve_arguments(serve, os.environ)
    build = commands.add_parser("build-tiny", help="write a tiny random model as a Hugging Face directory")
    build.add_argument("--size", choices=("s", "m", "l"), default="s")
    build.add_argument("--arch", choices=("llama", "qwen2", "mistral", "gpt2"), default="llama")
    build.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    if args.command == "build-tiny":
        from models.tiny import build_tiny

        path = build_tiny(args.size, args.out, arch=args.arch)
        print(path)
        return 0

    try:
        settings = settings_from_namespace(args, os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    configure_logging(settings.log_level, settings.log_format)
    from app.server import serve as run_server

    run_server(settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
