"""Traced edge patterns kept on disk, so a new process does not export its rule table again.

Tracing the built-in table (export + `to_edge` of every pattern and function replacement) takes
about 25 s, and every process paid it on its first `fuse`: each CLI call, each script. A traced
graph depends only on etfuse's own source, the rule, its example inputs and the torch /
executorch / torchao versions, so it is stored once under a key made of those.

Only the package's own rules are stored: a user's rule may change without etfuse's source
changing, so it is traced in each process as before. The cache is
`$ETFUSE_PATTERN_CACHE` (default `~/.cache/etfuse/patterns`; `off` turns it off). A file that
cannot be read is ignored and written again; writes are atomic (a temporary file, then rename),
so processes running side by side at worst trace the same rules twice.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Optional

import torch
import torch.fx as fx

_FORMAT = 1
_PACKAGES = ("etfuse", "etfuse.backend_ops", "etfuse.patterns", "etfuse.passes", "etfuse.kernels")


class _NodeRef:
    """A reference to an earlier node of the stored graph, by name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self):
        return (_NodeRef, (self.name,))


class _Uncacheable(Exception):
    pass


def cache_dir() -> Optional[Path]:
    env = os.environ.get("ETFUSE_PATTERN_CACHE", "")
    if env.lower() == "off":
        return None
    return Path(env).expanduser() if env else Path.home() / ".cache" / "etfuse" / "patterns"


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """A hash of etfuse's Python source and the versions tracing depends on."""
    h = hashlib.sha256(f"{_FORMAT}|{sys.version_info[:2]}|{torch.__version__}".encode())
    for name in ("executorch", "torchao"):
        try:
            from importlib.metadata import version

            h.update(f"|{name}={version(name)}".encode())
        except Exception:  # noqa: BLE001 - not installed: part of the key too
            h.update(f"|{name}=none".encode())
    for package in _PACKAGES:
        root = Path(importlib.import_module(package).__file__).parent
        for path in sorted(root.glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:24]


def _own(fn) -> bool:
    return getattr(fn, "__module__", "").startswith("etfuse.")


def rule_id(rule, replacement: bool) -> Optional[str]:
    """The rule's key in the cache, or None for a rule this cache does not store (not etfuse's own)."""
    from etfuse.backend_ops import BackendOp

    fn = rule.replacement if replacement else rule.pattern
    if not _own(rule.pattern) or not (isinstance(rule.replacement, BackendOp) or _own(rule.replacement)):
        return None
    try:
        examples = tuple((tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else (type(v).__name__, v)
                         for v in rule.example_inputs())
    except Exception:  # noqa: BLE001 - the trace reports a rule's broken example inputs
        return None
    dtypes = tuple(sorted((k, str(v)) for k, v in getattr(rule, "dtypes", {}).items()))
    return repr((type(rule).__qualname__, rule.key, fn.__module__, fn.__qualname__, examples, dtypes))


def _path(replacement: bool) -> Optional[Path]:
    root = cache_dir()
    if root is None:
        return None
    return root / f"{fingerprint()}.{'replacements' if replacement else 'patterns'}.pkl"


_LOADED: dict[bool, dict] = {}  # replacement? -> {rule id: stored graph}, read once per process


def _entries(replacement: bool) -> dict:
    if replacement not in _LOADED:
        entries = {}
        path = _path(replacement)
        if path is not None and path.exists():
            try:
                with open(path, "rb") as f:
                    loaded = pickle.load(f)
                if isinstance(loaded, dict):
                    entries = loaded
            except Exception:  # noqa: BLE001 - a damaged or foreign file is traced again and replaced
                entries = {}
        _LOADED[replacement] = entries
    return _LOADED[replacement]


def lookup(rules, replacement: bool) -> dict:
    """{rule: its traced EdgePattern} for the rules the cache holds."""
    from .rule import EdgePattern

    found = {}
    entries = _entries(replacement)
    for rule in rules:
        key = rule_id(rule, replacement)
        stored = entries.get(key) if key is not None else None
        if stored is None:
            continue
        try:
            graph, names = _load_graph(stored["nodes"])
            found[rule] = EdgePattern(graph, list(stored["params"]), names[stored["anchor"]],
                                      [n for n in graph.nodes if n.op == "call_function"],
                                      [names[o] for o in stored["outputs"]])
        except Exception:  # noqa: BLE001 - an op that no longer exists, ...: traced again
            continue
    return found


def store(traced: dict, replacement: bool) -> None:
    """Add {rule: EdgePattern} (as traced, before `bind_literals`) to the cache file."""
    path = _path(replacement)
    if path is None:
        return
    entries = _entries(replacement)
    added = 0
    for rule, pattern in traced.items():
        key = rule_id(rule, replacement)
        if key is None or key in entries:
            continue
        try:
            entries[key] = {"nodes": _dump_graph(pattern.graph), "params": list(pattern.params),
                            "anchor": pattern.anchor.name, "outputs": [o.name for o in pattern.outputs]}
            pickle.dumps(entries[key])
        except Exception:  # noqa: BLE001 - a graph with targets or literals this format cannot hold
            entries.pop(key, None)
            continue
        added += 1
    if not added:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(entries, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:  # a read-only home, a full disk: the cache is an optimisation
        pass


def _dump_graph(graph: fx.Graph) -> list:
    nodes = []
    for n in graph.nodes:
        ref = lambda a: _NodeRef(a.name)  # noqa: E731
        nodes.append((n.op, n.name, _dump_target(n) if n.op == "call_function" else n.target,
                      fx.map_arg(n.args, ref), fx.map_arg(n.kwargs, ref)))
    return nodes


def _dump_target(n: fx.Node) -> tuple:
    from executorch.exir.dialects.edge._ops import EdgeOpOverload

    t = n.target
    if isinstance(t, EdgeOpOverload):
        return ("edge", t._op.name(), t._op._overloadname)
    if isinstance(t, torch._ops.OpOverload):
        return ("ops", t.name(), t._overloadname)
    module, name = getattr(t, "__module__", None), getattr(t, "__qualname__", None)
    if module and name and _resolve(module, name) is t:
        return ("py", module, name)
    raise _Uncacheable(f"target {t!r}")


def _resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _load_target(spec: tuple):
    kind = spec[0]
    if kind == "py":
        return _resolve(spec[1], spec[2])
    namespace, rest = spec[1].split("::")
    packet = rest.split(".")[0]
    if kind == "edge":
        from executorch.exir.dialects._ops import ops as exir_ops

        return getattr(getattr(getattr(exir_ops.edge, namespace), packet), spec[2])
    return getattr(getattr(getattr(torch.ops, namespace), packet), spec[2])


def _load_graph(nodes: list) -> tuple[fx.Graph, dict]:
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}

    def node_of(a):
        if isinstance(a, _NodeRef):
            return env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(node_of(x) for x in a)
        if isinstance(a, dict):
            return {k: node_of(v) for k, v in a.items()}
        return a

    for op, name, target, args, kwargs in nodes:
        if op == "placeholder":
            new = graph.placeholder(target)
        elif op == "output":
            new = graph.output(node_of(args[0]))
        elif op == "call_function":
            new = graph.call_function(_load_target(target), node_of(args), node_of(kwargs))
        else:
            raise _Uncacheable(op)
        new.name = name
        env[name] = new
    return graph, env
