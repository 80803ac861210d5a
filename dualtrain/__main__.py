"""``python -m dualtrain``: the same as the `dualtrain` command."""

from dualtrain.cli import main

if __name__ == "__main__":  # worker processes (spawn) import this module too
    raise SystemExit(main())
