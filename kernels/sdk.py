"""executorch's C++ SDK for another platform: the executorch wheel of this version, built for that
platform, unpacked (its `include/`, `lib/` and `share/cmake/`), for cross builds of a consumer
project with etfuse's CMake package.

    python -m etfuse.kernels.sdk aarch64            # prints the SDK's share/cmake folder

The wheel comes from the package index pip is configured with (`pip download --platform ...`);
the SDK is kept in `$ETFUSE_SDK_CACHE` (default ~/.cache/etfuse/sdk/<arch>/executorch) and
fetched once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from etfuse.errors import EtfuseError

# The wheel platform tags executorch publishes, per target architecture.
PLATFORMS = {"aarch64": "manylinux_2_28_aarch64", "x86_64": "manylinux_2_28_x86_64"}


class SdkError(EtfuseError, RuntimeError):
    """The executorch SDK for a platform could not be fetched or is incomplete."""


def sdk_root(arch: str) -> Path:
    base = Path(os.environ.get("ETFUSE_SDK_CACHE", Path.home() / ".cache" / "etfuse" / "sdk")).expanduser()
    return base / arch / "executorch"


def _complete(root: Path) -> bool:
    return (root / "share" / "cmake" / "executorch-config.cmake").is_file() and (root / "lib" / "libexecutorch.so").is_file()


def fetch(arch: str = "aarch64", version: Optional[str] = None) -> Path:
    """The unpacked executorch package for `arch` (fetched once); returns its root folder."""
    if arch not in PLATFORMS:
        raise SdkError(f"no executorch SDK for {arch!r}: known architectures are {sorted(PLATFORMS)}")
    if version is None:
        from executorch import version as et_version

        version = et_version.__version__.split("+")[0]
    root = sdk_root(arch)
    if _complete(root):
        return root
    py = f"{sys.version_info.major}{sys.version_info.minor}"
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", f"executorch=={version}", "--no-deps",
               "--only-binary=:all:", "--platform", PLATFORMS[arch], "--python-version", py, "-d", d]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(d).glob("executorch-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise SdkError(f"cannot download the {arch} executorch {version} wheel ({' '.join(cmd)}):\n"
                           f"{proc.stderr.strip()[-2000:]}")
        staging = root.parent / f".{root.name}.part"
        with zipfile.ZipFile(wheels[0]) as z:
            members = [m for m in z.namelist() if m.startswith(("executorch/include/", "executorch/lib/",
                                                                "executorch/share/"))]
            z.extractall(staging, members)
        root.parent.mkdir(parents=True, exist_ok=True)
        if root.exists():
            import shutil

            shutil.rmtree(root)
        os.replace(staging / "executorch", root)
        staging.rmdir()
    if not _complete(root):
        raise SdkError(f"the {arch} executorch wheel unpacked into {root} has no share/cmake/executorch-config.cmake "
                       "or lib/libexecutorch.so")
    return root


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m etfuse.kernels.sdk",
                                 description="Fetch executorch's C++ SDK for a target architecture (once) and print "
                                             "its share/cmake folder, for CMAKE_PREFIX_PATH in a cross build.")
    ap.add_argument("arch", choices=sorted(PLATFORMS))
    args = ap.parse_args(argv)
    try:
        root = fetch(args.arch)
    except SdkError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(root / "share" / "cmake")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
