"""`rewrite-bench`: decode seeded latents with a random-init full-size decoder at several levels, side by side.

For each input (Wan: one video shape; AuK: one latent clip per `--seconds` value) and each level (one model,
one set of weights, levels switched with `optimize`): the time of `rewrite.warmup` right after `optimize`
(levels other than `off`, when the API has it: column ``rewrite.warmup s``, JSON ``warmup_s``), the first
call (capture included unless `rewrite.warmup` did it), then best of ``--repeat`` timed calls after
``--warmup`` untimed ones, CUDA's peak memory (``n/a`` on a CPU, JSON null), and the output against the first
level (`torch.equal`, max-abs, and PSNR over Wan's [-1, 1] video range or SNR of the AuK waveform).
Ratios are computed within this one run. A CPU run's table ends with a note that CPU runs check exactness
only (the speed-ups need CUDA). ``--help`` lists every default and what each column means.

The models are those of `rewrite.supported` (which also builds them); a bench adapter per model family
(`WanBench`, `AuKBench`) checks its own arguments, makes the inputs and says how to decode and compare;
`bench_levels` is the one timing loop both share.

Under ``torchrun --nproc-per-node N`` (WORLD_SIZE > 1) a Wan run times one GPU (rank 0 alone, the levels
above) against the sharded ``lossless`` decode over the N ranks, in the same run (`bench_distributed`).

``--plot FILE.png`` draws the best time per level and input, each bar labelled with its speedup and its
exactness (bit-identical, else PSNR or SNR); ``--from results.json`` (repeatable, one panel per file) prints
and plots results a run saved with ``--json`` instead of running. The plot needs matplotlib
(``pip install -e ".[plot]"``). A reader that closes stdout early (``| head``) ends the run quietly with
exit status 141 (`rewrite.tools.cli_output`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rewrite import supported
from rewrite.contract import video_difference
from rewrite.tools import bench_distributed
from rewrite.tools.cli_output import emit, quiet_when_stdout_closes

DTYPES = supported.DTYPES


@dataclasses.dataclass
class LevelResult:
    level: str
    first_call_s: float
    warmup_s: float | None  # `rewrite.warmup` after `optimize`; None at `off` or when the API lacks it
    best_s: float
    times_s: list[float]
    peak_gib: float | None  # CUDA's peak allocated memory; None on the CPU ("n/a" in the table)
    bit_identical: bool | None = None
    max_abs: float | None = None
    quality_db: float | None = None  # written as the adapter's `quality_key` (psnr_db, snr_db)
    path: str = ""
    speedup: float | None = None
    #: CUDA-graph memory the module holds after the timed calls (`report().graph_memory`); None where not counted
    graphs_gib: float | None = None
    #: the convs the held graphs run by a route of another error class (Winograd; `SizeMemory.routes`)
    routes: list[str] = dataclasses.field(default_factory=list)

    def to_json(self, quality_key: str) -> dict:
        return {quality_key if k == "quality_db" else k: v for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass
class Case:
    """One input of the benchmark: the latents and what the summary says about them."""

    z: torch.Tensor
    info: dict


# ------------------------------------------------------------------------------------------- comparisons


def compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[bool, float, float]:
    """torch.equal, max-abs difference and PSNR (peak-to-peak 2: outputs are clamped to [-1, 1]), as the
    `channels_last` contract measures them (`rewrite.contract.video_difference`)."""
    difference = video_difference(out, ref)
    return torch.equal(out, ref), difference.max_abs, difference.psnr_db


def compare_audio(out: torch.Tensor, ref: torch.Tensor) -> tuple[bool, float, float]:
    """torch.equal, max-abs difference and SNR dB = 10 log10(sum ref^2 / sum (out - ref)^2), inf when equal."""
    ref64, diff = ref.double(), out.double() - ref.double()
    noise, signal = diff.pow(2).sum().item(), ref64.pow(2).sum().item()
    if noise == 0:
        snr = math.inf
    else:
        snr = -math.inf if signal == 0 else 10 * math.log10(signal / noise)
    return torch.equal(out, ref), diff.abs().max().item(), snr


def _seeded_latents(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------- adapters


class WanBench:
    """Wan 2.1 / 2.2 video decoder: one latent video of `--frames` x `--size`; output `decode(z).sample`."""

    default_dtype = "bfloat16"
    quality_key, quality_title = "psnr_db", "PSNR dB"
    best_title, best_scale = "best s", 1.0

    @staticmethod
    def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        if args.seconds is not None:
            parser.error(f"--seconds is for --model auk only (use --frames for {args.model})")
        args.size = "480x832" if args.size is None else args.size
        args.frames = 81 if args.frames is None else args.frames
        try:
            args.height, args.width = (int(v) for v in args.size.lower().split("x"))
        except ValueError:
            parser.error(f"--size must look like 480x832, got {args.size!r}")
        if args.frames < 1 or (args.frames - 1) % 4:
            parser.error(f"--frames must be 1 + 4k (Wan's temporal factor), got {args.frames}")

    def __init__(self, args: argparse.Namespace, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        self.args, self.device, self.dtype = args, device, dtype
        self.vae = supported.get(args.model).build(args.config, seed=seed, device=device, dtype=dtype)
        ratio = self.vae.spatial_compression_ratio
        if args.height % ratio or args.width % ratio:
            raise SystemExit(f"rewrite-bench: --size must be a multiple of {ratio} for {args.model}")

    def cases(self) -> list[Case]:
        args, ratio = self.args, self.vae.spatial_compression_ratio
        shape = (args.batch, self.vae.config.z_dim, 1 + (args.frames - 1) // 4, args.height // ratio, args.width // ratio)
        return [Case(_seeded_latents(shape, self.device, self.dtype), {"latents": list(shape)})]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(z).sample

    compare = staticmethod(compare)

    def summary(self, head: dict, cases: list[dict]) -> dict:
        """The flat layout of one video shape (the layout this tool has always written for Wan)."""
        (case,) = cases
        args = self.args
        return {"model": args.model, "config": args.config, "size": f"{args.height}x{args.width}",
                "frames": args.frames, "batch": args.batch, "dtype": args.dtype, **head, **case}


class AuKBench:
    """AuK audio decoder: latents `[batch, frames, latent_dim]` at 50 frames/s, one clip per `--seconds` value.

    `decode(z)` returns the waveform `[batch, frames * 480]` itself.
    """

    default_dtype = "float32"
    quality_key, quality_title = "snr_db", "SNR dB"
    best_title, best_scale = "best ms", 1e3

    @staticmethod
    def config(name: str):
        from rewrite.models.auk.model import AuKConfig

        return AuKConfig.tiny() if name == "tiny" else AuKConfig()

    @classmethod
    def check_args(cls, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        for flag, value in (("--size", args.size), ("--frames", args.frames)):
            if value is not None:
                parser.error(f"{flag} is for the Wan models only (use --seconds for auk)")
        config = cls.config(args.config)
        frame_rate = config.sample_rate / config.hop_length
        text = "5" if args.seconds is None else args.seconds
        try:
            seconds = [float(v) for v in text.split(",") if v.strip()]
        except ValueError:
            parser.error(f"--seconds must be comma-separated numbers like 3,5,12,60, got {text!r}")
        if not seconds:
            parser.error("--seconds names no clip length")
        for value in seconds:
            if not (math.isfinite(value) and value > 0):
                parser.error(f"--seconds must be > 0, got {value:g}")
            if round(value * frame_rate) < 1:
                parser.error(f"--seconds {value:g} is shorter than one latent frame (1/{frame_rate:g} s)")
        args.seconds = seconds
        args.clip_frames = [round(value * frame_rate) for value in seconds]

    def __init__(self, args: argparse.Namespace, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        self.args, self.device, self.dtype = args, device, dtype
        self.vae = supported.get(args.model).build(args.config, seed=seed, device=device, dtype=dtype)

    def cases(self) -> list[Case]:
        cfg = self.vae.config
        cases = []
        for seconds, frames in zip(self.args.seconds, self.args.clip_frames):
            shape = (self.args.batch, frames, cfg.latent_dim)
            info = {"seconds": seconds, "frames": frames, "samples": frames * cfg.hop_length, "latents": list(shape)}
            cases.append(Case(_seeded_latents(shape, self.device, self.dtype), info))
        return cases

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(z)

    compare = staticmethod(compare_audio)

    def summary(self, head: dict, cases: list[dict]) -> dict:
        args = self.args
        return {"model": args.model, "config": args.config, "seconds": args.seconds, "batch": args.batch,
                "dtype": args.dtype, **head, "clips": cases}


class WanEncodeBench(WanBench):
    """``--encode``: the encoder of a Wan-family VAE on one seeded video of `--frames` x `--size`; output the
    posterior's mean (`encode(x).latent_dist.mean`, from which `.mode()` and `.sample()` follow), compared as
    a decoded video is (max-abs; PSNR over a peak-to-peak of 2, which the latents' range does not have: read it
    as a relative measure between levels). `rewrite.warmup` is not called (it warms the decoder up): the first
    call includes the encoder's capture."""

    skips_warmup = True

    def cases(self) -> list[Case]:
        from rewrite.models.wan.encode import video_channels

        args = self.args
        shape = (args.batch, video_channels(self.vae), args.frames, args.height, args.width)
        return [Case(_seeded_latents(shape, self.device, self.dtype), {"video": list(shape)})]

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return self.vae.encode(x).latent_dist.mean

    def summary(self, head: dict, cases: list[dict]) -> dict:
        return {**super().summary(head, cases), "direction": "encode"}


