"""The CMake package (`etfuse.kernels.cmake_prefix_path`, target etfuse::kernels): a consumer
project written the way the README says is configured, built and run on fused programs, whose
outputs are compared with eager; a static build under -Wl,--as-needed, a shared selective build,
the runner, and an aarch64 cross build under qemu. Also `etfuse ops`, and that the generated
build description (kernels/cmake/etfuse-kernels-sources.cmake) is current.

The builds are module fixtures (each compiles the kernels once: minutes on two cores). Without
cmake (>= 3.28) they skip, but under CI=true they fail: CI must test the package."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import etfuse
from etfuse import cli
from etfuse.kernels import build as kbuild
from etfuse.kernels import cmake_package

import readme_consumer

# The README's consumer project (README.md, "Deploying to a device"), as written there.
CONSUMER_CMAKELISTS = readme_consumer.cmakelists()

# Runs forward on float32 inputs read from raw files; prints every output element.
CONSUMER_MAIN = r"""
#include <cstdio>
#include <fstream>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr.h>

int main(int argc, char** argv) {
  executorch::extension::Module module(argv[1]);
  auto meta = module.method_meta("forward");
  if (!meta.ok() || static_cast<size_t>(argc - 2) != meta->num_inputs()) {
    std::fprintf(stderr, "%s: cannot read forward's inputs, or not one file per input\n", argv[1]);
    return 1;
  }
  std::vector<executorch::extension::TensorPtr> tensors;
  std::vector<executorch::runtime::EValue> inputs;
  for (size_t i = 0; i < meta->num_inputs(); ++i) {
    auto sizes = meta->input_tensor_meta(i)->sizes();
    std::vector<executorch::aten::SizesType> shape(sizes.begin(), sizes.end());
    size_t n = 1;
    for (auto s : shape) n *= s;
    std::vector<float> data(n);
    std::ifstream(argv[2 + i], std::ios::binary).read(reinterpret_cast<char*>(data.data()), n * sizeof(float));
    tensors.push_back(executorch::extension::make_tensor_ptr(shape, std::move(data)));
    inputs.emplace_back(tensors.back());
  }
  auto outputs = module.forward(inputs);
  if (!outputs.ok()) {
    std::fprintf(stderr, "%s: forward failed (executorch error %d)\n", argv[1], static_cast<int>(outputs.error()));
    return 1;
  }
  for (const auto& value : *outputs) {
    const auto& t = value.toTensor();
    for (ssize_t k = 0; k < t.numel(); ++k) std::printf("%.9g\n", t.const_data_ptr<float>()[k]);
  }
  return 0;
}
"""

ON_CI = os.environ.get("CI") == "true"


def _unavailable(why: str):
    if ON_CI:
        pytest.fail(f"{why} (CI=true: the CMake package must be tested there)")
    pytest.skip(why)


def _cmake() -> str:
    exe = shutil.which("cmake")
    if exe is None:
        _unavailable("cmake is not on PATH")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\d+)\.(\d+)", out)
    if not m or (int(m.group(1)), int(m.group(2))) < (3, 28):
        _unavailable(f"cmake >= 3.28 is needed, {exe} is {out.splitlines()[0] if out else '?'}")
    return exe


def _executorch_cmake_dir() -> str:
    return str(kbuild._executorch_dir() / "share" / "cmake")


def _configure(source: Path, build: Path, *defines: str, prefix: str | None = None) -> subprocess.CompletedProcess:
    prefix = prefix or f"{etfuse.kernels.cmake_prefix_path};{_executorch_cmake_dir()}"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    cmd = [_cmake(), "-S", str(source), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
           f"-DCMAKE_PREFIX_PATH={prefix}", f"-DETFUSE_PYTHON={sys.executable}", *defines]
    return subprocess.run(cmd, capture_output=True, text=True, env=readme_consumer.env())


def _configure_and_build(source: Path, build: Path, *defines: str, prefix: str | None = None) -> str:
    """Configure and build; returns the configure output."""
    conf = _configure(source, build, *defines, prefix=prefix)
    assert conf.returncode == 0, f"configure failed:\n{conf.stdout}\n{conf.stderr}"
    made = subprocess.run([_cmake(), "--build", str(build), "-j2"], capture_output=True, text=True,
                          env=readme_consumer.env())
    assert made.returncode == 0, f"build failed:\n{made.stdout[-6000:]}\n{made.stderr[-6000:]}"
    return conf.stdout


def _consumer(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "CMakeLists.txt").write_text(CONSUMER_CMAKELISTS)
    (folder / "main.cpp").write_text(CONSUMER_MAIN)
    return folder


# --- programs -------------------------------------------------------------------------------

class AddRelu(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)  # -> etfuse::add_relu


class ConvBnRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))  # -> etfuse::conv2d_bn_act


class SmallCnn(torch.nn.Module):
    """conv+bn+relu, max pool, conv+relu, spatial mean, linear: 4 of the op files, no add_relu."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.relu(self.conv2(x)).mean((2, 3))
        return self.fc(x)


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """name -> (.pte path, input files, eager output)."""
    from torch.export import export

    folder = tmp_path_factory.mktemp("programs")
    torch.manual_seed(0)
    made = {}
    for name, model, args in [("add_relu", AddRelu(), (torch.randn(4, 16), torch.randn(4, 16))),
                              ("conv_bn_relu", ConvBnRelu(), (torch.randn(1, 3, 8, 8),)),
                              ("cnn", SmallCnn(), (torch.randn(1, 3, 16, 16),))]:
        model.eval()
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):  # statistics that do something
                with torch.no_grad():
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 2.0)
        pte = folder / f"{name}.pte"
        pte.write_bytes(etfuse.fuse(etfuse.to_edge(export(model, args))).to_executorch().buffer)
        inputs = []
        for i, a in enumerate(args):
            inputs.append(folder / f"{name}.in{i}.f32")
            a.numpy().astype(np.float32).tofile(inputs[-1])
        with torch.no_grad():
            made[name] = (pte, inputs, model(*args).numpy())
    return made


