"""Issue 36: a misspelt option, latents of another dtype than the model's, the log lines' wording, and the
CPU graphs of `channels_last` (the `lossless` ops where the fast kernels cannot run)."""

from __future__ import annotations

import copy
import inspect
import logging
import pickle

import pytest
import torch

from rewrite import optimize, report
from rewrite.models.auk.model import AuKConfig, AuKVAE
from rewrite.models.wan.config import build_wan
from rewrite.models.auk.runner import AuKRunner
from rewrite.models.wan.runner import WanRunner

MICRO = AuKConfig(latent_dim=8, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4), upsample_initial_channel=16,
                  resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3),))


def _micro_auk() -> AuKVAE:
    torch.manual_seed(0)
    return AuKVAE(MICRO).eval()


def _installed_state(vae: torch.nn.Module) -> list[dict]:
    """Every module's instance attributes (what `optimize` installs), as (name -> object) maps."""
    return [dict(module.__dict__) for module in vae.modules()]


def _rewrite_records(caplog) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name.split(".")[0] == "rewrite"]


def _same_objects(before: list[dict], after: list[dict]) -> bool:
    return len(before) == len(after) and all(
        a.keys() == b.keys() and all(a[k] is b[k] for k in a) for a, b in zip(before, after))


# ---- options --------------------------------------------------------------------------------------------
def test_a_misspelt_wan_option_names_optimize_the_options_it_takes_and_the_close_match():
    with pytest.raises(TypeError) as caught:
        optimize(build_wan("wan2.1", "tiny"), cachedir="/tmp/nowhere")
    message = str(caught.value)
    assert message.startswith("optimize() got an unexpected option 'cachedir' (did you mean 'cache_dir'?)")
    assert "diffusers.AutoencoderKLWan (Wan 2.1)" in message
    assert "at level 'lossless' it takes cache_dir, graph_memory_budget, group, output" in message


def test_a_misspelt_auk_option_lists_the_options_of_the_level_and_those_of_channels_last_only():
    with pytest.raises(TypeError) as caught:
        optimize(_micro_auk(), "lossless", tile_frame=64, colour="blue")
    message = str(caught.value)
    assert ("unexpected options 'tile_frame' (did you mean 'tile_frames'?), 'colour' for rewrite.models.auk.AuKVAE"
            in message)
    assert ("at level 'lossless' it takes cache_dir, max_graphs; also compile_shapes, cudnn_benchmark, tile_frames, "
            "which act at level 'channels_last' only") in message
    with pytest.raises(TypeError, match="at level 'channels_last' it takes cache_dir, compile_shapes, cudnn_benchmark, "
                                        "max_graphs, tile_frames$"):
        optimize(_micro_auk(), "channels_last", max_graph=4)
    with pytest.raises(TypeError, match=r"it takes cache_dir, graph_memory_budget, group, output \(none acts at level 'off'\)"):
        optimize(build_wan("wan2.1", "tiny"), "off", groups=None)


def test_a_refused_option_leaves_an_optimized_and_a_plain_module_as_they_were():
    vae = optimize(_micro_auk(), "lossless")
    runner, before = vae._rewrite_runner, _installed_state(vae)
    with pytest.raises(TypeError, match="did you mean 'cache_dir'"):
        optimize(vae, "channels_last", cachedir="/tmp/nowhere")
    assert vae._rewrite_runner is runner and runner.level == "lossless"
    assert _same_objects(before, _installed_state(vae))

    plain = build_wan("wan2.1", "tiny")
    before, state = _installed_state(plain), plain.state_dict()
    with pytest.raises(TypeError, match="did you mean 'cache_dir'"):
        optimize(plain, "channels_last", cache_dri=None)
    assert _same_objects(before, _installed_state(plain)) and "_rewrite_runner" not in plain.__dict__
    assert all(torch.equal(value, plain.state_dict()[key]) for key, value in state.items())


