"""The rollout server: rollx's generate loop, JetStream's gRPC protocol, real processes and Ray actors."""

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rollx import config as config_lib
from rollx.models import llm
from rollx.serving.client import InvalidRequestError, NoServerAliveError, RolloutClient
from rollx.serving.engine import RollxEngine, Sampling
from rollx.serving.slot_ops import sample_tokens
from rollx.serving.batching import GenerateLoop
from rollx.serving import REQUEST_ID_KEY
from rollx.serving import server as server_lib
from rollx.serving.server import RolloutServer
from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc
from tests.conftest import ROOT
from tests.ray_utils import start_local_ray

# Greedy server decode vs. the single-row decode must agree token for token: full fp32
# matmuls (a GPU's default TF32 flips near-ties between the batched and single paths).
jax.config.update("jax_default_matmul_precision", "highest")

CFG = llm.ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)
MODEL = llm.make_model(CFG)


def make_params(seed):
  # Scaled up so that greedy outputs vary from token to token.
  return jax.tree.map(lambda x: 5 * x, llm.init_params(MODEL, jax.random.PRNGKey(seed)))


@pytest.fixture(scope="module")
def server():
  engine = RollxEngine(MODEL, make_params(0), max_concurrent_decodes=16, max_prefill_length=64,
                       max_cache_length=1024, sampling={"train": Sampling(1.0),
                                                        "val": Sampling(0.0)})
  # Compiled ahead (the tests' prompts fall in bucket 64): the greedy check below then
  # also shows that warmup leaves the serving decode state alone.
  engine.warmup((64,))
  srv = RolloutServer(engine)
  yield srv
  srv.stop()


def run(coro):
  return asyncio.run(coro)


def prompts(n, seed=0, lo=2, hi=60, lengths=None):
  """n random prompts, lengths in [lo, hi) or drawn from `lengths` (few lengths: the
  reference decode compiles once per length)."""
  rng = np.random.default_rng(seed)
  return [[int(t) for t in rng.integers(0, CFG.vocab_size,
                                        rng.choice(lengths) if lengths else rng.integers(lo, hi))]
          for _ in range(n)]


def test_greedy_equals_model_decode_with_64_concurrent_requests(server):
  measured = prompts(32, seed=1, lengths=(5, 23, 41, 59))  # four buckets' worth of lengths
  others = prompts(32, seed=2)

  async def go():
    client = RolloutClient([server.address])
    jobs = [client.generate(f"m{i}", p, 24, mode="val") for i, p in enumerate(measured)]
    jobs += [client.generate(f"o{i}", p, 40, mode="train") for i, p in enumerate(others)]
    results = await asyncio.gather(*jobs)
    await client.close()
    return results

  results = run(go())
  stats = server.stats()
  assert stats["sampled_tokens"] >= 32 * 24 + 32 * 40  # kept server-side for metrics
  assert stats["sampled_logprob_mean"] < 0
  params = server.engine.params_holder.get()[1]
  for prompt, gen in zip(measured, results[:32]):
    assert gen.token_ids == llm.greedy_generate(MODEL, params, prompt, 24)
    assert gen.policy_version == 0 and gen.token_versions == [0] * 24
  assert all(len(g.token_ids) == 40 for g in results[32:])


def test_update_params_switches_weights_and_health_never_drops(server):
  prompt = prompts(1, seed=3)[0]
  health_failures, health_calls, stop = [], [0], threading.Event()

  def poll():
    stub = jetstream_pb2_grpc.OrchestratorStub(grpc.insecure_channel(server.address))
    while not stop.is_set():
      try:
        if not stub.HealthCheck(jetstream_pb2.HealthCheckRequest(), timeout=5).is_live:
          health_failures.append("not live")
      except grpc.RpcError as e:
        health_failures.append(e.code())
      health_calls[0] += 1

  poller = threading.Thread(target=poll)
  poller.start()
  try:
    for version in (1, 2, 3):
      new = make_params(version)
      server.update_params(new, version)
      gen = run(RolloutClient([server.address]).generate("u", prompt, 16, mode="val"))
      assert gen.token_ids == llm.greedy_generate(MODEL, new, prompt, 16)
      assert gen.policy_version == version and set(gen.token_versions) == {version}
  finally:
    stop.set()
    poller.join()
  assert health_calls[0] > 0 and not health_failures


