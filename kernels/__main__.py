"""`python -m etfuse.kernels [--check] [--force] [-v] [--write-cmake] [--cmake-prefix-path]`: build
the kernel libraries into the kernel cache (or find them there) and print where it is; `--check`
only verifies the cache entry against its manifest (exit status 1 when it is not usable);
`--write-cmake` regenerates the CMake package's build description from the catalog;
`--cmake-prefix-path` prints CMAKE_PREFIX_PATH for a consumer project (etfuse's package and
executorch's)."""

from .build import main

raise SystemExit(main())
