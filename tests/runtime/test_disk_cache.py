"""The disk cache (`rewrite.runtime.disk_cache`): a hit skips the export and the passes, every key change misses, an
untrusted entry is logged and rebuilt, concurrent writers leave one valid entry, and no weight is ever written."""

from __future__ import annotations

import json
import logging
import multiprocessing

import pytest
import torch

from rewrite import optimize, report
from rewrite.models.auk import capture as auk_capture
from rewrite.capture import graph_file
from rewrite.models.wan import capture as wan_capture
from rewrite.models.auk.model import AuKConfig, AuKVAE
from rewrite.models.wan.config import build_wan
from rewrite.ops import selftest
from rewrite.pipeline import rewrite_graph
from rewrite.runtime import disk_cache, guards

MICRO = AuKConfig(latent_dim=8, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4), upsample_initial_channel=16,
                  resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3),))


def micro_auk(seed: int = 0) -> AuKVAE:
    torch.manual_seed(seed)
    return AuKVAE(MICRO).eval()


@pytest.fixture
def exports(monkeypatch):
    """Counts the step exports of both capture modules (what a disk-cache hit must skip)."""
    calls = []
    for module in (wan_capture, auk_capture):
        original = module.export_step

        def counted(*args, _original=original, **kwargs):
            calls.append(args[0])
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, "export_step", counted)
    return calls


@pytest.fixture(autouse=True)
def no_cache_from_the_environment(monkeypatch):
    monkeypatch.delenv(disk_cache.ENV_VAR, raising=False)


def entries(directory, kind="graphs"):
    return sorted(p for p in directory.iterdir() if p.name.startswith(kind) and p.suffix == ".json")


def decode_auk(vae, seed=0):
    with torch.no_grad():
        return vae.decode(torch.randn(1, 24, MICRO.latent_dim, generator=torch.Generator().manual_seed(seed)))


# ---- hits ---------------------------------------------------------------------------------------------------
def test_a_second_wan_model_with_the_same_cache_dir_skips_the_export_and_decodes_identically(tmp_path, exports):
    z = torch.randn(1, 4, 3, 4, 6, generator=torch.Generator().manual_seed(0))
    first = optimize(build_wan("wan2.1", "tiny"), cache_dir=tmp_path)
    with torch.no_grad():
        expected = first.decode(z).sample
    assert exports == ["chunk0", "steady"] and len(entries(tmp_path)) == 1
    second = optimize(build_wan("wan2.1", "tiny"), cache_dir=tmp_path)
    with torch.no_grad():
        got = second.decode(z).sample
        reference = build_wan("wan2.1", "tiny").decode(z).sample
    assert exports == ["chunk0", "steady"]  # nothing exported again
    summary = report(second)
    assert summary.last_path == "graphs" and {g.source for g in summary.graphs} == {"disk cache"}
    assert [t.stage for t in summary.first_call] == ["disk cache load", "disk cache load"]
    assert "2 loaded" in summary.disk_cache and "disk cache" in str(summary)
    assert torch.equal(got, expected) and torch.equal(got, reference)
    # the entry holds names and shapes, not weights: far smaller than them, and no long list of numbers
    entry = entries(tmp_path)[0]
    weight_bytes = sum(p.numel() * p.element_size() for p in second.decoder.parameters())
    assert entry.stat().st_size < weight_bytes / 4
    assert _longest_number_list(json.loads(entry.read_text())) <= 8


def _longest_number_list(value) -> int:
    if isinstance(value, list):
        own = len(value) if value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value) else 0
        return max([own] + [_longest_number_list(v) for v in value])
    if isinstance(value, dict):
        return max([0] + [_longest_number_list(v) for v in value.values()])
    return 0


def test_an_entry_depends_on_no_weight_value(tmp_path):
    """Two models with other weights write byte-identical entries: no value of theirs is in the file."""
    for seed in (0, 1):
        decode_auk(optimize(micro_auk(seed), cache_dir=tmp_path / str(seed)))
    (a,), (b,) = entries(tmp_path / "0"), entries(tmp_path / "1")
    assert a.name == b.name and a.read_bytes() == b.read_bytes()