#: the bench adapter of each supported model, by the model's family
ADAPTERS = {model.name: {"wan": WanBench, "auk": AuKBench}[model.family] for model in supported.MODELS}


def adapter_for(model: str, encode: bool = False) -> type:
    """The bench adapter of `model`, its encoder's with `encode` (Wan family)."""
    return WanEncodeBench if encode else ADAPTERS[model]


# ---------------------------------------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    """The options, each with its default in its help (``--help`` shows them all)."""
    from rewrite.levels import LEVELS

    parser = argparse.ArgumentParser(prog="rewrite-bench", description=__doc__.splitlines()[0].split(": ", 1)[1],
                                     epilog=f"{COLUMNS_HELP} {CPU_NOTE[0].upper()}{CPU_NOTE[1:]}.")
    parser.add_argument("--model", choices=tuple(ADAPTERS), default="wan2.1", help="model (default wan2.1)")
    parser.add_argument("--config", choices=supported.CONFIGS, default="full",
                        help="model size (default full: the real decoder's shapes, random weights)")
    parser.add_argument("--size", default=None, help="Wan: output HxW in pixels (default 480x832)")
    parser.add_argument("--frames", type=int, default=None, help="Wan: output frames, 1 + 4k (default 81)")
    parser.add_argument("--seconds", default=None,
                        help="AuK: comma-separated clip lengths in seconds (default 5); frames = round(seconds * 50)")
    parser.add_argument("--batch", type=int, default=1, help="latents per decode (default 1)")
    parser.add_argument("--encode", action="store_true",
                        help="Wan family: time vae.encode of a seeded --size x --frames video instead of the decode "
                             "(output: the posterior's mean; default off)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="default: bfloat16 for Wan, float32 for AuK")
    parser.add_argument("--levels", default="off,lossless",
                        help=f"comma-separated, from {', '.join(LEVELS)} (default off,lossless); the first is the "
                             "reference of the speedup and exactness columns")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per level; the best is reported (default 3)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed calls per level after the first call, before the timed ones (default 1); "
                             "not rewrite.warmup, whose time is the 'rewrite.warmup s' column")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="default: cuda when available, else cpu")
    parser.add_argument("--backend", choices=bench_distributed.BACKENDS, default=None,
                        help="under torchrun: the process group's backend (default nccl on CUDA, gloo on the CPU)")
    parser.add_argument("--band-cuda-graphs", choices=bench_distributed.CUDA_GRAPH_MODES, default=None,
                        help="under torchrun: how the band graphs are captured on CUDA (decode_sharded's "
                             "cuda_graphs=; default segments)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-' for stdout; default: none)")
    parser.add_argument("--profile", action="store_true", help="per-kernel table of one call per level (default off)")
    parser.add_argument("--profile-rows", type=int, default=15, metavar="N",
                        help="kernels listed per --profile table (default 15, the most device time first)")
    parser.add_argument("--plot", metavar="FILE", type=Path,
                        help="draw the results as a bar chart (FILE.png; needs pip install -e \".[plot]\"; "
                             "default: none)")
    parser.add_argument("--from", dest="sources", metavar="RESULTS", type=Path, action="append",
                        help="print (and with --plot draw) a saved --json results file instead of running "
                             "(repeatable: one chart panel per file; default: run)")
    return parser


