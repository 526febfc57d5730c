"""The launch files in deploy/, as far as a machine without Kubernetes or Slurm can check them.

KubeRay (deploy/kuberay/): each file parses; the run's config (the ConfigMap) is one DigenRL
accepts; the resources each pool asks for are the ones the worker groups give (custom resources
in rayStartParams, GPUs, the accelerator type Ray derives from the nodeSelector's GPU product,
room for runtime.rollout.max_workers); the spot group's notice fits its grace period and its
preStop hook writes the notices of the workers registered on its node; autoscaler v2 and
Ray's token from the Secret in every Ray container and the job's submitter.

Slurm (deploy/slurm/): `bash -n`, then the script itself with stand-ins on PATH for scontrol,
srun (it runs the command here, as the node it names), ip, ray, python's stdin scripts and
digenrl, each recording its arguments: the head and worker `ray start` lines, each node's
resources, and the `digenrl train` line, whose config DigenRL accepts.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from digenrl.config.schema import load_config
from digenrl.runtime import cloud_notices
from digenrl.tools.cli import train_parser

ROOT = Path(__file__).resolve().parents[1]
KUBERAY = ROOT / "deploy" / "kuberay"
SBATCH = ROOT / "deploy" / "slurm" / "digenrl.sbatch"


def _docs(path: Path) -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}


@pytest.fixture(scope="module")
def kuberay():
    cluster, job = _docs(KUBERAY / "raycluster.yaml"), _docs(KUBERAY / "rayjob.yaml")
    assert set(cluster) == {"ConfigMap", "RayCluster"} and set(job) == {"RayJob"}
    cfg = load_config(tree=yaml.safe_load(cluster["ConfigMap"]["data"]["run.yaml"]))  # every key accepted
    return cluster["RayCluster"], job["RayJob"], cfg


def _groups(rc: dict) -> dict[str, dict]:
    return {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}


def _containers(rc: dict) -> list[dict]:
    pods = [rc["spec"]["headGroupSpec"]["template"]] + [g["template"] for g in rc["spec"]["workerGroupSpecs"]]
    return [c for pod in pods for c in pod["spec"]["containers"]]


def _ray_resources(group: dict) -> dict:
    raw = group["rayStartParams"].get("resources", '"{}"')
    return json.loads(json.loads(raw))  # KubeRay's double-quoted JSON string


def _accelerator(group: dict):
    """The accelerator_type Ray reports on the group's nodes, from the GPU product it selects."""
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

    product = group["template"]["spec"].get("nodeSelector", {}).get("nvidia.com/gpu.product")
    return NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(product.replace("-", " ")) if product else None


