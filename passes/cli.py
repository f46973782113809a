"""The `etfuse` command lives in `etfuse.cli` (a module that imports executorch only once the
arguments have been checked); this name is kept for code that imported it from here."""

from etfuse.cli import *  # noqa: F401,F403
from etfuse.cli import CliError, DemoModel, build_parser, main  # noqa: F401

if __name__ == "__main__":
    import sys

    sys.exit(main())