async def _drain(call):
  return [response async for response in call]


def test_abort_in_flight_at_weight_sync(server, monkeypatch):
  prompt = prompts(1, seed=4, lo=5, hi=6)[0]
  stub_request = jetstream_pb2.DecodeRequest(
      token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=prompt), max_tokens=1000)
  # Hold the (real) generate loop while the weights change, so that the request is
  # certainly still running when the sync happens.
  running = threading.Event()
  running.set()
  generate = server.engine.generate

  def gated_generate(params, state):
    running.wait()
    return generate(params, state)

  monkeypatch.setattr(server.engine, "generate", gated_generate)

  def generating():
    """The request in flight has made at least one token (the server sends the
    response in one message at the end, so the stream cannot tell)."""
    live = server.generate_loop.requests()
    return (len(live) == 1 and live[0].first_step is not None
            and server.engine.num_steps > live[0].first_step)

  async def go():
    async with grpc.aio.insecure_channel(server.address) as channel:
      call = jetstream_pb2_grpc.OrchestratorStub(channel).Decode(stub_request)
      responses = asyncio.ensure_future(_drain(call))
      while not generating():
        await asyncio.sleep(0.001)
      running.clear()
      assert server.update_params(make_params(7), 7, abort_in_flight=True) == 1
      running.set()
      return await responses

  with pytest.raises(grpc.aio.AioRpcError) as e:
    run(go())
  assert e.value.code() == grpc.StatusCode.ABORTED
  # The RolloutClient resubmits an aborted request; the retry runs on the new weights.
  async def via_client():
    client = RolloutClient([server.address])
    task = asyncio.ensure_future(client.generate("inflight", prompt, 1000, mode="val"))
    while not generating():
      await asyncio.sleep(0.001)
    running.clear()
    assert server.update_params(make_params(8), 8, abort_in_flight=True) == 1
    running.set()
    return await task, client.num_retries

  gen, retries = run(via_client())
  assert retries == 1 and gen.policy_version == 8 and set(gen.token_versions) == {8}
  assert len(gen.token_ids) == 1000


@pytest.mark.parametrize("ids,max_tokens,metadata,match", [
    ([], 4, (), "token_ids is empty"),
    ([1, 2, 96], 4, (), r"token_ids\[2\]=96 is outside the vocabulary"),
    ([1, -3], 4, (), r"token_ids\[1\]=-3"),
    (list(range(65)), 4, (), "max_prefill_length is 64"),
    ([1, 2], 1023, (), "max_cache_length=1024"),
    ([1, 2], 0, (), "max_tokens=0"),
    ([1, 2], 4, (("rollx-sampling", "beam"),), "rollx-sampling='beam'"),
])
def test_malformed_requests_get_invalid_argument_and_server_keeps_serving(
    server, ids, max_tokens, metadata, match):
  stub = jetstream_pb2_grpc.OrchestratorStub(grpc.insecure_channel(server.address))
  request = jetstream_pb2.DecodeRequest(
      token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=ids), max_tokens=max_tokens)
  with pytest.raises(grpc.RpcError) as e:
    list(stub.Decode(request, metadata=metadata))
  assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  assert __import__("re").search(match, e.value.details()), e.value.details()
  with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
    run(RolloutClient([server.address]).generate("bad", [999], 4))
  assert len(run(RolloutClient([server.address]).generate("ok", [1, 2, 3], 4)).token_ids) == 4
  assert server.generate_loop.alive


def test_plain_jetstream_stub_gets_token_ids(server):
  stub = jetstream_pb2_grpc.OrchestratorStub(grpc.insecure_channel(server.address))
  request = jetstream_pb2.DecodeRequest(
      token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=[5, 6, 7]), max_tokens=6)
  tokens = [t for r in stub.Decode(request) for t in r.stream_content.samples[0].token_ids]
  assert len(tokens) == 6 and all(0 <= t < CFG.vocab_size for t in tokens)
  assert stub.HealthCheck(jetstream_pb2.HealthCheckRequest()).is_live