def test_the_environment_variable_turns_the_cache_on_and_false_turns_it_off(tmp_path, monkeypatch, exports):
    monkeypatch.setenv(disk_cache.ENV_VAR, str(tmp_path))
    decode_auk(optimize(micro_auk()))
    assert len(entries(tmp_path)) == 1 and exports == ["decode"]
    decode_auk(optimize(micro_auk()))  # read back
    assert exports == ["decode"]
    vae = optimize(micro_auk(), cache_dir=False)
    decode_auk(vae)
    assert exports == ["decode", "decode"] and report(vae).disk_cache is None


@pytest.mark.parametrize("option, error", [(3, TypeError), (True, TypeError), ("", ValueError)])
def test_a_bad_cache_dir_is_refused_by_optimize(option, error):
    with pytest.raises(error, match="cache_dir"):
        optimize(micro_auk(), cache_dir=option)
    with pytest.raises(error, match="cache_dir"):
        optimize(build_wan("wan2.1", "tiny"), cache_dir=option)


# ---- keys ---------------------------------------------------------------------------------------------------
def _key(model, root, **changes):
    arguments = dict(model_name="auk", model=model, root=root, graphs=["decode"], dtype=torch.float32,
                     device=torch.device("cpu"), level="lossless", rewrite_graph=rewrite_graph)
    arguments.update(changes)
    listing = list(model.decoder.named_modules(prefix="decoder"))
    return disk_cache.graph_key(snapshot=guards.ModuleSnapshot.of(listing), **arguments)


def test_every_change_that_could_change_the_graphs_changes_the_key(monkeypatch):
    vae = micro_auk()
    base = _key(vae, vae)
    assert _key(micro_auk(1), micro_auk(1)) == base  # other weights: the same key
    assert _key(vae, vae, dtype=torch.bfloat16) != base
    assert _key(vae, vae, level="channels_last") != base
    assert _key(vae, vae, device=torch.device("meta")) != base
    assert _key(vae, vae, graphs=["other"]) != base
    other = AuKVAE(AuKConfig(**{**MICRO.__dict__, "upsample_initial_channel": 24})).eval()
    assert _key(other, other) != base  # config (and shapes)
    half = micro_auk().to(torch.bfloat16)
    assert _key(half, half) != base  # the weights' dtype
    strided = micro_auk()
    strided.decoder.conv_pre.weight.data = strided.decoder.conv_pre.weight.data.transpose(1, 2).contiguous().transpose(1, 2)
    assert _key(strided, strided) != base  # the weights' strides
    edited = micro_auk()
    edited.decoder.conv_pre.padding_mode = "reflect"
    assert _key(edited, edited) != base  # a module setting
    assert _key(vae, vae, rewrite_graph=lambda graph, level: None) is None  # an unnamed pipeline: not cached
    monkeypatch.setattr(disk_cache, "project_hash", lambda: "edited sources")
    assert _key(vae, vae) != base
    monkeypatch.setattr(disk_cache, "_versions", lambda: {"torch": "9.9"})
    assert _key(vae, vae)["versions"] == {"torch": "9.9"}


def test_a_wan_key_follows_its_config():
    def key(vae, dtype=torch.float32):
        listing = list(vae.decoder.named_modules(prefix="decoder"))
        return disk_cache.graph_key(model_name="wan", model=vae, root=vae.decoder, graphs=["chunk0", "steady"],
                                    snapshot=guards.ModuleSnapshot.of(listing), dtype=dtype,
                                    device=torch.device("cpu"), level="lossless", rewrite_graph=rewrite_graph)
    base = key(build_wan("wan2.1", "tiny"))
    assert key(build_wan("wan2.1", "tiny", seed=3)) == base
    assert key(build_wan("wan2.2", "tiny")) != base
    changed = build_wan("wan2.1", "tiny")
    changed.register_to_config(scale_factor_temporal=2)  # a config entry no module reads: still a miss
    assert key(changed)["config"] != base["config"]


