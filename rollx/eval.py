"""Entry point: a saved policy on the config's validation envs, with error bars.

    python -m rollx.eval --config=configs/frozenlake.py --checkpoint=output/checkpoints/200
        [--k=8 [--samples=16]] [--episodes=N] [--out=episodes.jsonl] [--config.KEY=VALUE ...]

`--checkpoint` is an Orbax step directory of a run (`<output_dir>/checkpoints/<step>`;
the `checkpoints` directory itself means its latest complete step), a Hugging Face
export (`<output_dir>/export`, or any directory with a config.json) or a PEFT LoRA
adapter directory (`<output_dir>/export/adapter`, or peft's own):

- Orbax: only the actor's params are read (a partial restore, no optimizer state),
  checked against the shapes of the config's model (`pretrain`, or the built-in
  default) and pushed to the servers as policy version <step>, as a weight sync in
  training does. The tokenizer is the config's model's. A LoRA run's checkpoint (its
  config's `actor_train.model_args.lora`) pushes its adapters onto `pretrain`.
- Hugging Face: the export becomes `pretrain` (weights and tokenizer).
- PEFT: the adapters are pushed onto the config's model (`pretrain`), which must be
  the base they were trained on (their shapes are checked).

The episodes are what validation in training plays: `val_env_manager`'s envs and tags,
the validation level stream (seeds from `seed`; `--episodes` levels, default
`val_batch_size`, one group each: generation 0 of groups 0..N-1, i.e. the levels of the
run's first validation when `val_env_manager.num_env_groups` equals it) and
`val_generating_args` (greedy in the shipped configs). Same config and seed, same levels
and, greedy, the same report.

pass@k (--k K, Chen et al. 2021): each level is played n = --samples (default K) times
with the training sampling (`actor_infer.generating_args`, e.g. temperature 1), as a
training group of n envs on one level; per level the unbiased estimator
1 - C(n-c, k) / C(n, k) from its c successes, averaged over levels. Success, score and
invalid-action rate are then over all n x levels sampled episodes (success is pass@1).
Sampled episodes depend on how the server batches requests, so a sampled report is not
bitwise repeatable; a greedy one is.

The report (stdout): a header line, then one line per env tag (and `all` over tags when
there are several):

    FrozenLake: episodes=128 levels=128 success=0.617 ci95=[0.530,0.697] score_mean=0.532
        invalid_action_rate=0.000 pass@1=0.617

ci95 is the Wilson score interval of the success rate (z = 1.96) over the levels (with
n samples per level the levels, not the correlated episodes, count as the trials: a
conservative interval). `--out` writes one JSON line per episode: tag, level (group
id), level seed, sample, score, success, finish, the transcript (each turn's response,
action, reward) and each training sample's token ids, response mask and decoded text.

A missing or foreign --checkpoint (neither layout, unreadable, or shapes that are not
the config's model's) exits with one line naming the path, as bad config input does.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, List, Sequence

from absl import app, flags
import ml_collections
import numpy as np

from rollx import checks, cli, hostmem
from rollx.tracking import pass_at_k, wilson_interval

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "Orbax step directory (<output_dir>/checkpoints/<step>), Hugging "
    "Face export (<output_dir>/export) or PEFT adapter directory (<output_dir>/export/adapter)")
_K = flags.DEFINE_integer("k", 1, "pass@k: k > 1 samples each level with actor_infer."
                          "generating_args (training sampling) instead of validation's")
_SAMPLES = flags.DEFINE_integer("samples", None, "samples per level for pass@k (n >= k; "
                                "default k)")
_EPISODES = flags.DEFINE_integer("episodes", None, "levels to play (default val_batch_size)")
_OUT = flags.DEFINE_string("out", None, "write one JSON line per episode to this file")


class CheckpointProblem(ValueError):
  """--checkpoint cannot be evaluated; the message names the path."""


@dataclasses.dataclass
class Source:
  kind: str  # "orbax" | "hf" | "peft"
  path: str  # the step directory, or the HF / adapter directory
  step: int = 0  # Orbax: the step (the policy version the servers get)

  def describe(self) -> str:
    return (f"orbax step {self.step}" if self.kind == "orbax" else
            "peft adapter directory" if self.kind == "peft" else "hugging face directory")


# -- the checkpoint ------------------------------------------------------------------


def _is_step_dir(path: str) -> bool:
  return os.path.isfile(os.path.join(path, "actor", "_METADATA"))


def resolve_checkpoint(path: str) -> Source:
  """What `path` holds: an HF export, an Orbax step directory, or a `checkpoints`
  directory (its latest complete step); CheckpointProblem otherwise."""
  if not os.path.exists(path):
    raise CheckpointProblem(f"--checkpoint={path}: no such directory")
  if not os.path.isdir(path):
    raise CheckpointProblem(f"--checkpoint={path}: not a directory")
  if os.path.isfile(os.path.join(path, "config.json")):
    return Source("hf", path)
  from rollx.models import lora
  if os.path.isfile(os.path.join(path, lora.PEFT_CONFIG)):
    return Source("peft", path)
  if _is_step_dir(path):
    name = os.path.basename(os.path.normpath(path))
    if not name.isdigit():
      raise CheckpointProblem(f"--checkpoint={path}: an Orbax step directory is named by "
                              f"its step (<output_dir>/checkpoints/<step>)")
    return Source("orbax", path, int(name))
  steps = [int(n) for n in os.listdir(path)
           if n.isdigit() and _is_step_dir(os.path.join(path, n))]
  if steps:  # Orbax commits a step by renaming it into place: a digit name is complete
    return Source("orbax", os.path.join(path, str(max(steps))), max(steps))
  raise CheckpointProblem(
      f"--checkpoint={path}: neither an Orbax step directory (<output_dir>/checkpoints/"
      f"<step>, with actor/), a Hugging Face export (with config.json) nor a PEFT adapter "
      f"directory (with adapter_config.json)")


def expected_params(config: ml_collections.ConfigDict):
  """ShapeDtypeStructs of the policy params of the config's model (nothing computed)."""
  import jax
  import jax.numpy as jnp
  from rollx import models
  from rollx.models import hf, llm
  model = llm.make_model(hf.load_model_config(models.resolve_model_dir(config.pretrain)))
  return jax.eval_shape(lambda key: llm.init_params(model, key),
                        jax.ShapeDtypeStruct((2,), jnp.uint32))