def _run_app(app: Path, program) -> np.ndarray:
    pte, inputs, _ = program
    proc = subprocess.run([str(app), str(pte), *map(str, inputs)], capture_output=True, text=True, env=_env())
    assert proc.returncode == 0, f"{app.name} {pte.name}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return np.array([float(v) for v in proc.stdout.split()], dtype=np.float32)


def _env() -> dict:
    env = dict(os.environ)
    env.pop("ETFUSE_KERNELS_ISA", None)
    return env


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    want = want.reshape(-1)
    assert got.shape == want.shape, f"{what}: {got.shape} values, eager has {want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=what)


# --- no cmake needed -----------------------------------------------------------------------

def test_generated_cmake_description_is_current():
    stale = cmake_package.stale_cmake_files()
    assert not stale, (f"{stale} in {cmake_package.CMAKE_DIR} do not match the catalog and kernels/build.py: "
                       "run `python -m etfuse.kernels --write-cmake`")


def test_op_files_register_what_the_description_says():
    """The catalog's names per op file are what each file's ETFUSE_REGISTER lines register: the
    selective build picks files by these names."""
    described = cmake_package.runtime_ops_by_file()
    register = re.compile(r'^ETFUSE_REGISTER\((\w+),\s*"([^"]+)"', re.M)
    for stem, ops in described.items():
        text = (kbuild.CSRC / "ops" / f"{stem}.cpp").read_text()
        registered = [f"{ns}::{name}" for ns, name in register.findall(text)]
        assert sorted(registered) == sorted(ops), f"ops/{stem}.cpp registers {registered}, the catalog says {ops}"
    assert sorted(op for ops in described.values() for op in ops) == sorted(etfuse.kernels.RUNTIME_OPS)


def test_ops_command(programs, capsys):
    cnn, add_relu = str(programs["cnn"][0]), str(programs["add_relu"][0])
    assert cli.main(["ops", cnn]) == 0
    cnn_ops = ["etfuse::conv2d_act.out", "etfuse::conv2d_bn_act.out", "etfuse::linear_act.out",
               "etfuse::max_pool2d.out", "etfuse::mean_hw.out"]
    assert capsys.readouterr().out.splitlines() == cnn_ops
    assert cli.main(["ops", "--format", "cmake", cnn, add_relu]) == 0
    assert capsys.readouterr().out == ";".join(sorted(cnn_ops + ["etfuse::add_relu.out"])) + "\n"
    assert cli.main(["ops", "--all", cnn]) == 0
    assert set(capsys.readouterr().out.split()) >= set(cnn_ops)