@pytest.mark.parametrize("runner_class", [WanRunner, AuKRunner])
def test_the_listed_options_are_the_keyword_options_of_the_runner(runner_class):
    keywords = {name for name, parameter in inspect.signature(runner_class.__init__).parameters.items()
                if parameter.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == set(runner_class.OPTIONS) | set(runner_class.HIDDEN_OPTIONS)


# ---- latents of another dtype ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.int64])
def test_wan_latents_of_another_dtype_are_a_value_error_naming_both_dtypes_before_any_fallback(wan_pair, caplog,
                                                                                               dtype):
    pair = wan_pair("wan2.1")
    z = pair.latents(1, 2).to(dtype)
    with torch.no_grad(), pytest.raises(RuntimeError, match="should be the same"):
        pair.reference.decode(z)  # unmodified diffusers raises too: nothing it serves is refused
    fallbacks = dict(report(pair.optimized).fallbacks)
    with caplog.at_level(logging.DEBUG, logger="rewrite"), torch.no_grad(), \
            pytest.raises(ValueError, match=rf"Wan latents must be torch.float32, .*; got {dtype}"):
        pair.optimized.decode(z)
    assert _rewrite_records(caplog) == [] and dict(report(pair.optimized).fallbacks) == fallbacks
    with torch.no_grad(), pytest.raises(ValueError, match=rf"must be torch.float32, .*; got {dtype}"):
        next(iter(pair.optimized.decode_stream(z)))


def test_wan_under_autocast_serves_what_diffusers_serves(wan_pair):
    pair = wan_pair("wan2.1")
    for z in (pair.latents(1, 2), pair.latents(1, 2).to(torch.bfloat16)):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            expected, got = pair.reference.decode(z).sample, pair.optimized.decode(z).sample
        assert got.dtype == expected.dtype and torch.equal(got, expected)
        assert report(pair.optimized).last_path == "reference"
        assert "autocast" in report(pair.optimized).last_reason


@pytest.mark.parametrize("optimized", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64])
def test_auk_latents_the_decoder_cannot_take_are_a_value_error_naming_both_dtypes(caplog, optimized, dtype):
    vae = optimize(_micro_auk(), "lossless") if optimized else _micro_auk()
    with caplog.at_level(logging.DEBUG, logger="rewrite"), torch.no_grad(), \
            pytest.raises(ValueError, match=rf"expects latents of the model's dtype torch.float32.*; got {dtype}"):
        vae.decode(torch.zeros(1, 5, MICRO.latent_dim, dtype=dtype))
    assert _rewrite_records(caplog) == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64])
def test_auk_latents_the_reference_promotes_are_served_as_the_reference_serves_them(dtype):
    reference = _micro_auk()
    vae = optimize(copy.deepcopy(reference), "lossless")
    z = (4 * torch.randn(1, 7, MICRO.latent_dim, generator=torch.Generator().manual_seed(1))).to(dtype)
    with torch.no_grad():
        expected, got = reference.decode(z), vae.decode(z)
    assert got.dtype == expected.dtype == torch.float32 and torch.equal(got, expected)


def test_auk_under_autocast_serves_what_the_reference_serves():
    reference = _micro_auk()
    vae = optimize(copy.deepcopy(reference), "lossless")
    z = torch.randn(1, 7, MICRO.latent_dim, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected, got = reference.decode(z), vae.decode(z)
    assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert report(vae).last_path == "reference" and "autocast" in report(vae).last_reason


# ---- log lines ------------------------------------------------------------------------------------------
def test_log_lines_do_not_repeat_the_logger_name(caplog):
    with caplog.at_level(logging.DEBUG, logger="rewrite"):
        vae = optimize(_micro_auk(), "lossless")
        report(pickle.loads(pickle.dumps(vae)))  # the first use of a loaded module optimizes it again
        vae.decode(torch.zeros(1, 5, MICRO.latent_dim))  # grad mode on, parameters requiring grad: a fallback
    messages = [record.getMessage() for record in caplog.records if record.name.split(".")[0] == "rewrite"]
    assert "AuKVAE optimized at level 'lossless'" in messages
    assert "AuKVAE loaded from a pickle, optimized again at level 'lossless'" in messages
    assert any(message.startswith("reference path taken: ") for message in messages)
    assert not [message for message in messages if message.startswith("rewrite")]


# ---- channels_last on the CPU ---------------------------------------------------------------------------
def test_channels_last_graphs_on_the_cpu_are_the_lossless_graphs(monkeypatch):
    """Without the Triton interpreter (which the tests turn on) no fast kernel runs on the CPU, so every node
    of the `channels_last` graphs runs its `lossless` op: the same graphs, the same code."""
    from rewrite.ops import dispatch

    monkeypatch.setattr(dispatch, "INTERPRETING", False)
    z = torch.randn(1, 4, 2, 4, 6, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    codes, outputs = {}, {}
    for level in ("lossless", "channels_last"):
        vae = optimize(build_wan("wan2.1", "tiny").to(torch.bfloat16), level)
        with torch.no_grad():
            outputs[level] = vae.decode(z).sample
        assert report(vae).last_path == "graphs"
        graphs = vae._rewrite_runner.graphs.values.values()
        codes[level] = [graph.graph_module.code for pair in graphs for graph in pair]
    assert codes["channels_last"] == codes["lossless"]
    assert torch.equal(outputs["channels_last"], outputs["lossless"])