def test_the_run_is_the_default_disaggregated_layout(kuberay):
    rc, job, cfg = kuberay
    assert cfg.run.mode == "digenrl" and cfg.model.device == "cuda"
    rollout = cfg.runtime.rollout
    assert rollout.preemptible and rollout.max_workers >= rollout.workers >= 1
    args = train_parser().parse_intermixed_args(shlex.split(job["spec"]["entrypoint"])[2:])
    assert shlex.split(job["spec"]["entrypoint"])[:2] == ["digenrl", "train"]
    mounts = {m["name"]: m["mountPath"] for m in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert Path(args.config).parent == Path(mounts["run-config"])  # the ConfigMap, where the driver runs


@pytest.mark.parametrize("pool_name, group_name", [("trainer", "trainer"), ("rollout", "rollout-spot")])
def test_each_pool_asks_for_what_its_group_gives(kuberay, pool_name, group_name):
    rc, _, cfg = kuberay
    pool, group = getattr(cfg.runtime, pool_name), _groups(rc)[group_name]
    given = _ray_resources(group)
    # the custom resource names match, and each pod holds whole workers
    assert set(pool.resources) <= set(given), (pool.resources, given)
    per_pod = min(int(given[k] // v) for k, v in pool.resources.items())
    gpus = group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert per_pod == int(gpus // pool.num_gpus) >= 1
    assert _accelerator(group) == pool.accelerator  # Ray's accelerator_type on those nodes
    # no other group gives these resources: the pool lands on its own group only
    for name, other in _groups(rc).items():
        if name != group_name:
            assert not set(pool.resources) & set(_ray_resources(other))
    most = group["maxReplicas"] * per_pod
    assert most >= max(pool.workers, pool.max_workers), f"{group_name} holds {most} workers at most"


def test_the_spot_group_notices_its_workers_before_the_grace_ends(kuberay, tmp_path):
    rc, _, cfg = kuberay
    spec = _groups(rc)["rollout-spot"]["template"]["spec"]
    assert cfg.runtime.rollout.notice_s < spec["terminationGracePeriodSeconds"]
    command = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["sh", "-c"]
    hook = shlex.split(command[2])
    assert hook[:3] == ["python", "-m", "digenrl.runtime.cloud_notices"]
    assert hook[hook.index("--notices") + 1] == cfg.runtime.rollout.notices
    assert float(hook[hook.index("--text") + 1]) <= cfg.runtime.rollout.notice_s
    # the hook, run here: the notices of the workers registered on this pod's address, no others
    notices = tmp_path / "notices"
    cloud_notices.register(notices, "node-1", "rollout-3", "10.4.0.7")
    cloud_notices.register(notices, "node-1", "rollout-5", "10.4.0.7")
    cloud_notices.register(notices, "node-2", "rollout-4", "10.4.0.8")
    script = command[2].replace(cfg.runtime.rollout.notices, str(notices)).replace("python ", f"{sys.executable} ", 1)
    env = {**os.environ, "POD_IP": "10.4.0.7", "PYTHONPATH": str(ROOT)}
    subprocess.run(["sh", "-c", script], check=True, env=env, capture_output=True, timeout=120)
    assert sorted(p.name for p in notices.iterdir() if not p.name.startswith(".")) == ["rollout-3", "rollout-5"]
    assert (notices / "rollout-3").read_text() == "25"


def test_autoscaler_v2_and_rays_token_from_the_secret(kuberay):
    rc, job, _ = kuberay
    spec = rc["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    head_env = {e["name"]: e for e in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    assert head_env["RAY_enable_autoscaler_v2"]["value"] == "1"
    pods = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    assert all(p["spec"]["restartPolicy"] == "Never" for p in pods)  # v2 never reuses a pod
    secret_refs = set()
    for env in ([c["env"] for c in _containers(rc)] + [spec["autoscalerOptions"]["env"]]
                + [c["env"] for c in job["spec"]["submitterPodTemplate"]["spec"]["containers"]]):
        named = {e["name"]: e for e in env}
        assert named["RAY_AUTH_MODE"]["value"] == "token"
        ref = named["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
        secret_refs.add((ref["name"], ref["key"]))
    assert len(secret_refs) == 1  # one Secret, one key, everywhere
    # the reward server's token comes from the Secret too, never written in the file
    assert all(e["valueFrom"]["secretKeyRef"]["name"] == "digenrl-tokens"
               for c in _containers(rc) for e in c["env"] if e["name"] == "DIGENRL_REWARD_TOKEN")
    assert "token_urlsafe" not in (KUBERAY / "raycluster.yaml").read_text().split("apiVersion")[1]  # no value


# -- Slurm ------------------------------------------------------------------------------------

STAND_INS = {
    "scontrol": """#!/bin/bash
[[ "$1 $2" == "show hostnames" ]] || { echo "scontrol stand-in: $*" >&2; exit 1; }
printf '%s\\n' gpu-a gpu-b gpu-c gpu-d
""",
    # srun -w NODE [options] CMD...: runs CMD here, as NODE
    "srun": """#!/bin/bash
node=
while [[ $# -gt 0 && $1 == -* ]]; do
    case $1 in -w) node=$2; shift 2;; --nodelist=*) node=${1#*=}; shift;; *) shift;; esac
done
echo "$node $*" >> "$STAND_IN_LOG/srun"
SLURMD_NODENAME=$node exec "$@"
""",
    "ip": """#!/bin/bash
# ip -4 -o addr show dev IFACE, on node gpu-X: 10.1.0.<X's place>
case $SLURMD_NODENAME in gpu-a) n=1;; gpu-b) n=2;; gpu-c) n=3;; gpu-d) n=4;; *) n=99;; esac
echo "2: $5    inet 10.1.0.$n/16 brd 10.1.255.255 scope global $5"
""",
    "ray": """#!/bin/bash
echo "${SLURMD_NODENAME:-batch} RAY_AUTH_MODE=$RAY_AUTH_MODE RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH $(printf '%q ' "$@")" >> "$STAND_IN_LOG/ray"
""",
    "digenrl": """#!/bin/bash
printf '%s\\n' "$RAY_ADDRESS" "$@" > "$STAND_IN_LOG/digenrl"
""",
    # python with a script on stdin (the wait for every node): recorded; anything else: the real one
    "python": """#!/bin/bash
if [[ $1 == - ]]; then cat > /dev/null; echo "$*" >> "$STAND_IN_LOG/python"; exit 0; fi
exec "$REAL_PYTHON" "$@"
""",
}


def test_the_sbatch_script_parses():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)


@pytest.fixture
def slurm_run(tmp_path):
    """Run the sbatch script with the stand-ins; returns (ray lines, srun lines, digenrl argv, python lines)."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    for name, text in STAND_INS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)

    def run(*args, **env):
        full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STAND_IN_LOG": str(log),
                "REAL_PYTHON": sys.executable, "SLURM_JOB_NODELIST": "gpu-[a-d]", "SLURM_JOB_ID": "4242",
                "SLURM_JOB_NAME": "digenrl", "SLURM_GPUS_ON_NODE": "8", "SLURM_CPUS_PER_TASK": "64",
                "RUN_DIR": str(tmp_path / "run"), **env}
        done = subprocess.run(["bash", str(SBATCH), *args], cwd=ROOT, env=full, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        read = lambda name: (log / name).read_text().splitlines() if (log / name).exists() else []  # noqa: E731
        return read("ray"), read("srun"), read("digenrl"), read("python")

    return run


def test_the_sbatch_script_starts_the_head_and_workers_and_runs_digenrl_train(slurm_run, tmp_path):
    ray_lines, srun_lines, digenrl_argv, python_lines = slurm_run("model.path=/models/FLUX.1-dev", TRAINER_NODES="2")
    starts = {line.split()[0]: shlex.split(line.split(" ", 3)[3]) for line in ray_lines if " start " in line}
    assert sorted(starts) == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]  # one Ray node per Slurm node
    head = starts["gpu-a"]
    assert head[:2] == ["start", "--head"] and "--node-ip-address=10.1.0.1" in head and "--port=6379" in head
    for node, n in (("gpu-b", 2), ("gpu-c", 3), ("gpu-d", 4)):
        argv = starts[node]
        assert "--address=10.1.0.1:6379" in argv and f"--node-ip-address=10.1.0.{n}" in argv and "--block" in argv
    resources = {node: json.loads(next(a for a in argv if a.startswith("--resources="))[len("--resources="):])
                 for node, argv in starts.items()}
    assert resources == {"gpu-a": {"trainer_node": 8}, "gpu-b": {"trainer_node": 8},
                         "gpu-c": {"rollout_node": 8}, "gpu-d": {"rollout_node": 8}}
    assert all("--num-gpus=8" in argv for argv in starts.values())
    # Ray's token: a file only this user reads, named in every ray command's environment
    token = tmp_path / "run" / ".ray_token"
    assert len(token.read_text().strip()) >= 32 and (token.stat().st_mode & 0o077) == 0
    assert all(f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token}" in line for line in ray_lines)
    assert python_lines == ["- 10.1.0.1:6379 4"]  # every node in before the run
    # the run: on the head's address, its config one DigenRL accepts, its pools on those resources
    assert digenrl_argv[0] == "10.1.0.1:6379" and digenrl_argv[1] == "train"
    args = train_parser().parse_intermixed_args(digenrl_argv[2:])
    cfg = load_config(ROOT / args.config, [*args.overrides, f"run.run_dir={args.run_dir}"])
    rt = cfg.runtime
    assert rt.network_interface == "ib0" and cfg.run.mode == "digenrl"
    assert (rt.trainer.resources, rt.trainer.workers) == ({"trainer_node": 1.0}, 16)
    assert (rt.rollout.resources, rt.rollout.workers) == ({"rollout_node": 1.0}, 16)
    assert cfg.model.path == "/models/FLUX.1-dev"
    for pool, role in ((rt.trainer, "trainer_node"), (rt.rollout, "rollout_node")):
        held = sum(r.get(role, 0) for r in resources.values())
        assert pool.workers * pool.resources[role] == held  # every GPU of its nodes, no more


def test_the_sbatch_script_refuses_a_split_that_leaves_no_rollout_node(tmp_path, slurm_run):
    with pytest.raises(AssertionError, match="cannot hold TRAINER_NODES=4 trainer nodes"):
        slurm_run(TRAINER_NODES="4")
