"""`rewrite-bench`: argument checks and --help, the AuK and Wan runs on tiny models (JSON layout, exactness
columns, the table's columns and CPU note), SNR, the chart (`--plot`, from a run and from saved results), a
reader that closes stdout early.

`main([...])` runs in-process. Each model runs once per module (a tiny config, one timed call per level, no
untimed calls); the tests read the JSON it printed. Argument errors stop in `parse_args`, before any model
is built.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rewrite
from rewrite.tools import bench, bench_distributed
from rewrite.reporting import Report
from rewrite.tools.cli_output import BROKEN_PIPE_STATUS

AUK_ARGS = ["--model", "auk", "--config", "tiny", "--seconds", "0.2,0.5", "--levels", "off,lossless",
            "--repeat", "1", "--warmup", "0", "--json", "-"]
WAN_ARGS = ["--model", "wan2.1", "--config", "tiny", "--size", "32x32", "--frames", "5", "--dtype", "float32",
            "--levels", "off,lossless", "--repeat", "1", "--warmup", "0", "--json", "-"]
LEVEL_KEYS = ["level", "first_call_s", "warmup_s", "best_s", "times_s", "peak_gib", "bit_identical", "max_abs"]


def run_main(argv: list[str]) -> tuple[str, dict]:
    """The table `main` printed and the JSON that followed it (`--json -`)."""
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), torch.no_grad():
        assert bench.main(argv) == 0
    text = stdout.getvalue()
    start = text.index("\n{") + 1
    return text[:start], json.loads(text[start:])


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def auk_plot(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("plot") / "auk.png"


@pytest.fixture(scope="module")
def auk_run(auk_plot):
    return run_main([*AUK_ARGS, "--plot", str(auk_plot)])


@pytest.fixture(scope="module")
def wan_run():
    return run_main(WAN_ARGS)


def check_levels(levels: list[dict], quality_key: str) -> None:
    """Common to both models: off is the reference, lossless is bit-identical, times and warm-up are sane."""
    assert [r["level"] for r in levels] == ["off", "lossless"]
    for r in levels:
        assert list(r)[: len(LEVEL_KEYS)] == LEVEL_KEYS and quality_key in r
        assert len(r["times_s"]) == 1 and r["best_s"] == min(r["times_s"]) and r["first_call_s"] > 0
    off, lossless = levels
    assert off["warmup_s"] is None and off["bit_identical"] is None and off[quality_key] is None
    assert off["path"] == "reference" and off["speedup"] == 1.0
    assert lossless["bit_identical"] is True and lossless["max_abs"] == 0.0
    assert lossless[quality_key] == math.inf and lossless["path"].startswith("graphs")
    if hasattr(rewrite, "warmup"):
        assert isinstance(lossless["warmup_s"], float) and lossless["warmup_s"] >= 0
    else:
        assert lossless["warmup_s"] is None


# ---------------------------------------------------------------------------------------------------- AuK


def test_auk_json_layout(auk_run):
    _, summary = auk_run
    assert summary["model"] == "auk" and summary["config"] == "tiny" and summary["dtype"] == "float32"
    assert summary["seconds"] == [0.2, 0.5] and summary["batch"] == 1
    assert [c["frames"] for c in summary["clips"]] == [10, 25]  # 50 latent frames per second
    for clip in summary["clips"]:
        assert clip["latents"] == [1, clip["frames"], 8] and clip["samples"] == clip["frames"] * 480
        assert clip["profiles"] == {}
        check_levels(clip["levels"], "snr_db")
        assert "psnr_db" not in clip["levels"][0]


def cells(line: str) -> list[str]:
    """A table line's cells: columns are two or more spaces apart, a cell holds single spaces at most."""
    return re.split(r"\s{2,}", line.strip())


AUK_HEADER = ["clip s", "frames", "level", "first s", "rewrite.warmup s", "best ms", "speedup", "peak GiB",
              "graphs GiB", "equal", "max abs", "SNR dB", "path"]


