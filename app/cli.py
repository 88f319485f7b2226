"""The `surge` command: `surge serve [...]`, `surge build-tiny --size s|m|l --out DIR`."""

from __future__ import annotations

import argparse
import faulthandler
import io
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from app.ops.logs import configure_logging
from models import bound_onednn_caches


def _trace_native_crashes() -> None:
    """A native crash (a segfault in a library) leaves every thread's Python stack on stderr, so
    the log says why the process died; the engine's process turns it on for itself too."""
    # faulthandler writes to a file descriptor: when stderr has none (captured, embedded), the
    # process's original stderr still has one; with neither there is nowhere to write.
    for stream in (sys.stderr, sys.__stderr__):
        if stream is None:
            continue
        try:
            faulthandler.enable(file=stream)
            return
        except (AttributeError, ValueError, io.UnsupportedOperation):
            continue


def main(argv: Sequence[str] | None = None) -> int:
    bound_onednn_caches()  # before anything imports torch; the engine's process inherits it
    _trace_native_crashes()
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["loadtest"]:
        # NOTE: the load tester is a client tool, not part of the server: it lives in scripts/.
        print("surge loadtest is now `python -m scripts.loadtest` (run from a checkout of surge)", file=sys.stderr)
        return 2
    from app.config.arguments import add_serve_arguments, settings_from_namespace

    parser = argparse.ArgumentParser(prog="surge", description="OpenAI-compatible LLM inference server")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over the OpenAI API")
    add_serve_arguments(serve, os.environ)
    build = commands.add_parser("build-tiny", help="write a tiny random model as a Hugging Face directory")
    build.add_argument("--size", choices=("s", "m", "l"), default="s")
    build.add_argument("--arch", choices=("llama", "qwen2", "mistral", "gpt2"), default="llama")
    build.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(args_list)

    if args.command == "build-tiny":
        from models import build_tiny

        path = build_tiny(args.size, args.out, arch=args.arch)
        print(path)
        return 0

    try:
        settings = settings_from_namespace(args, os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    configure_logging(settings.log_level, settings.log_format)
    spawned = None
    if settings.engine.separate_process:
        # The engine child starts before the server's imports (FastAPI, transformers, torch), so
        # its own imports and the model load run beside them: models/process/spawn.py.
        from app.ops.diagnostics import engine_process_init
        from models import spawn_engine

        spawned = spawn_engine(settings.engine, engine_process_init(settings.log_level, settings.log_format))
    from app.server.factory import serve as run_server

    run_server(settings, spawned)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
