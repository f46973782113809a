import sys

from etfuse.passes.cli import main

sys.exit(main())