def test_auk_table(auk_run):
    table, summary = auk_run
    lines = table.splitlines()
    assert lines[0].startswith("auk tiny batch 1 float32 on cpu")
    assert cells(lines[1]) == AUK_HEADER
    rows = [dict(zip(AUK_HEADER, cells(line))) for line in lines[2:6]]
    assert all(len(cells(line)) == len(AUK_HEADER) for line in lines[2:6])
    assert [(r["clip s"], r["frames"], r["level"]) for r in rows] == [
        ("0.2", "10", "off"), ("0.2", "10", "lossless"), ("0.5", "25", "off"), ("0.5", "25", "lossless")]
    off, lossless = rows[:2]
    assert [lossless[k] for k in ("equal", "max abs", "SNR dB")] == ["True", "0", "inf"]
    assert lossless["path"] == "graphs: graph run eagerly (no CUDA graphs on cpu)"
    assert [off[k] for k in ("rewrite.warmup s", "equal", "max abs", "SNR dB", "path")] == ["-", "ref", "-", "-",
                                                                                           "reference"]
    assert float(off["best ms"]) == pytest.approx(summary["clips"][0]["levels"][0]["best_s"] * 1e3, abs=1e-3)


def test_peak_memory_is_n_a_on_the_cpu(auk_run, wan_run):
    for table, summary in (auk_run, wan_run):
        levels = [r for clip in summary.get("clips", [summary]) for r in clip["levels"]]
        assert all(r["peak_gib"] is None for r in levels)  # JSON null, not NaN
        header = cells(table.splitlines()[1])
        rows = [dict(zip(header, cells(line))) for line in table.splitlines()[2:2 + len(levels)]]
        assert [r["peak GiB"] for r in rows] == ["n/a"] * len(levels)
    saved = copy.deepcopy(auk_run[1])
    saved["clips"][0]["levels"][0]["peak_gib"] = math.nan  # results saved before, or by a torchrun rank
    assert cells(bench.format_table(saved).splitlines()[2])[7] == "n/a"


def test_a_cpu_run_says_once_that_it_checks_exactness_only(auk_run, wan_run):
    for table, _ in (auk_run, wan_run):
        assert table.count(bench.CPU_NOTE) == 1
        assert table.splitlines()[-1] == f"note: {bench.CPU_NOTE}"
    assert "exactness only" in bench.CPU_NOTE and "CUDA" in bench.CPU_NOTE
    on_gpu = copy.deepcopy(wan_run[1])
    on_gpu["device"] = "NVIDIA H100 80GB HBM3"
    assert bench.CPU_NOTE not in bench.format_table(on_gpu)


def test_the_table_lists_each_levels_winograd_convs_and_a_cpu_run_has_none(wan_run):
    assert all(r["routes"] == [] for r in wan_run[1]["levels"])  # no Winograd conv off the GPU
    on_gpu = copy.deepcopy(wan_run[1])
    on_gpu["levels"][-1]["routes"] = ["Winograd F(4x4, 3x3): 192 -> 192 channels at 4x360x640, bfloat16"]
    level = on_gpu["levels"][-1]["level"]
    assert (f"{level} route: Winograd F(4x4, 3x3): 192 -> 192 channels at 4x360x640, bfloat16"
            in bench.format_table(on_gpu).splitlines())


def test_columns_stay_apart_however_wide_the_numbers(auk_run):
    """A full-size AuK decode on a CPU takes seconds: ``17107.713`` ms fills the old fixed-width column and ran
    into the first-call time (``8.87417107.713``). Every cell keeps two spaces to its neighbours."""
    summary = copy.deepcopy(auk_run[1])
    level = summary["clips"][1]["levels"][1]
    level.update(first_call_s=8.874, warmup_s=21.6, best_s=17.107713, max_abs=1.25e-7, snr_db=123456.7)
    lines = bench.format_table(summary).splitlines()
    assert all(len(cells(line)) == len(AUK_HEADER) for line in lines[1:6])
    row = dict(zip(AUK_HEADER, cells(lines[5])))
    assert (row["first s"], row["rewrite.warmup s"], row["best ms"]) == ("8.874", "21.600", "17107.713")
    assert row["SNR dB"] == "123456.7" and row["max abs"] == "1.25e-07"


