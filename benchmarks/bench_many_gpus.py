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


def _measured(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true", help="the 4-process dry run and world 8 only")
    parser.add_argument("--mesh3d", action="store_true", help="the 3-D mesh Llama-3-8B job alone")
    args = parser.parse_args()
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