def test_a_key_is_the_same_in_another_process():
    """Keys must not depend on the process (hash seeds, set orders): a spawned process computes the same one."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        theirs = pool.apply(_key_in_a_process)
    assert theirs == _key_in_a_process()


def _key_in_a_process() -> dict:
    vae = build_wan("wan2.1", "tiny")
    listing = list(vae.decoder.named_modules(prefix="decoder"))
    return disk_cache.graph_key(model_name="wan", model=vae, root=vae.decoder, graphs=["chunk0", "steady"],
                                snapshot=guards.ModuleSnapshot.of(listing), dtype=torch.float32,
                                device=torch.device("cpu"), level="lossless", rewrite_graph=rewrite_graph)


def test_a_level_change_misses_and_captures_again(tmp_path, exports):
    decode_auk(optimize(micro_auk(), "lossless", cache_dir=tmp_path))
    decode_auk(optimize(micro_auk(), "channels_last", cache_dir=tmp_path))
    assert exports == ["decode", "decode"] and len(entries(tmp_path)) == 2


# ---- untrusted entries ----------------------------------------------------------------------------------------
def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_number(path):
    entry = json.loads(path.read_text())
    nodes = entry["payload"]["graphs"][0]["nodes"]
    call = next(n for n in nodes if n[0] == "call_function" and any(isinstance(a, int) for a in n[3]["tuple"]))
    index = next(i for i, a in enumerate(call[3]["tuple"]) if isinstance(a, int))
    call[3]["tuple"][index] += 1
    path.write_text(json.dumps(entry))


def _stale_key(path):
    entry = json.loads(path.read_text())
    entry["key"]["level"] = "some other level"
    path.write_text(json.dumps(entry))


def _foreign_parameter(path):
    """A well-formed entry (checksum recomputed) whose graph reads a parameter the module lacks."""
    entry = json.loads(path.read_text())
    graph = entry["payload"]["graphs"][0]
    kind = next(k for k in graph["input_kinds"] if k[0] == "param")
    kind[1] = "decoder.no_such.weight"
    entry["sha256"] = disk_cache._digest(entry["payload"])
    path.write_text(json.dumps(entry))


@pytest.mark.parametrize("spoil, logged", [
    (_truncate, "truncated or corrupt"),
    (lambda p: p.write_bytes(b"\x00garbage"), "truncated or corrupt"),
    (_flip_a_number, "checksum mismatch"),
    (_stale_key, "stale"),
    (_foreign_parameter, "no_such"),
], ids=("truncated", "garbage", "edited", "stale-key", "foreign-parameter"))
def test_an_untrusted_entry_is_logged_ignored_and_rebuilt(tmp_path, exports, caplog, spoil, logged):
    expected = decode_auk(optimize(micro_auk(), cache_dir=tmp_path))
    (entry,) = entries(tmp_path)
    spoil(entry)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        vae = optimize(micro_auk(), cache_dir=tmp_path)
        got = decode_auk(vae)
    assert logged in caplog.text and exports == ["decode", "decode"]
    assert torch.equal(got, expected) and report(vae).last_path == "graphs"
    assert "ignored" in report(vae).disk_cache
    decode_auk(optimize(micro_auk(), cache_dir=tmp_path))  # rebuilt: read back now
    assert exports == ["decode", "decode"]


def test_an_unwritable_directory_is_logged_and_the_decode_still_serves(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        vae = optimize(micro_auk(), cache_dir=blocker / "cache")
        decode_auk(vae)
    assert "cannot write" in caplog.text and report(vae).last_path == "graphs"


# ---- concurrent writers ---------------------------------------------------------------------------------------
def _optimize_and_decode(directory: str, barrier) -> bool:
    torch.set_num_threads(1)
    vae = micro_auk()
    barrier.wait()  # both processes export, rewrite and write the same entry at about the same time
    optimize(vae, cache_dir=directory)
    decode_auk(vae)
    return report(vae).last_path == "graphs"


def test_two_processes_writing_one_entry_at_once_both_succeed_and_leave_a_valid_entry(tmp_path, exports):
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        barrier = manager.Barrier(2)
        with context.Pool(2) as pool:
            results = [pool.apply_async(_optimize_and_decode, (str(tmp_path), barrier)) for _ in range(2)]
            assert [r.get(timeout=300) for r in results] == [True, True]
    assert len(entries(tmp_path)) == 1 and not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind
    vae = optimize(micro_auk(), cache_dir=tmp_path)
    decode_auk(vae)
    assert exports == [] and report(vae).disk_cache.startswith(f"{tmp_path}: graphs 1 loaded")


def _write_many(directory: str, tag: int) -> None:
    cache = disk_cache.DiskCache(disk_cache.pathlib.Path(directory))
    key = {"model": "stress", "graphs": []}
    for i in range(300):
        cache._write(cache._path("graphs", key), key, {"writer": tag, "i": i, "pad": "x" * (5000 * (1 + i % 7))})


def test_readers_see_a_whole_entry_while_two_processes_rewrite_it(tmp_path):
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_write_many, args=(str(tmp_path), tag)) for tag in (1, 2)]
    for w in writers:
        w.start()
    cache, key = disk_cache.DiskCache(tmp_path), {"model": "stress", "graphs": []}
    path, seen = cache._path("graphs", key), 0
    while any(w.is_alive() for w in writers):
        if path.exists():
            assert cache._read(path, key) is not None  # never a part of an entry
            seen += 1
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert seen > 0 and cache.stats.rejected == 0 and cache._read(path, key)["i"] == 299
    assert not list(tmp_path.glob(".*.tmp"))


# ---- self-check verdicts ----------------------------------------------------------------------------------------
def test_self_check_verdicts_round_trip_through_the_cache_and_a_corrupt_file_is_ignored(tmp_path, monkeypatch, caplog):
    device = torch.device("cpu")  # verdicts are only ever computed on CUDA; records are device-agnostic
    for name in ("_RESULTS", "_CONV_RESULTS", "_FRAME_CONV_RESULTS", "_STRIDED_CONV_RESULTS"):
        monkeypatch.setattr(selftest, name, {})
    records = [
        {"check": "silu", "dtype": "torch.bfloat16", "exact": True},
        {"check": "channels_last_conv", "input": [1, 8, 3, 6, 8], "weight": [8, 8, 3, 3, 3], "padding": [0, 1, 1],
         "dtype": "torch.float32", "settings": [True, False, False, True], "exact": False},
        {"check": "frame_conv", "input": [1, 8, 2, 4, 4], "weight": [16, 8, 1, 1, 1], "dtype": "torch.float16",
         "settings": [True, False, False, True], "exact": True},
        {"check": "strided_channels_last_conv", "input": [4, 8, 9, 11], "weight": [8, 8, 3, 3], "stride": [2, 2],
         "dtype": "torch.bfloat16", "settings": [True, False, False, True], "exact": True},
    ]
    assert selftest.adopt(device, records) == 4 and selftest.adopt(device, records) == 0
    cache = disk_cache.DiskCache(tmp_path)
    assert cache.save_verdicts(device) == 4 and cache.save_verdicts(device) == 0  # nothing new: not written again
    for name in ("_RESULTS", "_CONV_RESULTS", "_FRAME_CONV_RESULTS", "_STRIDED_CONV_RESULTS"):
        monkeypatch.setattr(selftest, name, {})
    assert disk_cache.DiskCache(tmp_path).load_verdicts(device) == 4
    assert sorted(map(json.dumps, selftest.verdicts(device))) == sorted(map(json.dumps, records))
    assert selftest._CONV_RESULTS[((1, 8, 3, 6, 8), (8, 8, 3, 3, 3), (0, 1, 1), torch.float32, "cpu",
                                   (True, False, False, True))] is False
    (path,) = entries(tmp_path, "selfchecks")
    _truncate(path)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        assert disk_cache.DiskCache(tmp_path).load_verdicts(device) == 0
    assert "truncated or corrupt" in caplog.text
    with pytest.raises(ValueError, match="malformed self-check record"):
        selftest.adopt(device, [{"check": "silu", "dtype": "torch.bfloat16", "exact": "yes"}])


def test_a_graph_that_cannot_be_written_as_data_is_refused_by_the_encoder():
    vae = micro_auk()
    graph = auk_capture.capture_auk_decode(vae, torch.float32, torch.device("cpu"))
    graph.graph_module.register_buffer("some_attribute", torch.zeros(1))
    graph.graph_module.graph.get_attr("some_attribute")
    with pytest.raises(graph_file.GraphFileError, match="get_attr"):
        graph_file.encode(graph)
