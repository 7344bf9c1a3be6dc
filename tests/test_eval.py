"""`python -m rollx.eval` as a user runs it, on what the shared 3-step run saved (the
`trained_run` fixture, tests/conftest.py): its Orbax checkpoint and its HF export on
the run's validation envs (4 levels); bad --checkpoint values exit with one line."""

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_pipeline import train_env, train_flags

TAG_LINE = re.compile(
    r"^(?P<tag>\w+): episodes=(?P<episodes>\d+) levels=(?P<levels>\d+) "
    r"success=(?P<success>[\d.]+) ci95=\[(?P<low>[\d.]+),(?P<high>[\d.]+)\] "
    r"score_mean=(?P<score>-?[\d.]+) invalid_action_rate=(?P<invalid>[\d.]+) "
    r"pass@(?P<k>\d+)=(?P<pass_k>[\d.]+)$", re.M)
LEVELS = 4  # the run's val_batch_size (tests/test_pipeline.py SMALL)


def run_eval(out, *args):
  """`python -m rollx.eval` with the run's config flags (its output dir untouched)."""
  return subprocess.run([sys.executable, "-m", "rollx.eval", *train_flags(out), *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=300,
                        env=train_env())


def report(result):
  """{tag: fields} of a report; asserts the run succeeded and printed a header."""
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.startswith("rollx.eval: checkpoint="), result.stdout
  return {m["tag"]: m.groupdict() for m in TAG_LINE.finditer(result.stdout)}


def read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def one_line_error(result, needle):
  lines = [l for l in result.stderr.splitlines() if l.strip()]
  assert result.returncode != 0
  assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert lines[0].startswith("rollx.eval: ") and needle in lines[0], lines[0]
  return lines[0]


def test_orbax_checkpoint_greedy_report_is_repeatable_with_episodes_jsonl(trained_run, tmp_path):
  out, trained = trained_run
  assert trained.returncode == 0, trained.stderr[-3000:]
  first = run_eval(out, f"--checkpoint={out}/checkpoints/3", f"--out={tmp_path}/a.jsonl")
  tags = report(first)
  assert "(orbax step 3)" in first.stdout.splitlines()[0]
  assert "sampling=greedy" in first.stdout.splitlines()[0]
  assert set(tags) == {"FrozenLake"}
  t = tags["FrozenLake"]
  assert int(t["episodes"]) == int(t["levels"]) == LEVELS and t["k"] == "1"
  assert float(t["low"]) <= float(t["success"]) <= float(t["high"])
  assert float(t["pass_k"]) == float(t["success"])  # pass@1 of one greedy sample per level
  episodes = read_jsonl(tmp_path / "a.jsonl")
  assert len(episodes) == LEVELS
  assert [e["level"] for e in episodes] == list(range(LEVELS))
  assert len({e["seed"] for e in episodes}) == LEVELS  # four different maps
  assert abs(sum(e["success"] for e in episodes) / LEVELS - float(t["success"])) < 1e-3
  for e in episodes:
    assert e["tag"] == "FrozenLake" and e["sample"] == 0
    assert e["transcript"] and len(e["samples"]) == e["num_turns"]  # step-wise samples
    s = e["samples"][0]
    assert len(s["token_ids"]) == len(s["response_mask"]) and sum(s["response_mask"]) > 0
    assert isinstance(s["text"], str) and e["transcript"][0]["response"] in s["text"]
  # same seed, same levels, greedy: the same report and the same episodes
  again = run_eval(out, f"--checkpoint={out}/checkpoints/3", f"--out={tmp_path}/b.jsonl")
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout == first.stdout
  assert read_jsonl(tmp_path / "b.jsonl") == episodes


def test_hf_export_with_pass_at_k_samples_each_level_k_times(trained_run, tmp_path):
  out, trained = trained_run
  assert trained.returncode == 0, trained.stderr[-3000:]
  result = run_eval(out, f"--checkpoint={out}/export", "--k=2", f"--out={tmp_path}/k.jsonl")
  tags = report(result)
  header = result.stdout.splitlines()[0]
  assert "(hugging face directory)" in header and "samples=2" in header
  assert "actor_infer.generating_args" in header and "temperature=1.0" in header
  t = tags["FrozenLake"]
  assert (int(t["episodes"]), int(t["levels"]), t["k"]) == (2 * LEVELS, LEVELS, "2")
  episodes = read_jsonl(tmp_path / "k.jsonl")
  assert len(episodes) == 2 * LEVELS
  # each level played twice, on one map (the levels of the greedy evaluation)
  assert [(e["level"], e["sample"]) for e in episodes] == [
      (level, sample) for level in range(LEVELS) for sample in range(2)]
  for level in range(LEVELS):
    assert len({e["seed"] for e in episodes if e["level"] == level}) == 1
  wins = [sum(e["success"] for e in episodes if e["level"] == level) for level in range(LEVELS)]
  # pass@2 from 2 samples: a level counts when either sample succeeded
  assert abs(float(t["pass_k"]) - sum(w > 0 for w in wins) / LEVELS) < 1e-3


def test_missing_or_foreign_checkpoint_is_one_line_naming_the_path(trained_run, tmp_path):
  out, _ = trained_run
  missing = tmp_path / "no_such_dir"
  one_line_error(run_eval(out, f"--checkpoint={missing}"), str(missing))
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "weights.bin").write_bytes(b"\0" * 16)
  one_line_error(run_eval(out, f"--checkpoint={foreign}"), str(foreign))