def test_a_request_ends_on_the_step_of_its_last_token(server):
  """The loop reads a step's tokens while the next step runs (depth 1) and ends a request
  at its last token: a lone 6-token request costs 6 + 1 generate steps (JetStream 0.2.2's
  orchestrator took 9 at its narrowest backlog, 16 at its default): an agentic turn's
  latency."""
  assert server.generate_loop.depth == 1
  deadline = time.time() + 30
  while server.generate_loop.requests() and time.time() < deadline:  # earlier tests' requests
    time.sleep(0.01)
  for i in range(5):
    before = server.engine.num_steps
    gen = run(RolloutClient([server.address]).generate(f"d{i}", [5, 6, 7], 6))
    assert len(gen.token_ids) == 6
    assert server.engine.num_steps - before == 6 + 1
  with pytest.raises(ValueError, match="depth"):
    GenerateLoop(server.engine, lambda ended: None, depth=-1)


def test_depth_0_reads_every_step_before_the_next():
  engine = RollxEngine(MODEL, make_params(0), max_concurrent_decodes=4, max_prefill_length=16,
                       max_cache_length=64, sampling={"train": Sampling(0.0), "val": Sampling(0.0)})
  srv = RolloutServer(engine, detokenize_depth=0)
  try:
    gen = run(RolloutClient([srv.address]).generate("z", [3, 1, 4, 1, 5], 6))
  finally:
    srv.stop()
  assert gen.token_ids == llm.greedy_generate(MODEL, make_params(0), [3, 1, 4, 1, 5], 6)
  assert engine.num_steps == 6


def test_decode_reads_the_smallest_cache_bucket_holding_the_busy_slots():
  engine = RollxEngine(MODEL, make_params(0), max_concurrent_decodes=2, max_prefill_length=128,
                       max_cache_length=1024, sampling={"train": Sampling(0.0), "val": Sampling(0.0)})
  reads = []
  decode = engine._generate
  engine._generate = lambda *a, read_len: (reads.append(read_len), decode(*a, read_len=read_len))[1]
  srv = RolloutServer(engine, detokenize_depth=0)
  crossing, short = prompts(1, seed=7, lengths=(110,))[0], [3, 1, 4, 1, 5]
  try:
    async def go():
      client = RolloutClient([srv.address])
      # 110 prompt ids + 40 tokens: its positions cross from the 128 bucket into 256
      out = await asyncio.gather(client.generate("x", crossing, 40),
                                 client.generate("y", short, 12))
      # a long request cancelled mid-way (positions up to ~600) no longer counts
      long = asyncio.ensure_future(client.generate("long", short, 900))
      while not reads or reads[-1] < 512:
        await asyncio.sleep(0.001)
      long.cancel()
      steps = len(reads)
      after = await asyncio.wait_for(client.generate("after", short, 6), 60)
      await client.close()
      return out, after, steps
    (gen_x, gen_y), after, steps = run(go())
  finally:
    srv.stop()
  params = make_params(0)
  assert gen_x.token_ids == llm.greedy_generate(MODEL, params, crossing, 40)
  assert gen_y.token_ids == llm.greedy_generate(MODEL, params, short, 12)
  assert after.token_ids == llm.greedy_generate(MODEL, params, short, 6)
  assert reads[:18] == [128] * 18 and 256 in reads[:40] and 1024 not in reads[:40]
  assert 512 in reads[40:steps] and reads[-6:] == [128] * 6


def test_a_continuation_reads_its_whole_cached_prefix_past_the_smallest_bucket():
  engine = RollxEngine(MODEL, make_params(0), max_concurrent_decodes=2, max_prefill_length=256,
                       max_cache_length=1024, sampling={"train": Sampling(0.0), "val": Sampling(0.0)})
  srv = RolloutServer(engine)
  first = prompts(1, seed=8, lengths=(150,))[0]  # a cached prefix longer than the 128 bucket
  try:
    async def go():
      client = RolloutClient([srv.address])
      one = await client.generate("t1", first, 8, trajectory_id="c")
      ids = first + one.token_ids + [3, 1, 4, 1, 5]
      two = await client.generate("t2", ids, 8, trajectory_id="c")
      await client.close()
      return ids, two
    ids, two = run(go())
  finally:
    srv.stop()
  assert srv.stats()["reused_tokens"] >= 158  # turn 2 continued from turn 1's keys/values
  assert two.token_ids == llm.greedy_generate(MODEL, make_params(0), ids, 8)