@pytest.mark.parametrize("case", ["missing", "folder", "not_pte", "truncated"])
def test_ops_command_refuses_bad_input(case, programs, tmp_path, capsys):
    path = {"missing": tmp_path / "nope.pte", "folder": tmp_path}.get(case, tmp_path / "bad.pte")
    if case == "not_pte":
        path.write_text("not a program\n" * 10)
    if case == "truncated":
        path.write_bytes(programs["cnn"][0].read_bytes()[:100])
    assert cli.main(["ops", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"etfuse: error: {path}: "), err
    assert {"missing": "no such file", "folder": "is a folder", "not_pte": "not an ExecuTorch program",
            "truncated": "not a readable ExecuTorch program"}[case] in err


# --- builds ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cmake_exe():
    return _cmake()  # first, so that a missing cmake skips before any program is made


@pytest.fixture(scope="module")
def static_build(cmake_exe, tmp_path_factory):
    """Every op file, static (the default), linked under -Wl,--as-needed; with the runner."""
    root = tmp_path_factory.mktemp("static")
    build = root / "build"
    _configure_and_build(_consumer(root / "app"), build, "-DETFUSE_BUILD_RUNNER=ON",
                         "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed")
    return build


@pytest.fixture(scope="module")
def selected_shared_build(cmake_exe, tmp_path_factory, programs):
    """Only the op files the small CNN needs (ETFUSE_SELECT_OPS_MODEL), shared, --as-needed."""
    root = tmp_path_factory.mktemp("selected")
    build = root / "build"
    configured = _configure_and_build(
        _consumer(root / "app"), build, "-DETFUSE_BUILD_RUNNER=ON", "-DETFUSE_KERNELS_SHARED=ON",
        "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed", f"-DETFUSE_SELECT_OPS_MODEL={programs['cnn'][0]}")
    return build, configured


def _op_objects(build: Path) -> set[str]:
    return {p.name.split(".")[0] for p in build.rglob("*.o") if p.parent.name == "ops"}


def test_static_build_registers_every_kernel(static_build, programs):
    assert _op_objects(static_build) == set(cmake_package.runtime_ops_by_file())
    for name, program in programs.items():
        _close(_run_app(static_build / "app", program), program[2], f"app {name}")
    needed = subprocess.run(["readelf", "-d", str(static_build / "app")], capture_output=True, text=True).stdout
    assert "libetfuse" not in needed  # in the executable itself


def test_runner_links_executorch_quantized_kernels_too(static_build, programs, tmp_path):
    pte, inputs, want = programs["cnn"]
    cmd = [str(static_build / "etfuse_runner"), str(pte), *(a for i in inputs for a in ("--input", str(i))),
           "--output-dir", str(tmp_path), "--iterations", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    assert proc.returncode == 0, proc.stderr
    _close(np.fromfile(tmp_path / "output_0.bin", dtype=np.float32), want, "etfuse_runner cnn")
    needed = subprocess.run(["readelf", "-d", str(static_build / "etfuse_runner")], capture_output=True, text=True).stdout
    if (kbuild._executorch_dir() / "lib" / "libexecutorch_kernels_quantized.so").exists():
        assert "libexecutorch_kernels_quantized.so" in needed


@pytest.mark.parametrize("name", ["int8_pt2e_cnn", "quantized_embeddings"])
def test_quantized_programs_beside_executorch_quantized_kernels(static_build, name, tmp_path):
    """etfuse::kernels and executorch::kernels_quantized in one app (the runner links both): it
    starts, and etfuse's quantized programs load and give their eager outputs bit for bit."""
    from test_deploy import check_runner

    check_runner([str(static_build / "etfuse_runner")], name, tmp_path)


def test_shared_build_has_soname_and_stays_needed(selected_shared_build, programs):
    build, _ = selected_shared_build
    major = etfuse.__version__.split(".")[0]
    library = build / f"libetfuse_kernels.so.{etfuse.__version__}"
    assert library.is_file() and (build / f"libetfuse_kernels.so.{major}").is_symlink()
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
    assert f"Library soname: [libetfuse_kernels.so.{major}]" in dynamic
    needed = subprocess.run(["readelf", "-d", str(build / "app")], capture_output=True, text=True).stdout
    assert f"Shared library: [libetfuse_kernels.so.{major}]" in needed  # despite -Wl,--as-needed
    _close(_run_app(build / "app", programs["cnn"]), programs["cnn"][2], "shared app cnn")


def test_selective_build_from_model(selected_shared_build, programs):
    build, configured = selected_shared_build
    assert _op_objects(build) == {"conv2d_act", "conv2d_bn_act", "linear_act", "pool2d"}
    assert f"4 of {len(cmake_package.runtime_ops_by_file())} op files" in configured
    pte, inputs, _ = programs["add_relu"]  # calls etfuse::add_relu.out, which was left out
    cmd = [str(build / "etfuse_runner"), str(pte), *(a for i in inputs for a in ("--input", str(i)))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    assert proc.returncode != 0 and "etfuse::add_relu.out" in proc.stderr, proc.stderr


def test_selection_errors_name_the_problem(cmake_exe, tmp_path):
    app = _consumer(tmp_path / "app")

    def configure(folder: str, define: str) -> tuple[int, str]:
        proc = _configure(app, tmp_path / folder, define)
        return proc.returncode, " ".join((proc.stdout + proc.stderr).split())  # CMake wraps its messages

    status, out = configure("b1", "-DETFUSE_SELECT_OPS_LIST=etfuse::conv2d_bn_act.out, etfuse::nope.out")
    assert status != 0 and "ETFUSE_SELECT_OPS_LIST: unknown op etfuse::nope.out;" in out and "etfuse::add_relu.out" in out
    status, out = configure("b2", "-DETFUSE_SELECT_OPS_LIST=etfuse::add_relu")
    assert status != 0 and "unknown op etfuse::add_relu (did you mean etfuse::add_relu.out?)" in out
    status, out = configure("b3", f"-DETFUSE_SELECT_OPS_MODEL={tmp_path / 'nope.pte'}")
    assert status != 0 and f"ETFUSE_SELECT_OPS_MODEL: {tmp_path / 'nope.pte'}: no such file" in out
    status, out = configure("b4", "-DETFUSE_SELECT_OPS_LIST=etfuse::add_relu.out,etfuse::max_pool2d.out")
    assert status == 0 and "etfuse kernels: 2 of " in out and "for the selected ops: add_relu, pool2d" in out


def test_cmake_compiles_with_the_ninja_builds_flags(cmake_exe, tmp_path):
    """An op file's compile command in a consumer build holds the flags of the ninja build's runtime
    library (executorch's definitions arrive through executorch::runtime), and no x86 flag."""
    build = tmp_path / "build"
    conf = _configure(_consumer(tmp_path / "app"), build, "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
                      "-DETFUSE_SELECT_OPS_LIST=etfuse::add_relu.out")
    assert conf.returncode == 0, conf.stderr
    command = next(c["command"] for c in json.loads((build / "compile_commands.json").read_text())
                   if c["file"].endswith("ops/add_relu.cpp"))
    cmake_flags = {f for f in command.split() if f.startswith(("-D", "-O", "-f", "-W", "-std", "-m"))}
    ninja_flags = {f for f in kbuild.compile_flags()["runtime"] if not f.startswith("-I")}
    assert cmake_flags == ninja_flags, f"CMake: {sorted(cmake_flags)}\nninja: {sorted(ninja_flags)}"
    assert not [f for f in ninja_flags if f.startswith(("-march", "-mavx", "-msse", "-mfma"))]  # aarch64 builds too


def _aarch64_sdk() -> Path:
    try:
        from etfuse.kernels.sdk import sdk_root
    except ImportError:
        _unavailable("etfuse.kernels.sdk is missing")
    root = sdk_root("aarch64")
    if not (root / "share" / "cmake" / "executorch-config.cmake").is_file():
        _unavailable(f"no aarch64 executorch SDK at {root} (python -m etfuse.kernels.sdk aarch64)")
    return root


def test_aarch64_cross_build_runs_under_qemu(cmake_exe, tmp_path, programs):
    """The toolchain file is all a cross build needs; the x86 paths stay out of it."""
    for tool in ("aarch64-linux-gnu-g++", "qemu-aarch64"):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} is not on PATH")
    sdk = _aarch64_sdk()
    toolchain = Path(etfuse.kernels.cmake_prefix_path) / "aarch64-linux-gnu.toolchain.cmake"
    build = tmp_path / "build"
    _configure_and_build(_consumer(tmp_path / "app"), build, f"-DCMAKE_TOOLCHAIN_FILE={toolchain}",
                         f"-DETFUSE_SELECT_OPS_MODEL={programs['cnn'][0]}",
                         prefix=f"{etfuse.kernels.cmake_prefix_path};{sdk / 'share' / 'cmake'}")
    pte, inputs, want = programs["cnn"]
    proc = subprocess.run(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", str(build / "app"), str(pte),
                           *map(str, inputs)], capture_output=True, text=True, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    _close(np.array([float(v) for v in proc.stdout.split()], dtype=np.float32), want, "aarch64 app cnn")
