"""``python -m torchdefer``: the command line (see :mod:`torchdefer.cli`)."""

from torchdefer.cli import main

raise SystemExit(main())