def test_a_cancelled_request_frees_its_slot():
  engine = RollxEngine(MODEL, make_params(0), max_concurrent_decodes=1, max_prefill_length=16,
                       max_cache_length=1024)
  srv = RolloutServer(engine)
  try:
    async def go():
      client = RolloutClient([srv.address])
      long = asyncio.ensure_future(client.generate("long", [1, 2, 3], 1000))
      while engine.num_steps < 3:
        await asyncio.sleep(0.001)
      long.cancel()  # the RPC ends: the server frees the one slot at its next step
      short = await asyncio.wait_for(client.generate("short", [4, 5], 4), 60)
      await client.close()
      return short
    assert len(run(go()).token_ids) == 4
    deadline = time.time() + 10
    while srv.generate_loop.requests() and time.time() < deadline:
      time.sleep(0.01)
    assert not srv.generate_loop.requests() and engine.num_steps < 500
  finally:
    srv.stop()


@pytest.mark.parametrize("channel_close", ["with_grace", "at_once"])
def test_a_failed_call_leaves_the_other_calls_on_its_channel_running(monkeypatch,
                                                                     channel_close):
  # A call that fails with a server-failure code makes the client drop that server's
  # channel; closed at once, the calls still on it were cancelled, and their callers (env
  # loops) saw asyncio.CancelledError and ended. The client closes it with a grace period
  # (with_grace), and retries a call cancelled under it (at_once: a channel closed at
  # once all the same). The failure is injected into the real server's Decode for one
  # request id.
  if channel_close == "at_once":
    def drop_channel(self, s):
      asyncio.ensure_future(s.channel.close())
      s.channel = s.stub = None
    monkeypatch.setattr(RolloutClient, "_drop_channel", drop_channel)
  original = server_lib.RollxOrchestrator.Decode

  async def decode(self, request, context):
    if dict(context.invocation_metadata()).get(REQUEST_ID_KEY) == "fails":
      await context.abort(grpc.StatusCode.UNAVAILABLE, "injected failure")
    async for response in original(self, request, context):
      yield response

  monkeypatch.setattr(server_lib.RollxOrchestrator, "Decode", decode)
  engine = RollxEngine(MODEL, make_params(0), max_concurrent_decodes=8, max_prefill_length=16,
                       max_cache_length=1024)
  srv = RolloutServer(engine)
  try:
    async def go():
      # (the failed call marks the one server dead: a retry waits for its health check)
      client = RolloutClient([srv.address], restart_timeout_s=30)
      running = [asyncio.ensure_future(client.generate(f"long{i}", [1, 2, 3 + i], 400))
                 for i in range(3)]
      while engine.num_steps < 3:
        await asyncio.sleep(0.001)
      with pytest.raises(NoServerAliveError, match="injected failure"):
        await client.generate("fails", [4, 5], 4)
      return await asyncio.gather(*running)

    generations = run(go())
    assert [len(g.token_ids) for g in generations] == [400] * 3
    assert all(g.server == srv.address for g in generations)
  finally:
    srv.stop()


def test_a_generate_loop_that_dies_fails_its_requests_and_health(monkeypatch):
  """A crash in the loop ends its requests with UNAVAILABLE (clients fail over to
  another server) and HealthCheck says not live, instead of requests waiting forever."""
  engine = RollxEngine(MODEL, make_params(0), max_concurrent_decodes=4, max_prefill_length=16,
                       max_cache_length=64)
  real = engine.generate

  def failing(params, state):
    if engine.num_steps >= 2:
      raise RuntimeError("device lost")
    return real(params, state)

  monkeypatch.setattr(engine, "generate", failing)
  srv = RolloutServer(engine)
  stub = jetstream_pb2_grpc.OrchestratorStub(grpc.insecure_channel(srv.address))
  try:
    request = jetstream_pb2.DecodeRequest(
        token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=[1, 2, 3]), max_tokens=8)
    with pytest.raises(grpc.RpcError) as e:
      list(stub.Decode(request, timeout=60))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "device lost" in e.value.details()
    assert not stub.HealthCheck(jetstream_pb2.HealthCheckRequest()).is_live
    with pytest.raises(grpc.RpcError) as e:  # and a new request is refused at once
      list(stub.Decode(request, timeout=60))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
  finally:
    srv.stop()