def parse_args(argv):
    """The checked arguments (exit 2 with the usage on a bad one, before any model is built)."""
    from rewrite.levels import LEVELS

    parser = build_parser()
    args = parser.parse_args(argv)
    check_outputs(parser, args)
    if args.sources:
        args.results = [read_results(parser, path) for path in args.sources]
        return args
    args.levels = [level.strip() for level in args.levels.split(",") if level.strip()]
    for level in args.levels:
        if level not in LEVELS:
            parser.error(f"unknown level {level!r} in --levels; expected from {', '.join(LEVELS)}")
    adapter = ADAPTERS[args.model]
    if args.encode and adapter is not WanBench:
        parser.error(f"--encode is for the Wan family only ({', '.join(m for m, a in ADAPTERS.items() if a is WanBench)})")
    args.dtype = adapter.default_dtype if args.dtype is None else args.dtype
    adapter.check_args(parser, args)
    bench_distributed.check_args(parser, args)
    if args.encode and bench_distributed.under_torchrun():
        parser.error("--encode runs on one device: not under torchrun")
    if args.repeat < 1 or args.warmup < 0 or args.batch < 1:
        parser.error("--repeat and --batch must be >= 1, --warmup >= 0")
    return args


def check_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The files written at the end are checked before the run: their directories exist, matplotlib is
    installed for --plot and knows the file's format."""
    if args.json not in (None, "-") and not Path(args.json).parent.is_dir():
        parser.error(f"--json {args.json}: directory {Path(args.json).parent} does not exist")
    if args.plot is None:
        if args.sources is None:
            return
    else:
        try:
            from matplotlib.backend_bases import FigureCanvasBase
        except ImportError:
            parser.error('--plot needs matplotlib, which is not installed: pip install -e ".[plot]"')
        formats = FigureCanvasBase.get_supported_filetypes()
        if args.plot.suffix.lstrip(".").lower() not in formats:
            parser.error(f"--plot {args.plot}: unknown image format {args.plot.suffix!r}; use one of "
                         f"{', '.join('.' + f for f in sorted(formats))}")
        if not args.plot.parent.is_dir():
            parser.error(f"--plot {args.plot}: directory {args.plot.parent} does not exist")


