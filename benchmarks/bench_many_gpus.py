"""Many GPUs on the virtual GPU: FSDP2 jobs (examples/fsdp_llama.py) run as
several processes on virtual cards, and one rank of a large job run alone;
beside them the estimators people use. Prints JSON.

    python benchmarks/bench_many_gpus.py [--out FILE] [--quick]

- dry_runs: a 1B-parameter FSDP2 job as 4 and 8 processes under torchrun on
  4 and 8 virtual H100s (backend nccl, not recorded): wall time, the host
  memory of the whole process tree at its largest (sampled every 50 ms),
  each rank's torch peaks.
- alone: one rank (0) of a Llama-7B-shaped FSDP2 job at world sizes 8, 64
  and 1024, run alone (allocscope run --world-size): time, host memory,
  the rank's peaks.
- estimates, per job and rank 0: the textbook model states (16 bytes a
  parameter, sharded: fp32 parameters, gradients and Adam's two moments),
  DeepSpeed's ZeRO-3 estimator without offload (4 x largest layer + 18
  bytes a parameter / N: deepspeed.runtime.zero.stage3
  estimate_zero3_model_states_mem_needs, computed here from its formula:
  deepspeed is not installed), torch's FSDPMemTracker under FakeTensorMode
  on the fake process group (what torchtitan's estimator runs), and the
  virtual run's peak reserved memory (torch's own, on its real caching
  allocator), each with its error against that peak.
- mesh3d (--mesh3d: this part alone): a Llama-3-8B-shaped job as torchtitan
  builds it (tests/scripts/mesh3d.py: 1F1B pipeline of 4 stages x FSDP2 x
  tensor parallel 8 with sequence parallel, micro-batches of one 8192-token
  sequence) at world sizes 64 and 1024, one rank per stage run together
  under `allocscope fit --ranks` (the others faked): wall time, host memory,
  each stage's peaks and role; beside them the textbook model states per
  rank (16 bytes a parameter of its stage, sharded over tp x dp). DeepSpeed's
  ZeRO-3 formula and FSDPMemTracker do not cover pipeline or tensor
  parallelism, and torchtitan's estimator refuses both (torchtitan is not
  installed here): none is run on this job.
- torchtitan (--torchtitan: this part alone; torchtitan installed, its
  tests/assets written by tests/scripts/torchtitan_assets.py): torchtitan's
  own train.py, unmodified, with its llama3_8b config (1F1B over 4 stages x
  FSDP2 x tensor parallel, 4 micro-batches of one 8192-token sequence, 2
  steps) at world sizes 64 (dp 8 x tp 2) and 1024 (dp 32 x tp 8), one rank
  per stage together under `allocscope fit --ranks`: wall time, host memory,
  each stage's peaks and role, the textbook model states of its stage
  (Llama-3-8B's shapes); beside it torchtitan's own dry run
  (--comm.mode fake_backend, rank 0 alone on a virtual card) and what it
  says. (torchtitan's FSDPMemTracker estimator, scripts/estimate, which
  refused TP and PP, was removed in February 2026, before 0.3.0.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from _common import emit, environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "fsdp_llama.py")


def _tree_rss(root: int) -> int:
    """Resident bytes of a process and all its descendants."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    total, todo = 0, [root]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError):
            pass
        todo += children.get(pid, [])
    return total


def _measured(cmd: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> dict:
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], _tree_rss(child.pid))

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = child.communicate()
    done.set()
    t.join()
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {child.returncode}: {err[-2000:]}")
    return {"seconds": round(time.perf_counter() - t0, 2), "max_host_rss_mib": round(peak[0] / 2**20, 1),
            "stdout": out}


def _ranks(folder: str) -> dict[int, dict]:
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            r = json.load(f)
        out[r["rank"]] = r
    return out


def dry_run(size: str, procs: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        m = _measured([sys.executable, "-m", "allocscope", "run", "--gpu", f"{procs}xH100-80GB", "--no-record", "--",
                       sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs),
                       SCRIPT, "--size", size, "--out", d])
        ranks = _ranks(d)
    m.pop("stdout")
    return {"size": size, "processes": procs, **m,
            "ranks": {r: {k: v[k] for k in ("max_memory_reserved", "max_memory_allocated")} for r, v in ranks.items()},
            "parameters": ranks[0]["parameters"], "largest_layer_parameters": ranks[0]["largest_layer_parameters"]}


