"""Reading a small YAML configuration file that a user wrote, with bounds on what it can cost.

:func:`load_config_yaml` is ``yaml.safe_load`` with four guards, each a one-line
:class:`~stagescope.errors.UserError` naming the file (and the line where there is one):

* the file is at most ``max_bytes`` (1 MiB: an SLO file is a few hundred bytes) and UTF-8 text;
* anchors and aliases are allowed (``<<: *defaults`` merge keys are common), but the document they
  expand to is bounded (``max_nodes``, 100,000 nodes), and an alias that contains itself is refused:
  the "billion laughs" file of nine nested lists of nine aliases would otherwise expand to 9**9 items
  and take tens of seconds and gigabytes once any of it is turned into text;
* nesting is bounded: flow collections (``[[[...]]]``) to ``MAX_FLOW_DEPTH`` levels before the
  parser sees them (PyYAML's scanner is quadratic in their depth: 5,000 levels took 6 s), and any
  nesting by the parser's recursion ("nested too deeply", not a ``RecursionError``);
* a key repeated in one mapping is refused (YAML keeps the last one silently; a second
  ``threshold_ms:`` is a mistake, not an override);
* a scalar that parses but cannot be built is an error naming its line, not a traceback: a date that
  does not exist (``2001-13-45``), an explicit tag on a value it does not fit (``!!int abc``), an
  integer of more digits than Python converts (4,300).

It also returns the composed node tree, so callers can name the line of an item or key.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

from stagescope.errors import UserError

__all__ = ["MAX_CONFIG_BYTES", "MAX_CONFIG_NODES", "MAX_FLOW_DEPTH", "load_config_yaml"]

MAX_CONFIG_BYTES = 1024 * 1024
MAX_CONFIG_NODES = 100_000
MAX_FLOW_DEPTH = 64
_QUOTED_OR_COMMENT = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\']|\'\')*\'|#[^\n]*')
_BRACKET = re.compile(r"[\[\]{}]")


def _flow_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting outside quoted strings and comments (an upper bound is enough)."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_QUOTED_OR_COMMENT.sub("", text)):
        depth = depth + 1 if m[0] in "[{" else max(0, depth - 1)
        deepest = max(deepest, depth)
    return deepest


def _read_text(p: Path, what: str, max_bytes: int) -> str:
    try:
        with p.open("rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise UserError(f"{p}: {what} not found") from None
    except OSError as exc:
        raise UserError(f"{p}: cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise UserError(f"{p}: {what} is larger than {max_bytes // (1024 * 1024)} MiB; is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{p}: {what} is not UTF-8 text (byte {exc.start})") from None


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _check_graph(p: Path, root: yaml.Node, max_nodes: int) -> None:
    """Expanded size of the node graph (aliases counted at every use), duplicate keys, self-reference."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            if size[key] > max_nodes:
                raise UserError(
                    f"{p}:{_line(node)}: YAML aliases expand to more than {max_nodes} nodes; "
                    "anchors and aliases are allowed, but not this many repetitions"
                )
            continue
        if key in size:
            continue
        if key in on_path:
            raise UserError(f"{p}:{_line(node)}: a YAML alias refers to a node that contains it (recursive)")
        on_path.add(key)
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for k, _v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value != "<<":
                    if k.value in seen:
                        raise UserError(
                            f"{p}:{_line(k)}: duplicate key {k.value!r} (first at line {seen[k.value]})"
                        )
                    seen[k.value] = _line(k)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _unbuildable(p: Path, root: yaml.Node, exc: Exception) -> str:
    """The message for a document whose construction failed: the first scalar that cannot be built."""
    probe = yaml.SafeLoader("")
    try:
        seen: set[int] = set()
        stack = [root]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.ScalarNode):
                try:
                    probe.construct_object(node, deep=True)
                except (ValueError, OverflowError, TypeError) as bad:
                    shown = node.value if len(node.value) <= 40 else node.value[:37] + "..."
                    why = str(bad)
                    if why.startswith("Exceeds the limit"):  # Python's advice (set_int_max_str_digits) is not the user's
                        why = f"{len(node.value)} characters; a number has at most {sys.get_int_max_str_digits()} digits"
                    return f"{p}:{_line(node)}: cannot read the value {shown!r} ({node.tag.rsplit(':', 1)[-1]}): {why}"
            stack.extend(reversed(_children(node)))
    finally:
        probe.dispose()
    return f"{p}: not valid YAML ({exc})"


def load_config_yaml(
    path: str | Path, what: str, *, max_bytes: int = MAX_CONFIG_BYTES, max_nodes: int = MAX_CONFIG_NODES
) -> tuple[Any, yaml.Node | None]:
    """``(document, root node)`` of the YAML file ``path`` (``what`` names it in messages)."""
    p = Path(path)
    text = _read_text(p, what, max_bytes)
    if _flow_depth(text) > MAX_FLOW_DEPTH:
        raise UserError(
            f"{p}: {what} is nested too deeply to be a configuration file (over {MAX_FLOW_DEPTH} levels)"
        )
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        _check_graph(p, node, max_nodes)
        try:
            return loader.construct_document(node), node
        except (ValueError, OverflowError, TypeError) as exc:  # a scalar yaml resolved but cannot build
            raise UserError(_unbuildable(p, node, exc)) from None
    except RecursionError:
        raise UserError(f"{p}: {what} is nested too deeply to be a configuration file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        raise UserError(f"{p}{where}: not valid YAML" + (f" ({problem})" if problem else "")) from None
    finally:
        loader.dispose()
