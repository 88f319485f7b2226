"""Benchmarks, reliability drivers, the load tester and the harness they share with tests/.

Everything here runs as a module from the repository root (`python -m scripts.bench`), so it
imports the project and each other as packages, with no path edits.
"""