def alone(size: str, world: int, rank: int = 0) -> dict:
    with tempfile.TemporaryDirectory() as d:
        m = _measured([sys.executable, "-m", "allocscope", "run", "--gpu", "H100-80GB", "--world-size", str(world),
                       "--rank", str(rank), "--no-record", "--", SCRIPT, "--size", size, "--out", d])
        r = _ranks(d)[rank]
    m.pop("stdout")
    return {"size": size, "world_size": world, "rank": rank, **m, "max_memory_reserved": r["max_memory_reserved"],
            "max_memory_allocated": r["max_memory_allocated"], "parameters": r["parameters"],
            "largest_layer_parameters": r["largest_layer_parameters"]}


def memtracker(size: str, world: int, rank: int = 0) -> dict:
    from allocscope import vgpu

    env = vgpu.environment("H100-80GB") | {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0"}
    with tempfile.TemporaryDirectory() as d:
        try:
            m = _measured([sys.executable, SCRIPT, "--size", size, "--memtracker", "--out", d], env=env)
        except RuntimeError as e:
            return {"error": str(e).splitlines()[-1][:300]}
        r = _ranks(d)[rank]
    return {"bytes": r["memtracker_peak_bytes"], "seconds": m["seconds"], "breakdown": r["memtracker_peak"]}


def _pct(estimate: int | None, real: int) -> float | None:
    return None if estimate is None else round(100.0 * (estimate - real) / real, 1)


def estimates(job: dict, world: int, real: int, tracker: dict) -> dict:
    p, largest = job["parameters"], job["largest_layer_parameters"]
    textbook = 16 * p // world
    deepspeed = 4 * largest + 18 * p // world
    out = {"virtual_peak_reserved": real,
           "textbook_model_states": {"bytes": textbook, "error_pct": _pct(textbook, real)},
           "deepspeed_zero3": {"bytes": deepspeed, "error_pct": _pct(deepspeed, real)},
           "fsdp_memtracker": tracker | ({"error_pct": _pct(tracker["bytes"], real)} if "bytes" in tracker else {})}
    return out


MESH3D = os.path.join(ROOT, "tests", "scripts", "mesh3d.py")


def mesh3d(world: int, pp: int = 4, tp: int = 8) -> dict:
    dp = world // (pp * tp)
    ranks = f"0:{world}:{world // pp}"
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out")
        os.mkdir(out)
        cmd = [sys.executable, "-m", "allocscope", "fit", "--gpu", "H100-80GB", "--world-size", str(world), "--ranks",
               ranks, "--json", "-o", os.path.join(d, "fit"), "--", MESH3D, out, str(pp), str(dp), str(tp), "llama3-8b"]
        m = _measured(cmd)
        doc, said = json.loads(m.pop("stdout")), _ranks(out)
    stages = []
    for card in sorted(doc["cards"], key=lambda c: c["rank"]):
        mine = said[card["rank"]]
        textbook = 16 * mine["stage_parameters"] // (tp * dp)
        stages.append({"rank": card["rank"], "role": card.get("role"), "verdict": card["verdict"],
                       "peak_reserved": card.get("peak_reserved_bytes"), "peak_allocated": card.get("peak_allocated_bytes"),
                       "torch_max_memory_reserved": mine["max_memory_reserved"],
                       "stage_parameters": mine["stage_parameters"],
                       "textbook_model_states": {"bytes": textbook,
                                                 "error_pct": _pct(textbook, mine["max_memory_reserved"])}})
    return {"world_size": world, "mesh": {"pp": pp, "dp": dp, "tp": tp}, "ranks": ranks, **m,
            "job": doc["jobs"][0], "stages": stages}


TORCHTITAN_8B = ["-m", "torchtitan.train", "--module", "llama3", "--config", "llama3_8b",
                 "--hf_assets_path", "./tests/assets/tokenizer", "--dataloader.dataset", "c4_test",
                 "--training.steps", "2", "--training.local_batch_size", "4", "--training.disable_cuda_graphs"]


def _llama3_8b_stage_parameters(stage: int, stages: int = 4) -> int:
    """Llama-3-8B's parameters in one of torchtitan's even pipeline stages:
    dim 4096, 32 layers (32 query and 8 key/value heads of 128, SwiGLU of
    14336), vocabulary 128256; the embedding in the first stage, the final
    norm and the output projection in the last."""
    dim, kv, hidden, vocab, layers = 4096, 1024, 14336, 128256, 32
    layer = 2 * dim * dim + 2 * dim * kv + 3 * dim * hidden + 2 * dim
    n = layers // stages * layer
    if stage == 0:
        n += vocab * dim
    if stage == stages - 1:
        n += dim + vocab * dim
    return n


def torchtitan(world: int, tp: int, pp: int = 4) -> dict:
    dp = world // (pp * tp)
    ranks = f"0:{world}:{world // pp}"
    mesh = ["--parallelism.data_parallel_shard_degree", str(dp), "--parallelism.tensor_parallel_degree", str(tp),
            "--parallelism.pipeline_parallel_degree", str(pp)]
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "scripts", "torchtitan_assets.py"), d], check=True)
        cmd = [sys.executable, "-m", "allocscope", "fit", "--gpu", "H100-80GB", "--world-size", str(world), "--ranks",
               ranks, "--json", "-o", os.path.join(d, "fit"), "--", sys.executable, *TORCHTITAN_8B, *mesh]
        m = _measured(cmd, cwd=d)
        doc = json.loads(m.pop("stdout"))
        own = _torchtitan_dry_run(d, world, mesh)
    stages = []
    for stage, card in enumerate(sorted(doc["cards"], key=lambda c: c["rank"])):
        textbook = 16 * _llama3_8b_stage_parameters(stage, pp) // (tp * dp)
        stages.append({"rank": card["rank"], "role": card.get("role"), "verdict": card["verdict"],
                       "peak_reserved": card.get("peak_reserved_bytes"),
                       "peak_allocated": card.get("peak_allocated_bytes"), "nccl": card.get("nccl_bytes"),
                       "stage_parameters": _llama3_8b_stage_parameters(stage, pp),
                       "textbook_model_states": {"bytes": textbook,
                                                 "error_pct": _pct(textbook, card.get("peak_reserved_bytes") or 0)}})
    return {"world_size": world, "mesh": {"pp": pp, "dp_shard": dp, "tp": tp}, "ranks": ranks, **m,
            "job": doc["jobs"][0], "stages": stages, "torchtitan_fake_backend_dry_run": own}


