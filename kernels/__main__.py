"""`python -m etfuse.kernels [--force] [-v]`: build the kernel libraries (or find them cached)."""

from .build import main

raise SystemExit(main())