def read_results(parser: argparse.ArgumentParser, path: Path) -> dict:
    """A results file written by ``--json`` (exit 2 with the usage if it is not one)."""
    try:
        summary = json.loads(path.read_text())
    except OSError as error:
        parser.error(f"--from {path}: {error.strerror or error}")
    except ValueError as error:
        parser.error(f"--from {path}: not JSON ({error})")
    if not isinstance(summary, dict) or summary.get("model") not in ADAPTERS or not (
            "levels" in summary or "clips" in summary):
        parser.error(f"--from {path}: not a rewrite-bench results file (no model and levels)")
    return summary


# ------------------------------------------------------------------------------------------------ timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device):
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - start


def profile_table(fn, device, rows: int = 15) -> str:
    """Top kernels of one call and the convolution share of device time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        _sync(device)
    events = prof.key_averages()
    use_device = device.type == "cuda"

    def self_time(e):
        return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) if use_device else e.self_cpu_time_total

    total = sum(self_time(e) for e in events) or 1
    conv_words = ("conv", "implicit_gemm", "sm90_xmma", "cudnn", "wgrad", "dgrad", "fprop")
    conv = sum(self_time(e) for e in events if any(w in e.key.lower() for w in conv_words))
    table = events.table(sort_by="self_cuda_time_total" if use_device else "self_cpu_time_total", row_limit=rows)
    return f"{table}\nconvolution share of {'device' if use_device else 'CPU'} self time: {100 * conv / total:.1f}%"


def bench_levels(bench, case: Case, args, device: torch.device, dtype: torch.dtype, progress) -> dict:
    """Every level of `args.levels` on one input: warm-up, first call, best of N, comparison with the first level.

    Returns the input's summary entry: `case.info`, `levels` (LevelResult JSON) and `profiles` (level -> table).
    `rewrite.warmup` gets the contract's arguments only (device, dtype, batch), not the input's shape.
    """
    import rewrite
    from rewrite import optimize, report

    warmup: Callable | None = getattr(rewrite, "warmup", None)  # tolerated missing: the API may not have it yet
    vae = bench.vae
    results, reference, profiles = [], None, {}
    decode = lambda: bench.decode(case.z)  # noqa: E731
    optimize(vae, level="off")  # every input starts unoptimized: each level's first call captures afresh
    for level in args.levels:
        optimize(vae, level=level)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        warmup_s = None
        if level != "off" and warmup is not None and not getattr(bench, "skips_warmup", False):
            _, warmup_s = _timed(lambda: warmup(vae, device=device, dtype=dtype, batch=args.batch), device)
        out, first = _timed(decode, device)
        progress.update()
        for _ in range(args.warmup):
            _timed(decode, device)
            progress.update()
        times = []
        for _ in range(args.repeat):
            out, seconds = _timed(decode, device)
            times.append(seconds)
            progress.update()
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        summary = report(vae)
        held = getattr(summary, "graph_memory", None)
        result = LevelResult(level, first, warmup_s, min(times), times, peak, path=_path_of(summary),
                             graphs_gib=None if held is None else held.total / 2**30,
                             routes=[] if held is None else sorted({r for size in held.sizes for r in size.routes}))
        if reference is None:
            reference = out.clone()
        else:
            result.bit_identical, result.max_abs, result.quality_db = bench.compare(out, reference)
        result.speedup = results[0].best_s / result.best_s if results else 1.0
        results.append(result)
        if args.profile:
            profiles[level] = profile_table(decode, device, args.profile_rows)
    return {**case.info, "levels": [r.to_json(bench.quality_key) for r in results], "profiles": profiles}


#: seed of the random-init decoder weights (the latents have their own, `_seeded_latents`)
MODEL_SEED = 0


def build_bench(args, device: torch.device, dtype: torch.dtype):
    """The model's adapter with its random-init decoder built from `MODEL_SEED`: the same weights in every
    run (SNR and max-abs depend on them), the caller's random state untouched (`SupportedModel.build`)."""
    return adapter_for(args.model, getattr(args, "encode", False))(args, device, dtype, MODEL_SEED)


