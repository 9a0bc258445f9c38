#!/usr/bin/env bash
# The whole device command of the scale ladder's GPU rungs (issue 47, item 5): run it first when a
# session is lent a GPU, as one call of the device tool that carries the pack built here:
#     python scripts/gpu_ladder.py pack                                 # here, once (minutes)
#     python scripts/gpu_ladder.py plan; git commit; ... seal            # here: stored rungs' confirmations
#     run(command="bash scripts/gpu_ladder.sh", carry=["data/gpu-pack", "data/gpu-confirm"], timeout_s=540)
#     python scripts/gpu_ladder.py land <files_at>/gpu-ladder.tar.gz    # here, then commit
# Budget: 7 minutes of training inside an 8-minute call (the wheels, the unpack and the records'
# tarball take the rest); a rung the deadline stops comes back as partial records and is rerun
# whole next time. Extra arguments go to `gpu_ladder.py run` (e.g. --budget-s 300).
set -o pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT is unset: this runs on the device machine, where the tool sets it}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  data/gpu-pack/wheels/*.whl || { echo "gpu_ladder.sh: could not install the carried wheels"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TQDM_MININTERVAL=10
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$OUT/device.txt"
python3 scripts/gpu_ladder.py run --out "$OUT" --budget-s 420 "$@" 2>&1 | tee "$OUT/gpu-ladder.log"
