#!/usr/bin/env bash
# Session 34: why Wan 2.2's 704x1280x121 encode at channels_last took the reference path on an H100 (session 34's
# first call; Wan 2.1's did not): a small Wan 2.2 encode at channels_last printing the report and the traceback of
# a failed capture, then the 704p encode again with the path column naming the reason. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 150 python3 - <<'PY' 2>&1 | grep -v Warn | tail -60
import copy, logging, traceback, torch
logging.basicConfig(level=logging.WARNING)
from rewrite import optimize, report
from rewrite.runtime import captures
from rewrite.models.wan.config import build_wan
original = captures.CaptureCache.get
def get(self, key, capture, what):
    def traced():
        try:
            return capture()
        except Exception:
            traceback.print_exc()
            raise
    return original(self, key, traced, what)
captures.CaptureCache.get = get
vae = build_wan("wan2.2").to(device="cuda", dtype=torch.bfloat16)
for level in ("channels_last", "lossless"):
    opt = optimize(copy.deepcopy(vae), level)
    video = torch.randn(1, 3, 9, 256, 256, generator=torch.Generator().manual_seed(0)).to("cuda", torch.bfloat16)
    with torch.no_grad():
        opt.encode(video)
    print(level, report(opt).last_path, report(opt).last_reason, flush=True)
PY