def run(args) -> dict:
    from tqdm.auto import tqdm

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    bench = build_bench(args, device, dtype)  # one model, one set of weights, for every input
    inputs = bench.cases()
    total = len(inputs) * len(args.levels) * (1 + args.warmup + args.repeat)
    progress = tqdm(total=total, desc="decodes", file=sys.stderr)
    with torch.no_grad():
        cases = [bench_levels(bench, case, args, device, dtype, progress) for case in inputs]
    progress.close()
    head = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "triton": _triton_version(), "model_seed": MODEL_SEED}
    return bench.summary(head, cases)


def _path_of(summary) -> str:
    """The report's path of the last call, with how the graphs served it or why the reference path did, when the
    runner says (a level that fell back names its reason in the table and the JSON)."""
    note = summary.last_detail or (summary.last_reason if summary.level != "off" else None)
    return f"{summary.last_path}: {note}" if note else summary.last_path


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


# ------------------------------------------------------------------------------------------------ output


#: the level columns of the table, after the input's own (AuK: clip s, frames); see COLUMNS_HELP
LEVEL_COLUMNS = ("level", "first s", "rewrite.warmup s", "{best}", "speedup", "peak GiB", "graphs GiB", "equal",
                 "max abs", "{quality}", "path")
COLUMNS_HELP = ("Columns: 'first s' is the first decode after optimize (the capture included unless "
                "rewrite.warmup did it); 'rewrite.warmup s' the time of rewrite.warmup right after optimize (not "
                "the --warmup calls; '-' at level off); 'best' the best of the --repeat timed calls; 'peak GiB' "
                "CUDA's peak memory (n/a on a CPU); 'graphs GiB' the CUDA-graph memory the module holds after them "
                "(report().graph_memory: pools, cache blocks; '-' where not counted); 'equal', 'max abs' and "
                "PSNR/SNR compare with the first level.")
