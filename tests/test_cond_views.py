"""CondViewCopyPass: a view (flatten/reshape) of a cond or scan result reads the wrong buffer
on the stock executorch 1.5.1 runtime (cond) or fails to lower (scan); the pass fixes both."""

import pytest
import torch
from executorch.exir import to_edge
from executorch.runtime import Runtime
from torch._higher_order_ops.scan import scan

from etfuse.passes import CondViewCopyPass


def _double(x):
    return x * 2


def _minus_one(x):
    return x - 1


class CondFlattenRelu6(torch.nn.Module):
    def forward(self, x):
        y = torch.cond(x.sum() > 0, _double, _minus_one, (x,))
        return torch.nn.functional.relu6(y.flatten(1))


class CondReshapeTwice(torch.nn.Module):
    def forward(self, x):
        y = torch.cond(x.sum() > 0, _double, _minus_one, (x,))
        return torch.relu(y.reshape(2, 12).reshape(24))


class CondFlattenOutput(torch.nn.Module):
    """A view that is the graph output is not elided upstream: nothing to copy."""

    def forward(self, x):
        return torch.cond(x.sum() > 0, _double, _minus_one, (x,)).flatten()


class ScanFlatten(torch.nn.Module):
    def forward(self, x):
        def step(c, xs):
            return c + xs, (c * xs).clone()

        c, ys = scan(step, torch.zeros(3, 4), x)
        return torch.relu(ys.flatten(1)), c


def _execute(edge, x):
    buffer = edge.to_executorch().buffer
    method = Runtime.get().load_program(buffer).load_method("forward")
    return list(method.execute((x,)))


def _max_error(got, want):
    want = want if isinstance(want, tuple) else (want,)
    return max(float((g - w).abs().max()) for g, w in zip(got, want))


X = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 3 - 2  # sum > 0: the true branch


@pytest.mark.parametrize("model", [CondFlattenRelu6, CondReshapeTwice])
def test_the_pass_fixes_a_view_of_a_cond_result(model):
    # stock executorch misreads this view (silently wrong values): tests/test_compat.py
    edge = to_edge(torch.export.export(model(), (X,)))  # to_executorch rewrites its program in place
    before = str(edge.exported_program().graph)
    p = CondViewCopyPass()
    fixed = edge.transform([p])
    assert str(edge.exported_program().graph) == before  # the caller's program is untouched
    assert p.copied == [("", "getitem")]
    again = CondViewCopyPass()
    again(fixed.exported_program().graph_module)
    assert again.copied == []  # idempotent
    buffer = fixed.to_executorch().buffer
    method = Runtime.get().load_program(buffer).load_method("forward")
    for x in (X, -X):  # both branches
        torch.testing.assert_close(method.execute((x,))[0], model()(x))


def test_scan_result_viewed_lowers_and_runs_with_the_pass():
    x = torch.randn(2, 3, 4)
    edge = to_edge(torch.export.export(ScanFlatten(), (x,)))
    with pytest.raises(Exception, match="shape_dynamism"):
        edge.to_executorch()  # the upstream failure
    edge = to_edge(torch.export.export(ScanFlatten(), (x,)))
    fixed = edge.transform([CondViewCopyPass()])
    got = _execute(fixed, x)
    for g, w in zip(got, ScanFlatten()(x)):
        torch.testing.assert_close(g, w)


def test_views_feeding_only_the_output_are_left_alone():
    edge = to_edge(torch.export.export(CondFlattenOutput(), (X,)))
    p = CondViewCopyPass()
    p(edge.exported_program().graph_module)
    assert p.copied == []
    edge = to_edge(torch.export.export(CondFlattenOutput(), (X,)))
    torch.testing.assert_close(_execute(edge, X)[0], CondFlattenOutput()(X))


def test_views_inside_a_branch_are_copied_too():
    class Nested(torch.nn.Module):
        def forward(self, x):
            def outer_true(x):
                y = torch.cond(x.mean() > 0, _double, _minus_one, (x,))
                return torch.relu(y.flatten(1)) * 2

            def outer_false(x):
                return (x - 1).flatten(1)

            return torch.cond(x.sum() > 0, outer_true, outer_false, (x,))

    edge = to_edge(torch.export.export(Nested(), (X,)))
    p = CondViewCopyPass()
    fixed = edge.transform([p])
    buffer = fixed.to_executorch().buffer
    method = Runtime.get().load_program(buffer).load_method("forward")
    assert len(p.copied) == 1 and p.copied[0][0].startswith("submodule")  # inside the outer true branch
    for x in (X, -X):
        torch.testing.assert_close(method.execute((x,))[0], Nested()(x))
