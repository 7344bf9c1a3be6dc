"""The layout stays livable: no import cycle in the package (imports inside functions
count), and no module over MAX_LINES lines unless its docstring says why it is whole."""

import ast
import pathlib

import pytest

from tests.conftest import ROOT

PACKAGES = ("rollx", "envs")
MAX_LINES = 500
REASON = "Kept whole:"  # the docstring line of a longer module: why it is one room


def _modules():
  out = {}
  for package in PACKAGES:
    for path in sorted(pathlib.Path(ROOT, package).rglob("*.py")):
      parts = list(path.relative_to(ROOT).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      out[".".join(parts)] = path
  return out


def import_graph(modules):
  """module -> {module it imports}, at any depth of its code (functions included)."""
  def resolve(name):
    while name and name not in modules:
      name = name.rpartition(".")[0]
    return name or None

  graph = {}
  for name, path in modules.items():
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
          base = ".".join(up + ([base] if base else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                   for a in node.names]
      else:
        continue
      edges |= {t for t in map(resolve, targets) if t and t != name}
    graph[name] = edges
  return graph


def cycles(graph):
  """The strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_the_cycle_finder_sees_imports_inside_functions():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert cycles(graph) == [["a", "b", "c"]]
  tree = ast.parse("def f():\n  from rollx.recipes import warm_start\n")
  assert any(isinstance(n, ast.ImportFrom) for n in ast.walk(tree))


def test_no_import_cycle():
  graph = import_graph(_modules())
  assert "rollx.recipes.warm_start" in graph["rollx.recipes.tool_start"]  # walked at all
  found = cycles(graph)
  where = [" <-> ".join(c) + ": " + "; ".join(f"{a} imports {b}" for a in c
                                             for b in sorted(graph[a] & set(c)))
           for c in found]
  assert not found, "\n".join(where)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_the_line_limit_without_a_reason(package):
  long = []
  for name, path in _modules().items():
    text = path.read_text()
    lines = text.count("\n")
    if name.split(".")[0] == package and lines > MAX_LINES:
      doc = ast.get_docstring(ast.parse(text)) or ""
      if REASON not in doc:
        long.append(f"{path.relative_to(ROOT)}: {lines} lines")
  assert not long, (f"over {MAX_LINES} lines, with no '{REASON} <why>' in the docstring: "
                    + ", ".join(long))