# ---------------------------------------------------------------------------------------------------- Wan


def test_wan_json_layout_and_table(wan_run):
    table, summary = wan_run
    assert list(summary) == ["model", "config", "size", "frames", "batch", "dtype", "device", "torch", "triton",
                             "model_seed", "latents", "levels", "profiles"]
    assert summary["size"] == "32x32" and summary["frames"] == 5 and summary["latents"] == [1, 4, 2, 4, 4]
    check_levels(summary["levels"], "psnr_db")
    lines = table.splitlines()
    assert lines[0].startswith("wan2.1 tiny 32x32x5 float32 on cpu")
    assert cells(lines[1]) == ["level", "first s", "rewrite.warmup s", "best s", "speedup", "peak GiB", "graphs GiB",
                               "equal", "max abs", "PSNR dB", "path"]
    assert [r["graphs_gib"] for r in summary["levels"]] == [None, None]  # no CUDA graphs on the CPU: "-"
    assert lines[3].split()[-4:] == ["True", "0", "inf", "graphs"]
    assert len(cells(lines[2])) == len(cells(lines[3])) == len(cells(lines[1]))


# ------------------------------------------------------------------------------------------------ arguments


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "auk", "--levels", "off,fast"], "unknown level 'fast'"),
        (["--levels", "lossless,bogus"], "unknown level 'bogus'"),
        (["--model", "auk", "--seconds", "0"], "--seconds must be > 0"),
        (["--model", "auk", "--seconds", "3,-1"], "--seconds must be > 0"),
        (["--model", "auk", "--seconds", "nan"], "--seconds must be > 0"),
        (["--model", "auk", "--seconds", "0.001"], "shorter than one latent frame"),
        (["--model", "auk", "--seconds", "3s"], "comma-separated numbers"),
        (["--model", "auk", "--seconds", ","], "no clip length"),
        (["--model", "auk", "--frames", "81"], "--frames is for the Wan models only"),
        (["--model", "auk", "--size", "480x832"], "--size is for the Wan models only"),
        (["--model", "wan2.1", "--seconds", "5"], "--seconds is for --model auk only"),
        (["--model", "wan2.1", "--frames", "80"], "--frames must be 1 + 4k"),
        (["--model", "auk", "--repeat", "0"], "--repeat and --batch must be >= 1"),
        (["--model", "mp3"], "invalid choice: 'mp3'"),
        (["--backend", "gloo"], "--backend is for runs under torchrun"),
        (["--band-cuda-graphs", "off"], "--band-cuda-graphs is for runs under torchrun"),
    ],
)
def test_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_help_shows_every_default_and_what_the_warm_up_column_times(capsys):
    parser = bench.build_parser()
    for action in parser._actions:
        if action.option_strings and action.dest not in ("help",):
            assert "default" in action.help, action.option_strings
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(["--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for default in ("default full", "default 480x832", "default 81", "default off,lossless", "default 5)",
                    "default 3)", "default 1)", "default wan2.1", "bfloat16 for Wan, float32 for AuK",
                    "cuda when available, else cpu"):
        assert default in text, default
    assert "not rewrite.warmup, whose time is the 'rewrite.warmup s' column" in text
    assert "n/a on a CPU" in text and "the speed-ups need CUDA" in text


def test_defaults_per_model():
    auk = bench.parse_args(["--model", "auk", "--seconds", "3,5,12,60"])
    assert auk.dtype == "float32" and auk.seconds == [3.0, 5.0, 12.0, 60.0]
    assert auk.clip_frames == [150, 250, 600, 3000]
    assert bench.parse_args(["--model", "auk"]).clip_frames == [250]
    wan = bench.parse_args(["--model", "wan2.2"])
    assert (wan.dtype, wan.height, wan.width, wan.frames) == ("bfloat16", 480, 832, 81)
    assert bench.parse_args(["--model", "auk", "--dtype", "bfloat16"]).dtype == "bfloat16"


