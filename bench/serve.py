"""Rollout serving throughput: the rollx JetStream server vs. transformers' batched generate.

    python bench/serve.py [--requests 256 --max-new-tokens 32 --slots 64]
    python bench/serve.py --workload rollout [--chains 128 --turns 5]
    python bench/serve.py --workload multiturn [--chains 64 --turns 10]
    python bench/serve.py --quick    # `make bench`: rollout shape, 16 chains x 2 turns, depth 1

Same model (the shipped default, or --pretrain DIR), same machine, one process:
- rollx: an in-process RolloutServer (rollx's generate loop + gRPC on loopback), all
  requests submitted at once through the RolloutClient, continuous batching over
  `--slots` KV-cache slots;
- baseline: transformers `generate` (torch CPU), greedy, left-padded batches of
  `--slots` prompts.
Prompts have mixed lengths (8..200 tokens); every request generates exactly
`--max-new-tokens` tokens (no stop ids) so both sides produce the same token count.
Prints generated tokens/s for both and the ratio, and the process's peak RSS. On a GPU it also prints the
decode-step time against the memory-bandwidth floor (params + KV bytes / bandwidth).

`--workload rollout` is the agentic shape instead (FrozenLake's): `--chains`
episodes, each `--turns` requests of a 32-token prompt and 5 new tokens, a chain
sending its next request when its previous answer is back (rollx: all chains at
once, no barrier; transformers: every chain's turn t as one batch). What sets the
rate here is the per-request path (queueing, prefill, one short answer), not the
decode step. `--depths 0,1` runs the rollx server once per `detokenize_depth` (generate
steps dispatched before a step's tokens are read), alternating `--repeats` times, and
prints the ratio of the last depth to the first.

`--workload multiturn` is a trajectory-wise conversation (ROLL's FrozenLake / Sokoban
layout): each of `--chains` conversations starts with a prompt of instructions and a
board, and every turn adds the 5-token answer and the next observation; every turn
sends the whole conversation so far. The same workload runs on two fresh servers in
this process, KV reuse across turns on and off (`reuse_kv`), for a FrozenLake shape
(128-token start, 40 tokens a turn) and a Sokoban one (200, 90): prefill tokens per
turn, generated tokens/s, wall time, and the ratio of the times (off / on).

`--workload store` is the same FrozenLake-shaped conversations, twice as many as the
server has slots (`--chains 64 --slots 32`), each env step taking `--env-ms` (20) before
the next turn: KV reuse with the prefix store (`prefix_cache_tokens`, room for every
conversation) vs the slots alone, on two fresh servers in this process: prefill tokens
per turn, generated tokens/s and the ratio of the times (slots alone / store).

`--workload longcache` is short conversations in long allocations: `--slots` requests of
32 prompt ids and `--max-new-tokens` answers at once, on servers whose `max_cache_length`
is 512 and 4096 (alternated `--repeats` times): a decode step reads the cache up to the
busy slots' positions, so the time per generated token should not depend on the
allocation (ratio 4096 / 512 ~1). For scale it also times the 4096 server reading its
whole allocation every step, as decode did before.
"""

import argparse
import asyncio
import os
import resource
import sys
import time

