"""docs/results.toml is the one source of the project's figures: README.md's Results
section and docs/results.md are what `python -m rollx.results` writes from it, and a
config's `Expected:` quotes only figures of its own records. No JAX: this file runs in a
second."""

import ast
import glob
import os
import re
import subprocess
import sys

import pytest

from rollx import results
from tests.conftest import ROOT

CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.py")))


@pytest.fixture(scope="module")
def data():
  return results.load()


def test_the_pages_are_what_the_data_generates():
  for path, text in results.outputs(ROOT).items():
    with open(os.path.join(ROOT, path)) as f:
      assert f.read() == text, f"{path} is stale: run python -m rollx.results"


def _copy(tmp_path):
  """The files rollx.results reads and writes, and those its records name, under tmp_path."""
  names = [results.DATA, results.README, results.PAGE]
  names += [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs/curves/*.csv"))]
  names += [os.path.relpath(p, ROOT) for p in CONFIGS]
  for name in names:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    with open(os.path.join(ROOT, name)) as f:
      (tmp_path / name).write_text(f.read())
  return tmp_path


def test_check_names_the_stale_file_and_writes_nothing(tmp_path, capsys):
  root = str(_copy(tmp_path))
  assert results.main(["rollx.results", "--check"], root) == 0
  page = tmp_path / results.PAGE
  page.write_text("edited by hand\n")
  capsys.readouterr()
  assert results.main(["rollx.results", "--check"], root) == 1
  out = capsys.readouterr().out
  assert out.count("\n") == 1 and results.PAGE in out and results.README not in out, out
  assert page.read_text() == "edited by hand\n"
  assert results.main(["rollx.results"], root) == 0  # writes it
  assert results.main(["rollx.results", "--check"], root) == 0
  assert page.read_text() == open(os.path.join(ROOT, results.PAGE)).read()


def test_the_block_between_the_markers_is_replaced_alone(tmp_path):
  root = _copy(tmp_path)
  readme = root / results.README
  text = readme.read_text()
  start, end = text.index(results.BEGIN), text.index(results.END) + len(results.END)
  readme.write_text(text[:start] + results.BEGIN + "\nold\n" + results.END + text[end:])
  assert results.main(["rollx.results", "--check"], str(root)) == 1
  assert results.main(["rollx.results"], str(root)) == 0
  assert readme.read_text() == text


def test_the_command_runs_without_jax():
  code = ("import sys, rollx.results as r; code = r.main(['rollx.results', '--check']); "
          "assert not [m for m in sys.modules if m.split('.')[0] in ('jax', 'numpy')]; "
          "sys.exit(code)")
  run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
  assert run.returncode == 0 and run.stdout.count("\n") == 1, run.stdout + run.stderr


def test_records_are_well_formed(data):
  records = data["result"]
  assert {r["kind"] for r in records} == {"learning", "benchmark"}
  for r in records:
    assert r["details"] and r["command"] and r["host"], r["id"]
    if r["kind"] == "learning":
      assert r["config"], r["id"]
    else:
      assert not r["config"] and not r["curves"], r["id"]
  curves = {c for r in records for c in r["curves"]}
  shipped = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs/curves/*.csv"))}
  assert curves == shipped  # every curve belongs to a record


def test_every_record_has_a_row_and_a_heading(data):
  with open(os.path.join(ROOT, results.README)) as f:
    readme = f.read()
  with open(os.path.join(ROOT, results.PAGE)) as f:
    page = f.read()
  for r in data["result"]:
    assert f"(docs/results.md#{r['id']})" in readme
    assert f"\n### {r['id']}\n" in page


@pytest.mark.parametrize("text, figures", [
    ("first >= 0.8 at 7.4 / 6.4 / 6.5 min on seeds 1-3, step 180", ["0.8", "7.4", "6.4", "6.5",
                                                                       "180"]),
    ("(2026-11-26, 84ab0aa) `--seed=1`, seed 2, docs/results.md#tool-seed1", []),
    ("seed 1, 60 min; seeds 1, 2 and 3; seeds 1 and 2: 0.5", ["60", "0.5"]),
    ("1.38x, 27% of 10x10, 1,600 steps, lr 5e-4, Qwen2.5-0.5B", ["1.38", "27", "10", "1,600",
                                                                 "5e-4"]),
    ("0.023-0.063 over min 20-30.", ["0.023", "0.063", "20", "30"]),
])
def test_numbers(text, figures):
  assert results.numbers(text) == figures


def _expected(path):
  """The `Expected:` section of a config's docstring: its line and the indented lines
  after it."""
  with open(path) as f:
    doc = ast.get_docstring(ast.parse(f.read())) or ""
  lines = doc.splitlines()
  starts = [i for i, line in enumerate(lines) if line.startswith("Expected:")]
  assert len(starts) == 1, f"{os.path.basename(path)}: one Expected: section"
  section = [lines[starts[0]]]
  for line in lines[starts[0] + 1:]:
    if not line.startswith(" ") or not line.strip():
      break
    section.append(line)
  return "\n".join(section)


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_a_config_expects_only_figures_of_its_records(path, data):
  config = os.path.relpath(path, ROOT)
  own = [r for r in data["result"] if r["config"] == config]
  quoted = {n for r in own for n in results.numbers(r["figure"] + " " + r["details"])}
  unsourced = [n for n in results.numbers(_expected(path)) if n not in quoted]
  assert not unsourced, (f"{config}'s Expected: quotes {unsourced}, which no record of "
                         f"{config} in {results.DATA} holds")


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_a_config_points_to_the_results_page(path, data):
  ids = {r["id"] for r in data["result"]}
  anchors = re.findall(r"docs/results\.md#([\w-]+)", _expected(path))
  assert anchors, f"{os.path.basename(path)}'s Expected: names no docs/results.md#<id>"
  assert set(anchors) <= ids, set(anchors) - ids
