"""`python -m etfuse.kernels [--check] [--force] [-v] [--write-cmake] [--cmake-prefix-path]`: build
the kernel libraries into the kernel cache (or find them there) and print where it is; `--check`
only verifies the cache entry against its manifest (exit status 1 when it is not usable);
`--write-cmake` regenerates the CMake package's build description from the catalog;
`--cmake-prefix-path` prints CMAKE_PREFIX_PATH for a consumer project (etfuse's package and
executorch's)."""

from __future__ import annotations

import sys
from typing import Optional

from .build import LIBRARIES, KernelBuildError
from .cache import MANIFEST, build, check
from .cmake_package import CMAKE_DIR, CMAKE_SOURCES, CMAKE_VERSION_FILE, cmake_prefix_path, write_cmake


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m etfuse.kernels",
        description="Build the etfuse kernel libraries into the kernel cache (or find them there) and print "
                    "where it is. For images and CI: a prebuilt cache works later without a compiler.")
    ap.add_argument("--check", action="store_true",
                    help="only verify this build's cache entry against its manifest (exit 1 if it is not usable); "
                         "builds nothing, needs no compiler")
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("-v", "--verbose", action="store_true", help="show the compiler output")
    ap.add_argument("--write-cmake", action="store_true",
                    help=f"rewrite the CMake package's generated files ({CMAKE_SOURCES}, {CMAKE_VERSION_FILE} in "
                         f"{CMAKE_DIR}) from the catalog and this module's flags; builds nothing")
    ap.add_argument("--cmake-prefix-path", action="store_true",
                    help="print the CMAKE_PREFIX_PATH that finds the etfuse and executorch CMake packages")
    args = ap.parse_args(argv)
    if args.cmake_prefix_path:
        print(cmake_prefix_path())
        return 0
    if args.write_cmake:
        for path in write_cmake():
            print(f"wrote {path}")
        return 0
    if args.check:
        st = check()
        print(f"cache: {st.root}")
        print(f"entry: {st.directory}")
        if st.ok:
            comp = (st.manifest or {}).get("compiler", {})
            print(f"ok: {len(LIBRARIES)} libraries match {MANIFEST} (built with {comp.get('version', '?')})")
            return 0
        print(f"not usable: {st.problem}")
        return 1
    try:
        res = build(force=args.force, verbose=args.verbose)
    except KernelBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"cache: {res.directory.parent}")
    print(f"{'built' if res.built else 'cached'}: {res.directory}")


if __name__ == "__main__":
    raise SystemExit(main())