def test_compare_audio_snr():
    ref = torch.tensor([[0.5, -0.5, 0.25, 0.0]])
    assert bench.compare_audio(ref.clone(), ref) == (True, 0.0, math.inf)
    out = ref + torch.tensor([[0.0, 0.05, 0.0, 0.0]])
    equal, max_abs, snr = bench.compare_audio(out, ref)
    expected = 10 * math.log10((0.25 + 0.25 + 0.0625) / 0.05**2)
    assert not equal and max_abs == pytest.approx(0.05) and snr == pytest.approx(expected, rel=1e-6)


def test_random_init_weights_are_seeded():
    """Two runs decode with the same decoder (quality columns compare like with like across runs)."""
    args = bench.parse_args(["--model", "auk", "--config", "tiny", "--seconds", "0.2"])
    state = torch.random.get_rng_state()
    first, second = (bench.build_bench(args, torch.device("cpu"), torch.float32).vae.state_dict() for _ in range(2))
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_json_names_the_model_seed(auk_run):
    _, summary = auk_run
    assert summary["model_seed"] == bench.MODEL_SEED


# ---------------------------------------------------------------------------------------------------- plot


def test_plot_of_a_run(auk_run, auk_plot):
    assert auk_plot.read_bytes().startswith(PNG_MAGIC) and auk_plot.stat().st_size > 10_000


def test_plot_from_saved_results_runs_nothing(auk_run, wan_run, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "run", lambda args: pytest.fail("ran a benchmark"))
    files = []
    for name, (_, summary) in (("wan", wan_run), ("auk", auk_run)):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(summary, indent=2, default=str))
    png = tmp_path / "chart.png"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert bench.main(["--plot", str(png), "--from", str(files[0]), "--from", str(files[1])]) == 0
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert stdout.getvalue() == bench.format_table(wan_run[1]) + "\n\n" + bench.format_table(auk_run[1]) + "\n"


def test_bar_labels_say_how_exact_each_level_is():
    auk, wan = bench.ADAPTERS["auk"], bench.ADAPTERS["wan2.1"]
    assert bench.exactness({"bit_identical": None}, wan) == "reference"
    assert bench.exactness({"bit_identical": True, "psnr_db": math.inf}, wan) == "bit-identical"
    assert bench.exactness({"bit_identical": False, "psnr_db": 47.25}, wan) == "PSNR 47.2 dB"
    assert bench.exactness({"bit_identical": False, "snr_db": 71.04}, auk) == "SNR 71.0 dB"