#: said once under a table of a CPU run (a CPU decode runs the graphs eagerly: no CUDA graphs, no Triton)
CPU_NOTE = "on a CPU, runs check exactness only: the speed-ups need CUDA"


def _number(value: float | None, spec: str) -> str:
    """``value`` formatted, ``n/a`` for None or NaN (a peak memory on the CPU, in this or older JSON)."""
    return "n/a" if value is None or value != value else format(value, spec)


def _level_cells(r: dict, bench) -> list[str]:
    """One level's cells in `LEVEL_COLUMNS` order; ``-`` where the column does not apply to the level."""
    quality = r[bench.quality_key]
    quality = "-" if quality is None else ("inf" if math.isinf(quality) and quality > 0 else f"{quality:.1f}")
    return [r["level"], f"{r['first_call_s']:.3f}", "-" if r["warmup_s"] is None else f"{r['warmup_s']:.3f}",
            f"{r['best_s'] * bench.best_scale:.3f}", f"{r['speedup']:.2f}x", _number(r["peak_gib"], ".2f"),
            "-" if r.get("graphs_gib") is None else f"{r['graphs_gib']:.2f}",
            "ref" if r["bit_identical"] is None else str(r["bit_identical"]),
            "-" if r["max_abs"] is None else f"{r['max_abs']:.3g}", quality, r["path"]]


def _level_header(bench) -> list[str]:
    return [c.format(best=bench.best_title, quality=bench.quality_title) for c in LEVEL_COLUMNS]


