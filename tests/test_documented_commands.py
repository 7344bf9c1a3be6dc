"""Every command the docs give a user still works as written: each program named in the
README, docs/, configs/, examples/, bench/ and the Makefile answers `--help` and knows
every flag a documented command passes it, and every documented `--config=...` with its
`--config.<key>=<value>` overrides loads and passes the config checks."""

import concurrent.futures
import glob
import os
import re
import shlex
import subprocess
import sys

from absl import flags
from ml_collections import config_flags
import pytest

from rollx import checks
from tests.conftest import ROOT

DOCUMENTS = ["README.md", "Makefile", "docs/*.md", "configs/*.py", "examples/*.py", "bench/*.py"]
# `python -m rollx.<module>` or `python bench/<script>.py`, then its arguments up to the
# end of the command as written (a code span, a table cell, a comment, a quote)
COMMAND = re.compile(r"python3? (-m (?:rollx|bench|examples)[\w.]*|(?:bench|examples)/\w+\.py)"
                     r"([^`|#;\n]*)")
PLACEHOLDER = re.compile(r"^([A-Z][A-Z_]*|\.\.\.)$")  # DIR, N, ...: the user fills it in


def documented_commands():
  """({program: [(argv, where)]} of every command the documents show, [(command line,
  the error it prints, where)] of the commands shown failing: `$ python ...` followed by
  the program's one-line error)."""
  found, failing = {}, []
  for pattern in DOCUMENTS:
    for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
      with open(path) as f:
        lines = f.read().splitlines()
      for number, line in enumerate(lines, 1):
        where = f"{os.path.relpath(path, ROOT)}:{number}"
        after = lines[number] if number < len(lines) else ""
        if line.startswith("$ python") and re.match(r"rollx\.\w+: ", after):
          failing.append((line[2:], after, where))
          continue
        for program, rest in COMMAND.findall(line):
          rest = re.sub(r"\[[^\]]*\]?", " ", rest)  # [--optional ...] settings
          try:
            words = shlex.split(rest)
          except ValueError:  # a quote the prose opened
            words = rest.split()
          if words and words[-1].count(")") > words[-1].count("("):  # (as in `python ...`)
            words[-1] = words[-1].rstrip(")")
          argv = [a for a in words if a.startswith("--")]
          found.setdefault(program.replace("-m ", "-m\0"), []).append((argv, where))
  return found, failing


COMMANDS, FAILING = documented_commands()


def test_the_documents_show_the_programs_users_run():
  programs = set(COMMANDS)
  for must in ("-m\0rollx.train", "-m\0rollx.curve", "-m\0rollx.eval", "-m\0rollx.results",
               "-m\0rollx.recipes.warm_start", "bench/serve.py"):
    assert must in programs, sorted(programs)


def help_text(program):
  args = program.split("\0") if program.startswith("-m") else [program]
  source = args[-1] if args[0] != "-m" else args[1].replace(".", "/") + ".py"
  with open(os.path.join(ROOT, source)) as f:
    absl = "from absl import app" in f.read()
  # absl's --helpfull lists the flags of every module (rollx.cli's --config among them);
  # it exits 1, argparse's --help exits 0
  proc = subprocess.run([sys.executable, *args, "--helpfull" if absl else "--help"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, XLA_FLAGS="", PYTHONPATH=ROOT))
  return proc


def test_every_documented_program_answers_help_and_knows_its_documented_flags():
  with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two cores
    helps = dict(zip(COMMANDS, pool.map(help_text, COMMANDS)))
  for program, proc in helps.items():
    shown = program.replace("\0", " ")
    text = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1) and "Traceback" not in text, (shown, text[-2000:])
    assert "usage" in text.lower() or "flags:" in text.lower(), (shown, text[-2000:])
    for argv, where in COMMANDS[program]:
      for arg in argv:
        name = arg.split("=")[0]
        if name.startswith("--config."):
          continue  # a config key: the next test
        spelled = (name, "--[no]" + name[2:]) if "=" not in arg else (name,)
        assert any(re.search(re.escape(s) + r"\b", text) for s in spelled), \
            f"{where}: `python {shown}` has no flag {name}"


def config_commands():
  """[(the --config flags, where first shown)], each set once (the documents repeat
  some); `--config=...` stands for the user's config: nothing to load."""
  first = {}
  for uses in COMMANDS.values():
    for argv, where in uses:
      given = tuple(a for a in argv if a.startswith("--config")
                    and not PLACEHOLDER.match(a.partition("=")[2]))
      if any(a.startswith("--config=") for a in given):
        first.setdefault(given, where)
  return list(first.items())


CONFIG_COMMANDS = config_commands()


@pytest.mark.parametrize("argv, where", CONFIG_COMMANDS, ids=[w for _, w in CONFIG_COMMANDS])
def test_every_documented_config_and_override_loads_and_passes_the_checks(argv, where):
  given = ["prog", *argv]
  values = flags.FlagValues()  # rollx.cli's --config, on its own
  config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=False,
                                  sys_argv=given)
  cwd = os.getcwd()
  os.chdir(ROOT)  # the documents' paths are relative to the checkout
  try:
    values(given)
    checks.validate(values.config)
  finally:
    os.chdir(cwd)


@pytest.mark.parametrize("line, error, where", FAILING, ids=[w for *_, w in FAILING])
def test_a_documented_mistake_prints_the_documented_error(line, error, where):
  argv = [sys.executable if a == "python" else a for a in shlex.split(line)]
  proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, XLA_FLAGS="", PYTHONPATH=ROOT))
  assert proc.returncode == 2 and proc.stderr.strip() == error, (where, proc.stderr[-2000:])