def test_a_reader_that_closes_stdout_ends_the_run_quietly(auk_run, tmp_path):
    """``rewrite-bench --from RESULTS | head``, the reader gone before the first line: exit status 141 (as for
    SIGPIPE), nothing on stderr, no "Exception ignored" at the interpreter's exit. A real pipe and process:
    stdout's file descriptor is pointed at /dev/null."""
    saved = tmp_path / "auk.json"
    saved.write_text(json.dumps(auk_run[1], default=str))
    child = subprocess.Popen([sys.executable, "-m", "rewrite.tools.bench", "--from", str(saved)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()  # before the child (still importing torch) writes anything
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == BROKEN_PIPE_STATUS
    assert err == ""


def test_plot_without_matplotlib_names_the_extra(monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(["--model", "auk", "--plot", "chart.png"])
    assert stop.value.code == 2
    assert 'pip install -e ".[plot]"' in capsys.readouterr().err


@pytest.mark.parametrize(("make_argv", "message"), [
    (lambda tmp: ["--plot", str(tmp / "chart.xyz")], "unknown image format '.xyz'"),
    (lambda tmp: ["--plot", str(tmp / "missing" / "chart.png")], "does not exist"),
    (lambda tmp: ["--json", str(tmp / "missing" / "out.json")], "does not exist"),
    (lambda tmp: ["--from", str(tmp / "missing.json")], "No such file or directory"),
    (lambda tmp: ["--from", str(tmp / "bad.json")], "not JSON"),
    (lambda tmp: ["--from", str(tmp / "other.json")], "not a rewrite-bench results file"),
])
def test_bad_output_arguments_stop_before_the_run(make_argv, message, tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{nope")
    (tmp_path / "other.json").write_text('{"model": "auk"}')
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(make_argv(tmp_path))
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ torchrun


def test_the_bench_names_the_sharded_decodes_capture_modes():
    from rewrite.models.wan.distributed.band_graphs import CUDA_GRAPH_MODES

    assert bench_distributed.CUDA_GRAPH_MODES == CUDA_GRAPH_MODES


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "auk"], "under torchrun the bench runs the sharded Wan decode"),
    (["--levels", "off"], "--levels must include lossless"),
    (["--backend", "nccl", "--device", "cpu"], "--backend nccl needs --device cuda"),
])
def test_bad_arguments_under_torchrun(argv, message, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow  # torchrun: two ranks and a one-process baseline
def test_torchrun_two_ranks_against_one_gpu(tmp_path):
    """``torchrun --standalone --nproc-per-node 2 -m rewrite.tools.bench`` (as ``python -m
    torch.distributed.run``), gloo on the CPU, the smallest Wan case: rank 0 alone prints the table and
    writes the JSON, with the one-GPU lossless row, the sharded row (through the band graphs: bf16, whose
    band graphs this CPU serves), both times and bit-identical output. No timing is asserted (two ranks
    share two cores)."""
    out = tmp_path / "distributed.json"
    argv = ["--model", "wan2.1", "--config", "tiny", "--size", "32x32", "--frames", "9", "--dtype", "bfloat16",
            "--levels", "lossless", "--repeat", "1", "--warmup", "0", "--device", "cpu", "--backend", "gloo",
            "--json", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "rewrite.tools.bench", *argv]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert done.stdout.count("wan2.1 tiny 32x32x9 bfloat16 on cpu") == 1  # rank 0 alone prints
    summary = json.loads(out.read_text())
    assert [r["level"] for r in summary["levels"]] == ["lossless", "lossless x2"]
    one, sharded = summary["levels"]
    assert one["path"].startswith("graphs") and sharded["path"] == ("sharded: bands through band graphs "
                                                                                 "(0 conv calls gathered)")
    assert sharded["bit_identical"] is True and sharded["max_abs"] == 0.0
    d = summary["distributed"]
    assert d["world_size"] == 2 and d["backend"] == "gloo" and d["mode"] == "bands" and d["bit_identical"] is True
    assert d["latent_rows"] == [[0, 2], [2, 4]] and d["baseline"] == bench_distributed.BASELINE
    assert (d["band_graph_steps"], d["band_graph_checks_first_call"], d["band_graph_reason"]) == (3, 3, None)  # 9 frames: 3 latent frames
    assert d["band_graph_gathered_convs"] == 0
    assert d["one_gpu_lossless_s"] == one["best_s"] > 0 and d["sharded_s"] == sharded["best_s"] > 0
    assert d["speedup_vs_one_gpu"] == pytest.approx(one["best_s"] / sharded["best_s"])
    assert "2 ranks (gloo, bands, output rank0)" in done.stdout and "bit-identical True" in done.stdout


@pytest.mark.parametrize(("level", "path", "reason", "detail", "shown"), [
    ("channels_last", "reference", "capture failed for encoder: ValueError: x", None,
     "reference: capture failed for encoder: ValueError: x"),
    ("lossless", "graphs", None, "streamed", "graphs: streamed"),
    ("lossless", "graphs", None, None, "graphs"),
    ("off", "reference", "not optimized", None, "reference"),
])
def test_the_path_column_names_why_a_level_fell_back(level, path, reason, detail, shown):
    summary = Report(model="AutoencoderKLWan", level=level, graphs=[], fallbacks={}, last_path=path,
                     last_reason=reason, last_detail=detail)
    assert bench._path_of(summary) == shown
