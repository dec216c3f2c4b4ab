"""A KFP step that takes its settings from their declaration instead of its own signature.

kfp builds a lightweight component from its function's source: `inspect.getsource` at compile
time, and that text is what runs in the container, where kfp's executor hands each input to the
parameter of its name. So each setting must be a parameter in the source itself: a
`__signature__` set from outside would describe the inputs to the compiler, but the
container's copy of the function would not take them. kfp's answer for a signature made in code
is a container component, which gives up the executor's artifacts and outputs; no library writes
parameters into a function, hence this module.

`with_settings(template, settings)` writes them in: the template's `settings: dict` parameter
becomes one typed parameter per declared setting (so the compiled YAML and the Vertex AI console
still show one input per setting), and the first line of its body gathers them back into the
dict `settings`. A step then reads `TrainConfig(**settings)`, and adding a setting changes
neither the step, nor the DAG, nor the commands.

>>> def step(data: str, settings: dict, out: str) -> str:
...     '''A step.'''
...     return f"{data} {sorted(settings.items())} {out}"
>>> made = with_settings(step, {"epochs": int, "tile": str})
>>> made("d", epochs=3, tile="auto", out="o")
"d [('epochs', 3), ('tile', 'auto')] o"
>>> import inspect; str(inspect.signature(made))
'(data: str, epochs: int, tile: str, out: str) -> str'
"""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
from typing import Callable

SETTINGS = "settings"  # the template's parameter the declared settings replace


def with_settings(template: Callable, settings: dict[str, type], parameter: str = SETTINGS) -> Callable:
    """`template` with its `parameter: dict` (default `settings: dict`) written out as one
    parameter per entry of `settings` (name → bool/int/float/str), and the dict gathered again
    as its body's first line."""
    source = textwrap.dedent(inspect.getsource(template))
    source = source[source.index("def "):]  # the decorators, if any, as kfp leaves them out
    function = ast.parse(source).body[0]
    marker = next((a for a in function.args.args if a.arg == parameter), None)
    if marker is None or marker.annotation is None or marker.lineno != marker.annotation.end_lineno:
        raise TypeError(f"{template.__name__} needs a parameter `{parameter}: dict` on one line")
    clash = sorted(set(settings) & {a.arg for a in function.args.args})
    if clash:
        raise TypeError(f"{template.__name__} already has parameters named {', '.join(clash)}")
    lines = source.splitlines(keepends=True)
    first = function.body[1] if ast.get_docstring(function) is not None else function.body[0]
    gather = "{" + ", ".join(f"{name!r}: {name}" for name in settings) + "}"
    lines.insert(first.lineno - 1, " " * first.col_offset + f"{parameter} = {gather}\n")
    row = marker.lineno - 1
    written = ", ".join(f"{name}: {kind.__name__}" for name, kind in settings.items())
    lines[row] = lines[row][:marker.col_offset] + written + lines[row][marker.annotation.end_col_offset:]
    text = "".join(lines)
    # inspect.getsource (which kfp calls) finds a file's lines in linecache; an entry without a
    # modification time is one it never evicts.
    filename = f"<{template.__module__}.{template.__name__} with {parameter}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    namespace = dict(template.__globals__)
    exec(compile(text, filename, "exec", dont_inherit=True), namespace)  # noqa: S102 - the template's own source, rewritten
    made = namespace[template.__name__]
    made.__module__ = template.__module__
    return made