import jax
import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rollx import models  # noqa: E402
from rollx.serving import PREFILL_BUCKETS  # noqa: E402
from rollx.serving.client import RolloutClient  # noqa: E402
from rollx.serving.engine import RollxEngine, Sampling  # noqa: E402
from rollx.serving.read_lengths import ReadLengths  # noqa: E402
from rollx.serving.server import RolloutServer  # noqa: E402


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--pretrain", default=None)
  p.add_argument("--requests", type=int, default=256)
  p.add_argument("--max-new-tokens", type=int, default=32)
  p.add_argument("--slots", type=int, default=64)
  p.add_argument("--workload", choices=("decode", "rollout", "multiturn", "store", "longcache"),
                 default="decode")
  p.add_argument("--env-ms", type=float, default=20.0, help="store: an env step's time")
  p.add_argument("--chains", type=int, default=None, help="default 128 (rollout), 64 (multiturn)")
  p.add_argument("--turns", type=int, default=None, help="default 5 (rollout), 10 (multiturn)")
  p.add_argument("--depths", default=None,
                 help="comma-separated detokenize depths (default: 1)")
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--quick", action="store_true",
                 help="rollout workload, 16 chains x 2 turns, 16 slots, depth 1 (make bench)")
  args = p.parse_args()
  if args.quick:
    args.workload, args.chains, args.turns, args.slots, args.depths = "rollout", 16, 2, 16, "1"
  multi = args.workload in ("multiturn", "store")
  args.chains = args.chains or (64 if multi else 128)
  args.turns = args.turns or (10 if multi else 5)
  loaded = models.load_model(args.pretrain)
  if args.workload == "multiturn":
    return multiturn(loaded, args)
  if args.workload == "store":
    return store(loaded, args)
  if args.workload == "longcache":
    return longcache(loaded, args)
  rng = np.random.default_rng(0)
  vocab = loaded.config.vocab_size
  if args.workload == "rollout":
    n_new = 5
    chains = [[rng.integers(3, vocab, 32).tolist() for _ in range(args.turns)]
              for _ in range(args.chains)]
    prompts = [chain[t] for t in range(args.turns) for chain in chains]  # turn-major batches
  else:
    n_new = args.max_new_tokens
    prompts = [rng.integers(3, vocab, rng.integers(8, 201)).tolist()
               for _ in range(args.requests)]
  total = len(prompts) * n_new

  depths = [int(d) for d in (args.depths or "1").split(",")]

  def run_rollx(depth):
    """Seconds for the workload on a fresh in-process server with this detokenize depth."""
    engine = RollxEngine(loaded.model, loaded.params, max_concurrent_decodes=args.slots,
                         max_prefill_length=256, max_cache_length=256 + n_new,
                         sampling={"train": Sampling(0.0), "val": Sampling(0.0)})
    # compiles are not timed
    engine.warmup((32,) if args.workload == "rollout"
                  else PREFILL_BUCKETS[:PREFILL_BUCKETS.index(256) + 1])
    server = RolloutServer(engine, detokenize_depth=depth)

    async def serve_all(batch):
      client = RolloutClient([server.address])
      out = await asyncio.gather(*(client.generate(f"r{i}", pr, n_new)
                                   for i, pr in enumerate(batch)))
      await client.close()
      return out

    async def serve_chains():
      client = RolloutClient([server.address])

      async def chain(i, turns):
        return [await client.generate(f"c{i}t{t}", pr, n_new) for t, pr in enumerate(turns)]

      out = await asyncio.gather(*(chain(i, turns) for i, turns in enumerate(chains)))
      await client.close()
      return [r for rs in out for r in rs]

    start = time.perf_counter()
    results = asyncio.run(serve_chains() if args.workload == "rollout" else serve_all(prompts))
    seconds = time.perf_counter() - start
    assert sum(len(r.token_ids) for r in results) == total
    server.stop()
    return seconds

  times = {d: [] for d in depths}
  for _ in range(args.repeats if len(depths) > 1 else 1):
    for d in depths:
      times[d].append(run_rollx(d))
  rollx_s = min(times[depths[-1]])
  rollx_rss = peak_rss_gib()  # before transformers loads

  ref = transformers.AutoModelForCausalLM.from_pretrained(loaded.model_dir, local_files_only=True)
  ref.eval()
  ref.generation_config.eos_token_id = None
  ref.generation_config.pad_token_id = 0

  def hf_generate(batch):
    width = max(len(x) for x in batch)
    ids = torch.tensor([[0] * (width - len(x)) + x for x in batch])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch])
    with torch.no_grad():
      out = ref.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_new,
                         min_new_tokens=n_new, do_sample=False)
    return out.shape[1] - width

  hf_generate(prompts[:2])
  start = time.perf_counter()
  batch = args.chains if args.workload == "rollout" else args.slots
  made = sum(hf_generate(prompts[i:i + batch]) * len(prompts[i:i + batch])
             for i in range(0, len(prompts), batch))
  hf_s = time.perf_counter() - start
  assert made == total
  device = jax.devices()[0]
  shape = (f"{args.chains} chains x {args.turns} turns, 32-token prompts"
           if args.workload == "rollout" else f"{args.requests} requests, prompts 8..200 tokens")
  if device.platform == "gpu":
    params_bytes = sum(x.nbytes for x in jax.tree.leaves(loaded.params))
    c = loaded.config
    kv_bytes = 2 * c.num_layers * args.slots * (256 + n_new) * c.num_kv_heads * c.head_dim * 4
    bw = float(os.environ.get("ROLLX_HBM_BYTES_PER_S", 3.35e12))
    steps = total / args.slots
    print(f"decode step ~{rollx_s / steps * 1e3:.2f} ms vs bandwidth floor "
          f"{(params_bytes + kv_bytes) / bw * 1e3:.3f} ms")
  else:
    print("decode step vs memory-bandwidth floor: n/a (no GPU in this run)")
  print(f"peak RSS of this process after the rollx runs: {rollx_rss:.2f} GiB (model, "
        "server and client; bench/server_memory.py measures a config's server alone)")
  for d in depths:
    best = min(times[d])
    print(f"{device.device_kind}: {shape}, {n_new} new tokens each, {args.slots} slots, "
          f"detokenize depth {d}: rollx server {total / best:.0f} tok/s "
          f"({len(prompts) / best:.0f} requests/s), transformers generate "
          f"{total / hf_s:.0f} tok/s, ratio {hf_s / best:.2f}x")
  if len(depths) > 1:
    print(f"detokenize depth {depths[-1]} vs {depths[0]} (best of {args.repeats} each, "
          f"alternated): ratio {min(times[depths[0]]) / rollx_s:.2f}x requests/s")