def test_stop_token_is_returned_and_ends_the_request():
  params = make_params(0)
  prompt = [3, 1, 4, 1, 5]
  greedy = llm.greedy_generate(MODEL, params, prompt, 12)
  stop = greedy[4]
  engine = RollxEngine(MODEL, params, max_concurrent_decodes=4, max_prefill_length=16,
                       max_cache_length=64, stop_token_ids=[stop])
  srv = RolloutServer(engine)
  try:
    gen = run(RolloutClient([srv.address]).generate("s", prompt, 12, mode="val"))
  finally:
    srv.stop()
  assert gen.token_ids == greedy[:greedy.index(stop) + 1]


def test_sampling_respects_top_k_top_p_and_greedy():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 4000))
  n = logits.shape[0]
  ones = jnp.ones(n)
  # the behaviour log-prob is of the distribution sampled from: top-k 2 renormalises
  keys = lambda k: jax.random.split(jax.random.PRNGKey(k), n)  # one per row
  tok, logp = sample_tokens(logits, ones, ones, jnp.full(n, 2, jnp.int32), keys(0))
  assert set(np.unique(tok)) == {0, 1}
  np.testing.assert_allclose(np.asarray(logp), np.log([0.5 / 0.8, 0.3 / 0.8])[np.asarray(tok)],
                             rtol=1e-6)
  tok, _ = sample_tokens(logits, ones, jnp.full(n, 0.7), jnp.zeros(n, jnp.int32),
                         keys(1))
  assert set(np.unique(tok)) == {0, 1}  # 0.5 + 0.3 >= 0.7
  tok, logp = sample_tokens(logits, ones, ones, jnp.zeros(n, jnp.int32), keys(2))
  assert abs(float(jnp.mean(tok == 0)) - 0.5) < 0.03 and set(np.unique(tok)) == {0, 1, 2, 3}
  np.testing.assert_allclose(np.asarray(logp), np.log([0.5, 0.3, 0.15, 0.05])[np.asarray(tok)],
                             rtol=1e-6)
  # temperature 0.5: softmax(logits / 0.5) = p^2 / sum p^2
  hot = np.array([0.5, 0.3, 0.15, 0.05]) ** 2
  tok, logp = sample_tokens(logits, jnp.full(n, 0.5), ones, jnp.zeros(n, jnp.int32),
                            keys(4))
  np.testing.assert_allclose(np.asarray(logp), np.log(hot / hot.sum())[np.asarray(tok)], rtol=1e-5)
  tok, logp = sample_tokens(logits, jnp.zeros(n), ones, jnp.zeros(n, jnp.int32),
                            keys(3))
  assert set(np.unique(tok)) == {0} and not np.asarray(logp).any()  # greedy: a point mass


def test_a_requests_samples_depend_on_its_id_not_on_its_batch(server):
  prompt = prompts(1, seed=21)[0]
  alone = run(RolloutClient([server.address]).generate("same-id", prompt, 24))

  async def crowded():
    client = RolloutClient([server.address])
    jobs = [client.generate(f"other{i}", p, 24) for i, p in enumerate(prompts(12, seed=22))]
    jobs.insert(5, client.generate("same-id", prompt, 24))
    jobs += [client.generate(f"id{i}", prompt, 24) for i in range(4)]
    out = await asyncio.gather(*jobs)
    await client.close()
    return out

  out = run(crowded())
  assert out[5].token_ids == alone.token_ids  # other requests, other steps: the same draws
  assert len({tuple(g.token_ids) for g in [alone] + out[-4:]}) > 1  # other ids, other draws


