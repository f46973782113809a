"""Workarounds for executorch 1.5.1 behaviour, one module per upstream bug.

| module                | upstream behaviour worked around                                              |
|-----------------------|-------------------------------------------------------------------------------|
| while_loop_to_scan.py | `to_executorch` cannot emit `while_loop`                                      |
| map_to_scan.py        | `to_edge` specialises a dynamic `map` dimension to the example size           |
| symint_to_prims.py    | symbolic builtins rejected by the verifier/emitter, or inexact on the runtime |
| cond_outputs.py       | a cond result is overwritten by the next control-flow op (shared arena)       |
| cond_views.py         | a view of a control-flow result reads a buffer the result never writes        |
| typed_pass_errors.py  | the pass manager wraps every pass error in a bare `Exception`                 |

cond_outputs.py and cond_views.py share result_copy.py. Each module says what executorch does
and when it can go; tests/test_compat.py runs each stock path and asserts the bug is still there.
"""
