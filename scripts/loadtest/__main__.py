"""`python -m scripts.loadtest [...]`: the load tester (see scripts/loadtest/cli.py)."""

from scripts.loadtest.cli import main

raise SystemExit(main())
