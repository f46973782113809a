"""`python -m etfuse.kernels [--check] [--force] [-v]`: build the kernel libraries into the kernel
cache (or find them there) and print where it is; `--check` only verifies the cache entry
against its manifest (exit status 1 when it is not usable)."""

from .build import main

raise SystemExit(main())
