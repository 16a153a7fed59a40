"""``python -m torchdefer``: the command line (see :mod:`torchdefer._cli`)."""

from torchdefer._cli import main

raise SystemExit(main())
