"""The GPU check in one command: every GPU figure oelm reports, in one JSON, inside 8 minutes (244 s on an H100).

Steps, each a fresh process with its own time limit (a step that fails or runs out is recorded
with its exit status and the tail of its output, and the next step runs):

1. `tests`: the gpu-marked tests (`pytest -m gpu tests/test_gpu.py`): bf16/fp16 autocast, fused
   AdamW, CUDA-event timing, the fused QKV CUDA path.
2. `vs_reference_eager`: our baseline against the fused nanoGPT-style reference at the study's
   gpt-medium-512 shape (batch 8, seq 512, bf16, eager), with oelm-freeze's realized share of its
   FLOP saving and each arm's peak memory (benchmarks/vs_reference.py, every arm).
3. `vs_reference_compiled`: the same under torch.compile (reference, baseline, A/A, oelm-freeze).
4. `presets`: tokens/s, step time and peak memory of baseline, oelm-freeze and identity-q at
   gpt-medium-512 and at GPT-2 small's shape in both families (gpt-gpt2s, llama-gpt2s), eager bf16
   (benchmarks/presets_gpu.py; eager so that the step fits the time budget: compiled figures come
   from step 3).
5. `vocab_padding`: baseline at gpt-gpt2s and llama-gpt2s with the vocabulary padded to a
   multiple of 64 (`vocab_multiple`) against unpadded, side by side in the same rounds.

Opt-in (run only when named in `--only`, since it alone takes about 7 minutes: three compilations
per preset): `presets_compiled`, step 4 compiled at gpt-gpt2s, llama-gpt2s and llama-350m (the
H100 figures in docs/results/vs_reference/ came from it).

    python -m benchmarks.gpu_suite --out gpu-out            # writes gpu-out/gpu_suite.json (+ one log)
    python -m benchmarks.gpu_suite --out gpu-out --only tests presets

The summary JSON is rewritten after every step, so a run stopped early keeps what it measured.
Without CUDA it refuses (CPU figures are not GPU figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

PRESETS = ("gpt-medium-512", "gpt-gpt2s", "llama-gpt2s")
OPT_IN = ("presets_compiled",)  # steps run only when --only names them
METHODS = ("baseline", "oelm-freeze", "identity-q")


def steps(out: Path) -> dict[str, tuple[list[str], int, Path | None]]:
    """Each step: its command, its time limit in seconds and the JSON it writes (None: none)."""
    py = [sys.executable]
    vs = [*py, "-m", "benchmarks.vs_reference", "--device", "cuda", "--batch", "8", "--time-budget", "40"]

    def presets(name: str, limit: int, *args: str) -> tuple[list[str], int, Path]:
        """A benchmarks.presets_gpu step: 6 balanced rounds of 4 timed steps, rows in NAME.json."""
        rows = out / f"{name}.json"
        cmd = [*py, "-m", "benchmarks.presets_gpu", *args, "--rounds", "6", "--steps", "4", "--json", str(rows)]
        return cmd, limit, rows

    return {
        "tests": ([*py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py"], 100, None),
        "vs_reference_eager": (
            [*vs, "--json", str(out / "vs_reference_eager.json")],
            80,
            out / "vs_reference_eager.json",
        ),
        "vs_reference_compiled": (
            [
                *vs,
                "--compile",
                "--arms",
                "reference",
                "baseline",
                "baseline-AA",
                "oelm-freeze",
                "--json",
                str(out / "vs_reference_compiled.json"),
            ],
            130,
            out / "vs_reference_compiled.json",
        ),
        "presets": presets("presets", 100, "--no-compile", "--presets", *PRESETS, "--methods", *METHODS),
        # The LM head at GPT-2's vocabulary (50,257) ran on align-1 kernels: 41% of the step on an
        # H100. Padded (vocab_multiple 64) against unpadded, side by side in the same rounds.
        "vocab_padding": presets(
            "vocab_padding",
            70,
            "--no-compile",
            "--presets",
            "gpt-gpt2s",
            "llama-gpt2s",
            "--methods",
            "baseline",
            "--vocab-multiple",
            "1",
            "64",
        ),
        "presets_compiled": presets(
            "presets_compiled", 480, "--presets", "llama-350m", "llama-gpt2s", "gpt-gpt2s", "--methods", *METHODS
        ),
    }


def device_facts() -> dict:
    import torch

    facts = {"torch": torch.__version__, "python": platform.python_version(), "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        facts.update(
            device=p.name,
            capability=f"{p.major}.{p.minor}",
            memory_gib=round(p.total_memory / 2**30, 1),
            multiprocessors=p.multi_processor_count,
        )
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        facts["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        facts["nvidia_smi"] = f"unavailable: {e}"
    return facts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_suite", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_suite.json, the steps' JSON and the log")
    p.add_argument("--only", nargs="+", choices=list(steps(Path("."))), help="run these steps only")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        p.exit(2, "gpu_suite: no CUDA GPU here; run it on a GPU machine (CPU figures are not GPU figures)\n")
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "facts": device_facts(), "steps": {}}
    path = args.out / "gpu_suite.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(args.out / "gpu_suite.log", "a") as log:
        for name, (cmd, limit, json_out) in steps(args.out).items():
            if (args.only and name not in args.only) or (not args.only and name in OPT_IN):
                continue
            print(f"== {name} (limit {limit} s): {' '.join(cmd[1:])}", flush=True)
            log.write(f"\n== {name}: {' '.join(cmd)}\n")
            log.flush()
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
                rc, text = proc.returncode, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as e:
                rc = "timeout"
                text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
                text += (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            wall = time.perf_counter() - t0
            log.write(text)
            log.flush()
            rows = None
            if json_out is not None and json_out.exists():
                try:
                    rows = json.loads(json_out.read_text())
                except json.JSONDecodeError as e:
                    rows = f"unreadable: {e}"
            summary["steps"][name] = {"rc": rc, "wall_s": round(wall, 1), "tail": text[-3000:], "rows": rows}
            path.write_text(json.dumps(summary, indent=1, default=str))
            print(text[-1500:], flush=True)
            print(f"== {name}: rc {rc}, {wall:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
