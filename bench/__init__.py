"""The benchmarks (bench/README.md): each runs as `.venv/bin/python bench/<name>.py` from the checkout's root and
prints one JSON document; they import each other as `bench.<name>`, and no file here is named like a module
of the standard library or of an installed package (Python puts this folder first on sys.path)."""