def restore_params(source: Source, config: ml_collections.ConfigDict):
  """The actor's params (numpy) of an Orbax step directory, after checking that their
  names and shapes are those of the config's model; with the config's LoRA on, its
  adapters (`lora.AdapterWeights`)."""
  import jax
  from rollx import checkpoint
  from rollx.models import lora
  like = expected_params(config)
  adapters = lora.from_config(config.actor_train.model_args.lora)
  if adapters is not None:
    like = jax.eval_shape(lambda: lora.init_adapters(like, adapters, jax.random.PRNGKey(0)))
  model = config.pretrain or "the built-in default model"
  if adapters is not None:
    model += f" with actor_train.model_args.lora rank {adapters.rank}"
  try:
    saved = checkpoint.params_metadata(source.path)
  except Exception as e:  # noqa: BLE001 - whatever Orbax makes of a broken directory
    raise CheckpointProblem(f"--checkpoint={source.path}: cannot read its actor params "
                            f"({type(e).__name__}: {_one_line(e)})") from None
  problem = checkpoint.shape_mismatch(saved, like)
  if problem:
    raise CheckpointProblem(f"--checkpoint={source.path}: {problem}, not the shapes of the "
                            f"config's model ({model}); pass its config / --config.pretrain")
  try:
    params = checkpoint.restore_params(source.path, like)
  except Exception as e:  # noqa: BLE001
    raise CheckpointProblem(f"--checkpoint={source.path}: cannot restore its actor params "
                            f"({type(e).__name__}: {_one_line(e)})") from None
  return params if adapters is None else lora.AdapterWeights(params, adapters.scale)


def load_adapters(source: Source, config: ml_collections.ConfigDict):
  """A PEFT adapter directory's adapters for the config's model."""
  from rollx import models
  from rollx.models import hf, lora
  cfg = hf.load_model_config(models.resolve_model_dir(config.pretrain))
  try:
    adapters, settings = lora.load_peft(source.path, cfg)
  except ValueError as e:  # CheckpointError, or shapes that are not this model's
    raise CheckpointProblem(f"--checkpoint={source.path}: {_one_line(e)} (its base must be "
                            f"the config's model, {config.pretrain or 'the built-in default'})"
                            ) from None
  return lora.AdapterWeights(adapters, settings.scale)


