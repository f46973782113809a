import sys

from etfuse.cli import main

sys.exit(main())
