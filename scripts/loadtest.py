"""Load-test surge (or any OpenAI-compatible server): the same tool as `surge loadtest`.

    .venv/bin/python scripts/loadtest.py --concurrency 16 --duration 30
    .venv/bin/python scripts/loadtest.py --rate 8 --duration 30 --duplicate-fraction 0.3 --retries 3

NOTE: the code lives in app/loadtest/ so that the installed `surge` command can import it (scripts/
is not a package); this file only puts the repository on the path and forwards the arguments.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app.loadtest import main

if __name__ == "__main__":
    raise SystemExit(main())