def _one_line(e: Exception) -> str:
  return " ".join(str(e).split())[:300]


# -- the run ---------------------------------------------------------------------------


def eval_config(config: ml_collections.ConfigDict, levels: int, samples: int, k: int
                ) -> ml_collections.ConfigDict:
  """The config the evaluation runs: `levels` validation groups of `samples` envs, one
  level per group (generation 0); with k > 1 the training sampling for validation."""
  c = ml_collections.ConfigDict(config.to_dict())
  vm = c.val_env_manager
  part = vm.num_groups_partition
  if part is not None and sum(part) != levels:
    total = sum(part)
    if levels % total:
      cli.fail(f"--episodes={levels}: val_env_manager.num_groups_partition={tuple(part)} "
               f"splits {total} levels over the tags; pass a multiple of {total}")
    vm.num_groups_partition = tuple(int(p) * (levels // total) for p in part)
  vm.num_env_groups = levels
  vm.group_size = samples
  vm.group_size_redundancy = 0
  vm.group_filter_ratio = 1.0
  if k > 1:
    c.actor_infer.val_generating_args = ml_collections.ConfigDict(
        c.actor_infer.generating_args.to_dict())
  return c


def sampling_text(g) -> str:
  if float(g.temperature) <= 0:
    return "greedy"
  return f"temperature={g.temperature} top_p={g.top_p} top_k={g.top_k}"


def play(config: ml_collections.ConfigDict, params, version: int, episodes: int):
  """`episodes` validation episodes on fresh servers (in the running Ray) with `params`
  pushed as policy `version`, or pretrain's as version 0 (params None); the
  trajectories, in level order."""
  from rollx import cluster
  from rollx.serving.client import RolloutClient
  servers, rollout = None, None
  try:
    servers = cluster.start_servers(config)
    if params is not None:
      RolloutClient(servers.addresses, weight_targets=[servers]).update_params(params, version)
    rollout = cluster.start_rollout(config, "val_env_manager", servers.addresses, stream="val")
    rollout.set_version(version if params is not None else 0)
    batch, _ = rollout.get_batch(episodes)
  finally:
    if rollout is not None:
      rollout.stop()
    cluster.stop_servers(servers)
  return sorted(batch.trajectories,
                key=lambda t: (t.ticket.tag, t.ticket.group_id, t.ticket.env_id))


def report(trajectories: Sequence, k: int) -> List[str]:
  """One line per env tag (and `all` over several tags): success with its Wilson 95%
  interval over levels, mean score, invalid-action rate, pass@k."""
  from rollx.rollout.scheduler import episode_metrics
  by_tag: Dict[str, list] = {}
  for t in trajectories:
    by_tag.setdefault(t.ticket.tag, []).append(t)
  groups = dict(sorted(by_tag.items()))
  if len(groups) > 1:
    groups["all"] = list(trajectories)
  lines = []
  for tag, ts in groups.items():
    m = {key.split("/", 1)[1]: v for key, v in episode_metrics(
        [dataclasses.replace(t, ticket=dataclasses.replace(t.ticket, tag=tag)) for t in ts]
    ).items()}
    per_level: Dict[tuple, List[bool]] = {}
    for t in ts:
      per_level.setdefault((t.ticket.tag, t.ticket.group_id), []).append(bool(t.success))
    levels = len(per_level)
    level_rate = np.mean([np.mean(v) for v in per_level.values()])
    low, high = wilson_interval(level_rate * levels, levels)
    pass_k = np.mean([pass_at_k(len(v), sum(v), k) for v in per_level.values()])
    lines.append(f"{tag}: episodes={len(ts)} levels={levels} success={m['success']:.3f} "
                 f"ci95=[{low:.3f},{high:.3f}] score_mean={m['score_mean']:.3f} "
                 f"invalid_action_rate={m['invalid_action_rate']:.3f} pass@{k}={pass_k:.3f}")
  return lines


def episode_record(t, tokenizer, samples_per_level: int) -> dict:
  """One JSONL line: the episode, its transcript and its samples' token ids."""
  turns = [{"turn": r["turn"], "response": r["response"], "action": r["action"],
            "reward": float(r["reward"]), "valid": bool(r["valid"]),
            "observation": r["observation"] if isinstance(r["observation"], str) else
            str(r["observation"])} for r in t.transcript]
  samples = [{"text": tokenizer.decode(s.input_ids), "token_ids": list(map(int, s.input_ids)),
              "response_mask": list(map(int, s.response_mask)), "reward": float(s.reward)}
             for s in t.samples]
  return {"tag": t.ticket.tag, "level": t.ticket.group_id, "seed": t.ticket.seed,
          # envs are laid out group-major (rollx.rollout.scheduler.env_layout)
          "sample": t.ticket.env_id - t.ticket.group_id * samples_per_level,
          "score": float(t.score), "success": bool(t.success), "finish": t.finish,
          "num_turns": t.num_turns, "num_invalid_actions": t.num_invalid_actions,
          "transcript": turns, "samples": samples}


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}")
  config = cli.load_config()
  if not _CHECKPOINT.value:
    cli.fail("--checkpoint is required: an Orbax step directory "
             "(<output_dir>/checkpoints/<step>) or a Hugging Face export (<output_dir>/export)")
  k = _K.value
  samples = _SAMPLES.value if _SAMPLES.value is not None else k
  levels = _EPISODES.value if _EPISODES.value is not None else int(config.val_batch_size)
  if k < 1:
    cli.fail(f"--k={k}: must be >= 1")
  if samples < k:
    cli.fail(f"--samples={samples}: pass@{k} needs at least k={k} samples per level")
  if levels < 1:
    cli.fail(f"--episodes={levels}: must be >= 1")
  try:
    source = resolve_checkpoint(_CHECKPOINT.value)
    if source.kind == "orbax":  # the model directory its run started from
      from rollx.recipes import warm_start  # JAX's modules after jax_platforms is chosen
      warm_start.prepare(config, build_missing=False)
    if source.kind == "hf":
      config.pretrain = os.path.abspath(source.path)
      from rollx.models import hf
      hf.load_model_config(config.pretrain)
      hf.load_tokenizer(config.pretrain)
      checks.validate(config)
  except CheckpointProblem as e:
    cli.fail(str(e))
  except Exception as e:  # noqa: BLE001 - hf.CheckpointError, ConfigError: one line
    cli.fail(f"--checkpoint={_CHECKPOINT.value}: {_one_line(e)}")
  cli.quiet_console()
  run_config = eval_config(config, levels, samples, k)
  from rollx import cluster
  import jax
  jax.config.update("jax_platforms", "cpu")  # the servers own the accelerator; this process reads files
  owned = cluster.init_ray(config)  # before JAX starts its threads: Ray forks its daemons
  try:
    params = None
    if source.kind in ("orbax", "peft"):
      try:
        params = (restore_params if source.kind == "orbax" else load_adapters)(source, config)
      except CheckpointProblem as e:
        cli.fail(str(e))
    sampling = run_config.actor_infer.val_generating_args
    print(f"rollx.eval: checkpoint={_CHECKPOINT.value} ({source.describe()}) "
          f"levels={levels} samples={samples} sampling={sampling_text(sampling)} "
          f"({'actor_infer.generating_args' if k > 1 else 'val_generating_args'}) "
          f"seed={config.seed}", flush=True)
    trajectories = play(run_config, params, source.step, levels * samples)
  finally:
    cluster.shutdown_ray(owned)
  for line in report(trajectories, k):
    print(line, flush=True)
  if _OUT.value:
    from rollx import models
    from rollx.models import hf
    tokenizer = hf.load_tokenizer(models.resolve_model_dir(run_config.pretrain))
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w") as f:
      for t in trajectories:
        f.write(json.dumps(episode_record(t, tokenizer, samples)) + "\n")


if __name__ == "__main__":
  hostmem.reexec_with_tuned_malloc()  # as rollx.train: the servers inherit it through Ray
  app.run(main, flags_parser=cli.parse_flags)