def aligned(rows: list[list[str]], left: int) -> list[str]:
    """Rows as columns two spaces apart at least, whatever the widths of the values: the first ``left``
    columns and the last (a free-text path) left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    last = len(widths) - 1
    return ["  ".join(cell.ljust(width) if i < left or i == last else cell.rjust(width)
                      for i, (cell, width) in enumerate(zip(row, widths))).rstrip() for row in rows]


def _distributed_line(d: dict) -> str:
    """The one-GPU against N-rank line of a run under torchrun."""
    return (f"{d['world_size']} ranks ({d['backend']}, {d['mode']}, output {d['output']}): {d['sharded_s']:.3f} s "
            f"against one GPU lossless {d['one_gpu_lossless_s']:.3f} s = {d['speedup_vs_one_gpu']:.2f}x, "
            f"bit-identical {d['bit_identical']}; one GPU: {d['baseline']}")


def format_table(summary: dict) -> str:
    """The printed results of one run: a heading, a row per level (AuK: per clip and level), the CPU note on a
    CPU, the distributed line, the convs run by Winograd and the profiles."""
    bench = adapter_for(summary["model"], summary.get("direction") == "encode")
    on = f"on {summary['device']} (torch {summary['torch']}, triton {summary['triton']})"
    if "clips" not in summary:  # Wan: one video shape
        what = " encode" if summary.get("direction") == "encode" else ""
        head = (f"{summary['model']}{what} {summary['config']} {summary['size']}x{summary['frames']} {summary['dtype']} "
                f"{on}")
        rows = [_level_header(bench)] + [_level_cells(r, bench) for r in summary["levels"]]
        lines = [head, *aligned(rows, left=1)]
    else:
        head = f"{summary['model']} {summary['config']} batch {summary['batch']} {summary['dtype']} {on}"
        rows = [["clip s", "frames", *_level_header(bench)]]
        rows += [[f"{clip['seconds']:g}", str(clip["frames"]), *_level_cells(r, bench)]
                 for clip in summary["clips"] for r in clip["levels"]]
        lines = [head, *aligned(rows, left=3)]
    if summary["device"] == "cpu":
        lines.append(f"note: {CPU_NOTE}")
    if "distributed" in summary:
        lines.append(_distributed_line(summary["distributed"]))
    for clip in summary.get("clips", [summary]):
        for result in clip["levels"]:
            lines += [f"{result['level']} route: {route}" for route in result.get("routes", ())]
        for level, table in clip["profiles"].items():
            where = f", clip {clip['seconds']:g} s ({clip['frames']} frames)" if "clips" in summary else ""
            lines += ["", f"profile at level {level}{where}:", table]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ plot

#: bar colour per level (levels of another name get matplotlib's cycle)
LEVEL_COLORS = {"off": "#9e9e9e", "lossless": "#3b7dd8", "channels_last": "#e8892b"}


def _cases(summary: dict) -> list[tuple[str, list[dict]]]:
    """(label, level results) per input of a run: Wan's one video shape, or AuK's clips."""
    if "clips" in summary:
        return [(f"{clip['seconds']:g} s ({clip['frames']} frames)", clip["levels"]) for clip in summary["clips"]]
    return [(f"{summary['size']} x {summary['frames']} frames", summary["levels"])]


def exactness(result: dict, bench) -> str:
    """What a bar says about its output against the first level: reference, bit-identical, or the dB."""
    if result["bit_identical"] is None:
        return "reference"
    if result["bit_identical"]:
        return "bit-identical"
    quality = result.get(bench.quality_key)
    return "differs" if quality is None else f"{bench.quality_title.split()[0]} {quality:.1f} dB"


def plot_results(summaries: list[dict], path: Path) -> None:
    """One panel per results summary: best time per input (groups) and level (bars), each bar labelled with
    its speedup against the first level and its exactness."""
    from matplotlib.figure import Figure

    widths = [len(_cases(s)) * max(len(c[1]) for c in _cases(s)) for s in summaries]
    figure = Figure(figsize=(max(6.0, 1.6 * max(widths) + 2), 4.2 * len(summaries)))
    axes = figure.subplots(len(summaries), 1, squeeze=False)[:, 0]
    for ax, summary in zip(axes, summaries):
        bench = adapter_for(summary["model"], summary.get("direction") == "encode")
        cases = _cases(summary)
        levels = list(dict.fromkeys(r["level"] for _, results in cases for r in results))
        width = min(0.8 / len(levels), 0.28)
        tallest = max(r["best_s"] * bench.best_scale for _, results in cases for r in results)
        for k, level in enumerate(levels):
            for i, (_, results) in enumerate(cases):
                result = next((r for r in results if r["level"] == level), None)
                if result is None:
                    continue
                height = result["best_s"] * bench.best_scale
                x = i + width * (k - (len(levels) - 1) / 2)
                ax.bar(x, height, width * 0.92, color=LEVEL_COLORS.get(level), label=level if i == 0 else None)
                ax.text(x, height + 0.02 * tallest, f"{result['speedup']:.2f}x\n{exactness(result, bench)}",
                        ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(cases)), [label for label, _ in cases])
        ax.set_xlim(-0.6, len(cases) - 0.4)
        ax.set_ylim(0, tallest * 1.3)
        ax.set_ylabel(f"best time per decode ({bench.best_title.split()[-1]})")
        software = f"torch {summary['torch']}" + (f", triton {summary['triton']}" if summary.get("triton") else "")
        ax.set_title(f"{summary['model']} {summary['config']}, {summary['dtype']}, batch {summary['batch']} "
                     f"on {summary['device']} ({software})", fontsize=10)
        ax.legend(title="level", fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    figure.tight_layout()
    figure.savefig(path, dpi=150)


@quiet_when_stdout_closes
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rewrite-bench``: 0, 2 for bad arguments, `BROKEN_PIPE_STATUS` when stdout's reader
    stops early (``rewrite-bench ... | head``)."""
    args = parse_args(argv)
    if args.sources:  # saved results: print and plot them, run nothing
        summaries = args.results
        emit("\n\n".join(format_table(summary) for summary in summaries))
    else:
        if bench_distributed.under_torchrun():
            summary = bench_distributed.run_distributed(args, sys.modules[__name__])
        else:
            summary = run(args)
        if summary is None:  # a rank other than 0 under torchrun: rank 0 reports
            return 0
        summaries = [summary]
        emit(format_table(summaries[0]))
        if args.json:
            text = json.dumps(summaries[0], indent=2, default=str)
            if args.json == "-":
                emit(text)
            else:
                with open(args.json, "w") as handle:
                    handle.write(text)
    if args.plot is not None:
        plot_results(summaries, args.plot)
        print(f"rewrite-bench: wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