def peak_rss_gib() -> float:
  """This process's peak resident memory so far (Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# (name, first prompt tokens, observation tokens per turn): trajectory-wise FrozenLake 4x4
# and Sokoban 6x6 conversations of the default tokenizer, rounded
SHAPES = (("FrozenLake", 128, 40), ("Sokoban", 200, 90))


def conversations(loaded, chains_n, turns, first, per_turn, n_new=5):
  """(starts, observations, prompt bucket) of `chains_n` random conversations of a shape."""
  rng = np.random.default_rng(0)
  vocab = loaded.config.vocab_size
  starts = [rng.integers(3, vocab, first).tolist() for _ in range(chains_n)]
  observations = [[rng.integers(3, vocab, per_turn).tolist() for _ in range(turns)]
                  for _ in range(chains_n)]
  longest = first + turns * (per_turn + n_new)
  return starts, observations, PREFILL_BUCKETS[np.searchsorted(PREFILL_BUCKETS, longest)]


def serve_conversations(loaded, starts, observations, bucket, slots, n_new=5, env_s=0.0,
                        **engine_args):
  """(seconds, prompt tokens prefilled a turn, tokens generated) of every conversation at
  once, each turn sending the whole conversation so far, on a fresh in-process server;
  `env_s` between turns (the env's step), the server told when a conversation ends."""
  engine = RollxEngine(loaded.model, loaded.params, max_concurrent_decodes=slots,
                       max_prefill_length=bucket, max_cache_length=bucket + n_new,
                       sampling={"train": Sampling(0.0), "val": Sampling(0.0)}, **engine_args)
  engine.warmup([b for b in PREFILL_BUCKETS if b <= bucket])  # compiles are not timed
  server = RolloutServer(engine)
  chains_n, turns = len(starts), len(observations[0])

  async def chain(client, i):
    ids, made = list(starts[i]), 0
    for t in range(turns):
      gen = await client.generate(f"c{i}t{t}", ids, n_new, trajectory_id=f"c{i}")
      made += len(gen.token_ids)
      ids += gen.token_ids + observations[i][t]
      if env_s:
        await asyncio.sleep(env_s)
    await client.end_trajectory(f"c{i}")
    return made

  async def all_chains():
    client = RolloutClient([server.address])
    made = await asyncio.gather(*(chain(client, i) for i in range(chains_n)))
    await client.close()
    return sum(made)

  start = time.perf_counter()
  made = asyncio.run(all_chains())
  seconds = time.perf_counter() - start
  stats = server.stats()
  server.stop()
  assert made == chains_n * turns * n_new
  return seconds, stats["prefilled_tokens"] / (chains_n * turns), made


def multiturn(loaded, args):
  """KV reuse across turns on vs off on the same conversations (see the module doc)."""
  n_new, turns, chains_n = 5, args.turns, args.chains
  device = jax.devices()[0]
  ratios = []
  for name, first, per_turn in SHAPES:
    starts, observations, bucket = conversations(loaded, chains_n, turns, first, per_turn, n_new)
    off, off_prefill, made = serve_conversations(loaded, starts, observations, bucket,
                                                 args.slots, n_new, reuse_kv=False)
    on, on_prefill, _ = serve_conversations(loaded, starts, observations, bucket, args.slots,
                                            n_new, reuse_kv=True)
    ratios.append(off / on)
    print(f"{device.device_kind}: {name} conversations, {chains_n} x {turns} turns "
          f"({first}-token start, {per_turn} tokens a turn, {n_new}-token answers), "
          f"{args.slots} slots: prefill tokens per turn {off_prefill:.0f} -> {on_prefill:.0f}, "
          f"{made / off:.0f} -> {made / on:.0f} generated tok/s, {off:.1f} s -> {on:.1f} s "
          f"per batch, ratio {off / on:.2f}x")
  print(f"peak RSS of this process: {peak_rss_gib():.2f} GiB (model, servers and client)")
  print(f"KV reuse across turns on vs off, {', '.join(n for n, _, _ in SHAPES)}: "
        f"ratio {min(ratios):.2f}x (the smaller)")


def store(loaded, args):
  """KV reuse with the prefix store vs the slots alone (see the module doc)."""
  n_new, turns, chains_n = 5, args.turns, args.chains
  slots = args.slots if args.slots < chains_n else chains_n // 2
  name, first, per_turn = SHAPES[0]
  starts, observations, bucket = conversations(loaded, chains_n, turns, first, per_turn, n_new)
  env_s = args.env_ms / 1e3
  alone, alone_prefill, made = serve_conversations(loaded, starts, observations, bucket, slots,
                                                   n_new, env_s)
  kept, kept_prefill, _ = serve_conversations(loaded, starts, observations, bucket, slots, n_new,
                                              env_s, prefix_cache_tokens=chains_n * (bucket + n_new))
  device = jax.devices()[0]
  print(f"{device.device_kind}: {name} conversations, {chains_n} x {turns} turns on {slots} "
        f"slots, env steps of {args.env_ms:.0f} ms: prefill tokens per turn {alone_prefill:.0f} "
        f"-> {kept_prefill:.0f}, {made / alone:.0f} -> {made / kept:.0f} generated tok/s, "
        f"{alone:.1f} s -> {kept:.1f} s per batch")
  print(f"prefix store vs the slots alone: ratio {alone / kept:.2f}x")


def decode_seconds(loaded, prompts, n_new, slots, cache_length, whole_allocation=False):
  """Seconds per generated token of `prompts` (all at once, greedy) on a fresh server."""
  engine = RollxEngine(loaded.model, loaded.params, max_concurrent_decodes=slots,
                       max_prefill_length=32, max_cache_length=cache_length,
                       sampling={"train": Sampling(0.0), "val": Sampling(0.0)})
  if whole_allocation:  # the decode step before it read live lengths only
    engine.read_lengths = ReadLengths(slots, cache_length, buckets=(cache_length,))
  engine.warmup((32,))  # compiles are not timed
  server = RolloutServer(engine)

  async def go():
    client = RolloutClient([server.address])
    out = await asyncio.gather(*(client.generate(f"r{i}", p, n_new)
                                 for i, p in enumerate(prompts)))
    await client.close()
    return sum(len(g.token_ids) for g in out)

  start = time.perf_counter()
  made = asyncio.run(go())
  seconds = time.perf_counter() - start
  server.stop()
  assert made == len(prompts) * n_new
  return seconds / made


def longcache(loaded, args):
  """Decode time per token, 4096- vs 512-token allocations (see the module doc)."""
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, loaded.config.vocab_size, 32).tolist() for _ in range(args.slots)]
  n_new, times = args.max_new_tokens, {512: [], 4096: [], "whole": []}
  for _ in range(args.repeats):
    for cache_length in (512, 4096):
      times[cache_length].append(decode_seconds(loaded, prompts, n_new, args.slots, cache_length))
  times["whole"].append(decode_seconds(loaded, prompts, n_new, args.slots, 4096, True))
  short, long, whole = (min(times[k]) * 1e3 for k in (512, 4096, "whole"))
  print(f"{jax.devices()[0].device_kind}: {args.slots} requests of 32 + {n_new} tokens: "
        f"{short:.2f} ms a token at max_cache_length 512, {long:.2f} ms at 4096 "
        f"({whole:.2f} ms reading the whole 4096 allocation every step)")
  print(f"decode time per token, 4096- vs 512-token allocation: ratio {long / short:.2f}x")


if __name__ == "__main__":
  main()
