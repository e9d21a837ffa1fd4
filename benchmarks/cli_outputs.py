"""Every command's output on the committed fixtures, one file per command,
for comparing two versions of allocscope with `diff -r` (a refactor must
leave them byte-identical).

    python benchmarks/cli_outputs.py OUT_DIR [--fit]

Runs in-process (the CLI's `main`), so the version compared is the one
`import allocscope` finds: put a checkout's python/ first on PYTHONPATH to
take it. `--fit` adds `fit` on a small script on the virtual GPU (text,
--json, --search), with the interpreter's path and the virtual card's
addresses, which differ from run to run, replaced by placeholders. Prints
one JSON line: files written, commands that exited non-zero.
"""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"

_SMALL_SCRIPT = """\
import argparse, torch
p = argparse.ArgumentParser(); p.add_argument("--batch", type=int, default=8); a = p.parse_args()
m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.Adam(m.parameters())
for _ in range(2):
    m(torch.randn(a.batch * 1024, 1024, device="cuda")).sum().backward(); opt.step(); opt.zero_grad()
"""


def _commands(fixture: pathlib.Path, out: pathlib.Path) -> dict[str, list[str]]:
    f = str(fixture)
    cuda = fixture.name.startswith("cuda") or fixture.parent.name == "races"
    commands = {
        "info.txt": ["info", f], "info.json": ["info", "--json", f],
        "dump.txt": ["dump", "--limit", "2000", f], "dump_stacks.jsonl": ["dump", "--json", "--stacks", "--limit", "2000", f],
        "report.txt": ["report", f], "report.json": ["report", "--json", f], "report_top3.txt": ["report", "--top", "3", f],
        "html.html": ["html", "--no-progress", "-f", "-o", str(out / "page.html"), f],
        "memory_viz.out": ["export", "--format", "memory-viz", "-f", "-o", str(out / "snapshot.json"), f],
        "perfetto.out": ["export", "--format", "perfetto", "-f", "-o", str(out / "trace.json"), f],
    }
    if cuda:
        commands |= {"simulate.json": ["simulate", "--json", f], "simulate.txt": ["simulate", f],
                     "suggest.json": ["simulate", "--suggest", "--json", f]}
    if "watch" in fixture.name:
        commands |= {"report_steps.txt": ["report", "--steps", "1", f]}
    return commands


def _run(argv: list[str]) -> tuple[int, str, str]:
    from allocscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
    return status, out.getvalue(), err.getvalue()


def _write(path: pathlib.Path, argv: list[str], failed: list[str], out: pathlib.Path) -> None:
    status, stdout, stderr = _run(argv)
    if status:
        failed.append(" ".join(argv))
    text = f"$ allocscope {' '.join(argv)}\n[status {status}]\n{stdout}\n[stderr]\n{stderr}"
    path.write_text(text.replace(str(out), "OUT"))  # (where the outputs went differs between the two runs)


def _fit(out: pathlib.Path, failed: list[str]) -> None:
    script = out / "small.py"
    script.write_text(_SMALL_SCRIPT)
    runs = {"fit.txt": [], "fit.json": ["--json"], "fit_search.txt": ["--search", "B=1..512"],
            "fit_search.json": ["--json", "--search", "B=1..512"]}
    for name, extra in runs.items():
        args = ["fit", "--gpu", "T4-16GB", "-o", str(out / name.replace(".", "_")), *extra, "--", sys.executable,
                str(script)]
        if "--search" in extra:
            args += ["--batch", "{B}"]
        done = subprocess.run([sys.executable, "-m", "allocscope", *args], capture_output=True, text=True,
                              cwd=out)
        if done.returncode not in (0, 1):
            failed.append(" ".join(args))
        text = f"[status {done.returncode}]\n{done.stdout}"
        text = text.replace(sys.executable, "PYTHON").replace(str(out), "OUT").replace(str(ROOT), "ROOT")
        text = re.sub(r"0x[0-9a-f]{6,}", "0xADDR", text)
        text = re.sub(r'"address": \d+', '"address": ADDR', text)
        text = re.sub(r"\b\d+\.\d+ s\b", "T s", text)  # wall times
        text = re.sub(r'"(seconds|wall_s|elapsed_s)": [0-9.]+', r'"\1": T', text)
        (out / name).write_text(text)


def main() -> int:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    fixtures = sorted(p for p in DATA.rglob("*.alsc"))
    failed: list[str] = []
    written = 0
    for fixture in fixtures:
        folder = out / str(fixture.relative_to(DATA)).replace("/", "__")
        folder.mkdir(exist_ok=True)
        for name, argv in _commands(fixture, folder).items():
            _write(folder / name, argv, failed, out)
            written += 1
    pairs = [("cuda_train_v1.alsc", "cuda_watch_v2.alsc"), ("cpu_watch_v1.alsc", "cpu_watch_v2.alsc")]
    for a, b in pairs:
        stem = f"diff__{a}__{b}"
        _write(out / f"{stem}.txt", ["diff", str(DATA / a), str(DATA / b)], failed, out)
        _write(out / f"{stem}.json", ["diff", "--json", str(DATA / a), str(DATA / b)], failed, out)
        _write(out / f"{stem}.html.out", ["diff", "--html", "-f", "-o", str(out / f"{stem}.html"), str(DATA / a),
                                          str(DATA / b)], failed, out)
        written += 3
    if "--fit" in sys.argv:
        _fit(out, failed)
        written += 4
    print(json.dumps({"out": str(out), "commands": written, "failed": failed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
