"""Benchmarks of torchdefer: memory and time of building and materializing huge models.

Run ``python -m bench`` (``make bench``) for the full suite, or
``python -m bench --quick`` (``make bench-quick``) for a two-minute smoke run.
Every case runs in its own child process, whose resident memory the parent
samples (psutil); results go to a Markdown table and PNG plots. See
``bench/README.md`` for what is measured and how to read it.

The modules, one idea each::

    models.py          the model zoo: Llama shapes from 125M to 405B, a 1T stack
    memory.py          resident memory and its peak, read from inside a process
    worker.py          the child side: run one case, report phases as JSON lines
    runner.py          the parent side: spawn, sample RSS, show progress, time out
    construction.py    suite 1: deferred_init vs meta vs FakeTensorMode vs eager
    materialization.py suite 2: materialize_module vs eager, in reverse, per submodule
    recording.py       suite 3: microseconds per recorded op
    environment.py     machine, versions, exact command
    report.py          the Markdown report and the targets
    plots.py           the PNG plots (matplotlib, optional)

Nothing here is imported by torchdefer or by its tests, except the smoke test
that runs the quick suite end to end.
"""

__all__: list[str] = []