def _torchtitan_dry_run(folder: str, world: int, mesh: list[str]) -> dict:
    """torchtitan's own dry run (--comm.mode fake_backend: one process, its
    world faked), rank 0 on a virtual card: its last line of error, or the
    memory it logs."""
    from allocscope import vgpu

    env = vgpu.environment("H100-80GB") | {"NGPU": str(world), "RANK": "0", "LOCAL_RANK": "0"}
    cmd = [sys.executable, *TORCHTITAN_8B, *mesh, "--comm.mode", "fake_backend"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=folder, capture_output=True, text=True)
    said = [line for line in (r.stdout + r.stderr).splitlines() if "Error:" in line or "memory:" in line]
    return {"command": " ".join(cmd[1:]), "exit_status": r.returncode, "seconds": round(time.perf_counter() - t0, 2),
            "said": said[-1].strip()[:400] if said else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true", help="the 4-process dry run and world 8 only")
    parser.add_argument("--mesh3d", action="store_true", help="the 3-D mesh Llama-3-8B job alone")
    parser.add_argument("--torchtitan", action="store_true", help="torchtitan's train.py, Llama-3-8B, alone")
    args = parser.parse_args()
    if args.torchtitan:
        from importlib.metadata import version

        emit({"benchmark": "many_gpus_torchtitan", **environment(), "torchtitan_version": version("torchtitan"),
              "torchtitan": [torchtitan(64, tp=2), torchtitan(1024, tp=8)]}, args.out)
        return
    if args.mesh3d:
        emit({"benchmark": "many_gpus_mesh3d", **environment(), "mesh3d": [mesh3d(w) for w in (64, 1024)]}, args.out)
        return
    report: dict = {"benchmark": "many_gpus", **environment(), "dry_runs": [], "alone": [], "estimates": []}
    for procs in (4,) if args.quick else (4, 8):
        job = dry_run("1b", procs)
        report["dry_runs"].append(job)
        real = job["ranks"][0]["max_memory_reserved"]
        report["estimates"].append({"job": f"1b FSDP2, {procs} processes, rank 0",
                                    **estimates(job, procs, real, memtracker("1b", procs))})
        print(json.dumps(job), file=sys.stderr)
    for world in (8,) if args.quick else (8, 64, 1024):
        job = alone("7b", world)
        report["alone"].append(job)
        report["estimates"].append({"job": f"7b FSDP2, world {world}, rank 0 alone",
                                    **estimates(job, world, job["max_memory_reserved"], memtracker("7b", world))})
        print(json.dumps(job), file=sys.stderr)
    emit(report, args.out)


if __name__ == "__main__":
    main()