def test_a_checkpoint_of_another_model_is_refused_naming_the_path(trained_run, tmp_path):
  # in-process (what the CLI turns into its one line: rollx.eval.main): the run's step
  # directory against a config whose model (a tiny random HF model) has other shapes
  from rollx import config as config_lib, eval as eval_lib
  from tests.hf_fixtures import make_hf_model
  out, trained = trained_run
  assert trained.returncode == 0, trained.stderr[-3000:]
  _, other = make_hf_model(tmp_path)
  config = config_lib.load_file(f"{ROOT}/configs/frozenlake.py")
  source = eval_lib.resolve_checkpoint(str(out / "checkpoints"))  # the latest step
  assert (source.kind, source.step) == ("orbax", 3)
  assert eval_lib.restore_params(source, config)["embed_tokens"].shape[0] > 101
  config.pretrain = other
  with pytest.raises(eval_lib.CheckpointProblem) as e:
    eval_lib.restore_params(source, config)
  message = str(e.value)
  assert "\n" not in message and f"--checkpoint={out}/checkpoints/3:" in message
  assert "shape" in message and other in message


def test_eval_config_lays_out_levels_and_samples():
  from rollx import config as config_lib, eval as eval_lib
  config = config_lib.load_file(f"{ROOT}/configs/frozenlake.py")
  config.val_env_manager.group_size_redundancy = 1
  greedy = eval_lib.eval_config(config, levels=32, samples=1, k=1)
  vm = greedy.val_env_manager
  assert (vm.num_env_groups, vm.group_size, vm.group_size_redundancy) == (32, 1, 0)
  assert greedy.actor_infer.val_generating_args.temperature == 0  # validation's, greedy
  sampled = eval_lib.eval_config(config, levels=8, samples=4, k=2)
  assert (sampled.val_env_manager.num_env_groups, sampled.val_env_manager.group_size) == (8, 4)
  assert sampled.actor_infer.val_generating_args.to_dict() == \
      config.actor_infer.generating_args.to_dict()  # training sampling for pass@k
  assert config.val_env_manager.num_env_groups == 128  # the given config is left as it was
  config.val_env_manager.num_groups_partition = (96, 32)
  config.val_env_manager.tags = ("FrozenLake", "FrozenLake")
  scaled = eval_lib.eval_config(config, levels=256, samples=1, k=1)
  assert tuple(scaled.val_env_manager.num_groups_partition) == (192, 64)