def test_no_server_alive_is_a_clear_error():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{s.getsockname()[1]}"
  client = RolloutClient([dead])
  with pytest.raises(NoServerAliveError, match=dead):
    run(client.generate("x", [1, 2], 2))


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start_serve_process(port):
  proc = subprocess.Popen(
      [sys.executable, "-m", "rollx.serve", "--config=configs/frozenlake.py", f"--port={port}",
       "--config.actor_infer.strategy_args.max_concurrent_decodes=8",
       "--config.actor_infer.strategy_args.max_prefill_length=64",
       "--config.actor_infer.strategy_args.max_cache_length=128"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  return proc


def test_killing_one_of_two_servers_mid_run_client_finishes_on_the_other():
  ports = [_free_port(), _free_port()]
  procs = [_start_serve_process(p) for p in ports]
  try:
    for proc in procs:
      deadline = time.time() + 180
      line = ""
      while "serving on" not in line and time.time() < deadline:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "server process exited"
      assert "serving on" in line
    addresses = [f"127.0.0.1:{p}" for p in ports]
    done, killed = [], []

    async def go():
      client = RolloutClient(addresses)
      gate = asyncio.Semaphore(6)

      async def one(i):
        async with gate:
          gen = await client.generate(f"r{i}", [1 + i % 50, 2, 3, 4], 16, trajectory_id=f"t{i}")
          done.append(gen)
          if len(done) == 8 and not killed:
            procs[0].send_signal(signal.SIGKILL)
            killed.append(time.time())
      await asyncio.gather(*(one(i) for i in range(48)))
      return client

    client = run(go())
    assert killed and len(done) == 48 and all(len(g.token_ids) >= 1 for g in done)
    assert client.alive_servers == [addresses[1]]
    assert {g.server for g in done[:8]} <= set(addresses)
    assert all(g.server == addresses[1] for g in done[12:])
  finally:
    for proc in procs:
      proc.kill()
      proc.wait()


def test_ray_actor_server_and_weight_push_through_object_store():
  import ray
  from rollx import cluster, hostmem, models
  config = config_lib.default_config()
  config.actor_infer.strategy_args.update(max_concurrent_decodes=4, max_prefill_length=32,
                                          max_cache_length=64)
  start_local_ray()
  try:
    servers = cluster.start_servers(config, num_servers=1)
    client = RolloutClient(servers.addresses, weight_targets=[servers])
    first = run(client.generate("a", [1, 2, 3], 8, mode="val"))
    assert first.policy_version == 0
    params = jax.device_get(models.load_model(None).params)
    params = jax.tree.map(lambda x: x + np.float32(0.05), params)
    client.update_params(params, 5)
    second = run(client.generate("b", [1, 2, 3], 8, mode="val"))
    assert second.policy_version == 5 and servers.versions() == [5]
    # the server process switched to a server's malloc settings (rollx.hostmem)
    (actor,) = servers.actors
    assert ray.get(actor.__ray_call__.remote(
        lambda self: hostmem.server_malloc_in_use())) == hostmem.server_malloc_allowed()
  finally:
    ray.shutdown()


def test_sticky_routing_is_bounded(monkeypatch):
  from rollx.serving import client as client_lib
  monkeypatch.setattr(client_lib, "MAX_STICKY", 3)
  client = RolloutClient(["127.0.0.1:1", "127.0.0.1:2"])
  for i in range(10):
    client._pick(f"t{i}")
  assert list(client._sticky) == ["t7", "t8", "t9"]
  first = client._sticky["t8"]
  assert client._pick("t8") == first and list(client._sticky)[-1] == "t8"


def test_build_engine_takes_the_servers_attention_block():
  from rollx.serving import server as server_lib
  config = config_lib.default_config()
  config.actor_infer.model_args.attention_block = 64
  engine = server_lib.engine_from_config(config)
  assert engine.model.attention_block == 64
  assert server_lib.engine_from_config(config_lib.default_config()).model.attention_block == llm.ATTENTION_BLOCK


def test_token_versions_name_the_weights_whose_logits_sampled_each_token():
  # Weights swap before generate step 3: the token of step 3 is sampled from the logits
  # step 2 computed, under the old weights; only step 4's token comes from the new ones.
  import types
  p0 = make_params(0)
  engine = RollxEngine(MODEL, p0, max_concurrent_decodes=2, max_prefill_length=16,
                       max_cache_length=64, sampling={"train": Sampling(0.0), "val": Sampling(0.0)})
  prompt = [3, 1, 4, 1, 5]
  prefix = engine.prefill(params=engine.params_holder, true_length=len(prompt),
                          padded_tokens=np.pad(np.asarray(prompt, np.int32), (0, 11)))
  prefix.request = request = types.SimpleNamespace(sampling=Sampling(0.0))
  state = engine.insert(prefix, engine.init_decode_state(), 0)
  tokens = []
  for step in range(5):
    if step == 3:
      engine.update_params(make_params(1), 1)
    state, result = engine.generate(engine.params_holder, state)
    tokens.append(int(np.asarray(result.data)[0, 0]))
  assert engine.versions_of(request.first_step, 5) == [0, 0, 0, 0, 1]
  assert tokens[:4] == llm.greedy_generate(MODEL, p0, prompt, 4)
