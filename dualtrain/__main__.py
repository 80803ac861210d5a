"""``python -m dualtrain``: the same as the `dualtrain` command."""

from dualtrain.cli import main

raise SystemExit(main())
