"""AuK decode capture: bit-identity with eager, structural goldens, optimize/report, fallbacks, bad latents.

One tiny random-init AuKVAE (non-trivial SnakeBeta parameters and latent statistics) is shared by the
module: its optimized copy captures once (batch and frames dynamic), then serves every exactness test.
The goldens capture the tiny decoder once more (canonical, rewritten per level on copies) and the full
decoder once on the meta device (export runs on fake tensors: no 114.5 M weights are allocated).
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.fx as fx

from rewrite import optimize, report
from rewrite.models.auk.capture import capture_auk_decode
from rewrite.models.auk.model import AuKConfig, AuKVAE
from rewrite.passes.canonicalize import canonicalize
from rewrite.pipeline import rewrite_graph
from rewrite.models.auk import runner as auk_runtime
from tests.captures import copy_graph

# Match counts per pattern (nonzero only) on the decode graph; the same for every channel width.
# 6 stages x 3 AMP blocks x 3 residual units x 2 activations + activation_post = 109 activations;
# per unit a causal conv (convs1) and a causal conv + residual add (convs2); conv_post has no bias.
LOSSLESS = {
    "alias_free_activation[exact]": 109,
    "causal_conv1d": 54,
    "causal_conv1d[residual=None]": 54,
    "causal_conv1d[residual=None, bias=None]": 1,
    "causal_conv_transpose1d": 6,
    "amp_average": 6,
}
# channels_last: the fused activation, then every activation -> causal conv pair (all 109: each conv reads an
# activation) fused once more so that the activation kernel writes the conv's zero pad; on CUDA graphs, then in
# each of the 54 residual units the first conv's bias deferred into the second activation kernel (CPU graphs
# keep it in the conv: a CPU conv may fold its bias into the sum).
CHANNELS_LAST = {**{k: v for k, v in LOSSLESS.items() if "alias_free" not in k}, "alias_free_activation[fused]": 109,
                 "snake_causal_conv1d": 54, "snake_causal_conv1d[residual=None]": 54,
                 "snake_causal_conv1d[residual=None, bias=None]": 1}
CHANNELS_LAST_CUDA = {**CHANNELS_LAST, "deferred_conv_bias[residual_unit=True]": 54}
#: ATen ops left after the lossless rewrite: the latent denormalisation, conv_pre, clamp and squeeze
REMAINING_ATEN = {"sym_size.int", "sqrt.default", "mul.Tensor", "add.Tensor", "transpose.int", "conv1d.default",
                  "clamp.default", "squeeze.dim"}


def make_vae(seed: int = 0) -> AuKVAE:
    """Tiny random-init AuKVAE with non-trivial SnakeBeta parameters and latent statistics."""
    torch.manual_seed(seed)
    vae = AuKVAE(AuKConfig.tiny()).eval()
    with torch.no_grad():
        for name, param in vae.named_parameters():
            if name.endswith(("alpha", "beta")):
                param.normal_(0.0, 0.3)
        vae.global_mean.normal_()
        vae.global_log_std.uniform_(0.5, 2.0)
    return vae


def latents(batch: int, frames: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, frames, AuKConfig.tiny().latent_dim, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def pair() -> tuple[AuKVAE, AuKVAE]:
    """(reference, optimized at lossless) with the same weights."""
    reference = make_vae()
    return reference, optimize(copy.deepcopy(reference))


def nonzero(matches: dict[str, int]) -> dict[str, int]:
    return {name: count for name, count in matches.items() if count}


@pytest.fixture(scope="module")
def tiny_graph():
    """The tiny decode graph as captured (canonicalized), and the model it was captured from."""
    vae = make_vae()
    graph = capture_auk_decode(vae, torch.float32, torch.device("cpu"))
    canonicalize(graph.graph_module)
    return vae, graph


# --------------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("batch, frames", [(1, 3), (2, 3), (1, 5), (2, 5), (1, 1)])
def test_rewritten_decode_is_bit_identical_to_eager(pair, batch, frames):
    reference, optimized = pair
    z = latents(batch, frames, seed=batch * 10 + frames)
    with torch.no_grad():
        expected, got = reference.decode(z), optimized.decode(z)
    assert got.shape == (batch, frames * reference.config.hop_length)
    assert torch.equal(got, expected)
    summary = report(optimized)
    assert summary.last_path == "graphs", summary.last_reason
    assert len(summary.graphs) == 1, "one capture serves every batch and length"


def test_forward_goes_through_the_graph_too(pair):
    reference, optimized = pair
    z = latents(1, 2)
    with torch.no_grad():
        assert torch.equal(optimized(z), reference(z))
    assert report(optimized).last_path == "graphs"


def test_weights_are_read_at_call_time(pair):
    """load_state_dict after optimize takes effect on the next decode (parameters are read by name)."""
    reference, optimized = pair
    state = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
             for k, v in reference.state_dict().items()}
    original = copy.deepcopy(reference.state_dict())
    try:
        reference.load_state_dict(state)
        optimized.load_state_dict(state)
        z = latents(1, 2)
        with torch.no_grad():
            assert torch.equal(optimized.decode(z), reference.decode(z))
    finally:
        reference.load_state_dict(original)
        optimized.load_state_dict(original)


def test_deepcopy_of_an_optimized_model_decodes_with_its_own_weights(pair):
    reference, optimized = pair
    twin, twin_reference = copy.deepcopy(optimized), copy.deepcopy(reference)
    assert twin._rewrite_runner.vae is twin
    with torch.no_grad():
        for model in (twin, twin_reference):
            model.decoder.conv_post.weight.mul_(0.5)
        z = latents(1, 2)
        assert torch.equal(twin.decode(z), twin_reference.decode(z))
        assert torch.equal(optimized.decode(z), reference.decode(z))
    assert report(twin).last_path == "graphs"


def _twins_after_a_decode(pair, z):
    """Copies of (optimized, reference) whose graph has resolved its weights' owners with one decode."""
    reference, optimized = pair
    twin, twin_reference = copy.deepcopy(optimized), copy.deepcopy(reference)
    with torch.no_grad():
        twin.decode(z)
    return twin, twin_reference


def test_replaced_parameters_and_submodules_are_read_after_capture(pair):
    """`CapturedGraph.weights` resolves each weight's owner once; a replaced attribute or submodule is seen."""
    z = latents(1, 3)
    twin, twin_reference = _twins_after_a_decode(pair, z)
    with torch.no_grad():
        for model in (twin, twin_reference):
            conv = model.decoder.conv_post
            conv.weight = torch.nn.Parameter(conv.weight * 0.25)  # a new Parameter on the same module
        assert torch.equal(twin.decode(z), twin_reference.decode(z))
        replacement = copy.deepcopy(twin_reference.decoder.conv_pre)
        replacement.weight.mul_(-1.0)
        twin.decoder.conv_pre = replacement  # a new submodule: the owner path is resolved again
        twin_reference.decoder.conv_pre = copy.deepcopy(replacement)
        assert torch.equal(twin.decode(z), twin_reference.decode(z))
        del twin.decoder.conv_post.weight  # gone: the by-name lookup raises what torch raises
        with pytest.raises(AttributeError):
            twin.decode(z)


def test_a_parameter_replaced_by_a_plain_tensor_takes_the_reference_path(pair):
    """Eager reads `conv.weight` whatever it is; the graph reads parameters only, so it hands over."""
    z = latents(1, 3)
    twin, twin_reference = _twins_after_a_decode(pair, z)
    with torch.no_grad():
        for model in (twin, twin_reference):
            conv = model.decoder.conv_post
            weight = conv.weight * 0.25
            del conv.weight
            conv.weight = weight  # a plain tensor attribute, no longer in _parameters
        assert torch.equal(twin.decode(z), twin_reference.decode(z))
    summary = report(twin)
    assert summary.last_path == "reference" and "decoder.conv_post.weight" in summary.last_reason


# --------------------------------------------------------------------------------------------- goldens


def test_tiny_match_counts_in_the_optimized_model(pair):
    reference, optimized = pair
    with torch.no_grad():
        optimized.decode(latents(1, 2))
    [graph] = report(optimized).graphs
    assert graph.name == "decode" and graph.passes == ["canonicalize", "fuse_patterns", "chain_block_norms", "drop_redundant_clones"]
    assert nonzero(graph.matches) == LOSSLESS


@pytest.mark.parametrize("level, on_cuda, expected", [("lossless", False, LOSSLESS),
                                                     ("channels_last", False, CHANNELS_LAST),
                                                     ("channels_last", True, CHANNELS_LAST_CUDA)])
def test_tiny_match_counts_per_level(monkeypatch, tiny_graph, level, on_cuda, expected):
    """Per level; `on_cuda`: the CPU capture stands in for a CUDA one (the guards' device test patched), so
    the CUDA-only deferred conv bias matches too (structure only)."""
    if on_cuda:
        from rewrite.ops import dispatch

        monkeypatch.setattr(dispatch, "conv_bias_is_separate", lambda device: True)
    _, captured = tiny_graph
    graph = copy_graph(captured)
    rewrite_graph(graph, level)
    assert nonzero(graph.matches) == expected
    left = {str(n.target).replace("aten.", "") for n in graph.graph_module.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("aten.")}
    assert left == REMAINING_ATEN  # every pad, transposed conv, snake op and slice went into a custom op


def test_channels_last_graph_is_within_tolerance(tiny_graph):
    """The fused alias-free op is a tolerance op: compare the rewritten graph with eager, not for equality."""
    vae, captured = tiny_graph
    graph = copy_graph(captured)
    rewrite_graph(graph, "channels_last")
    z = latents(2, 4)
    with torch.no_grad():
        (got,) = graph(graph.weights(vae), z)
        expected = vae.decode(z)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_full_size_match_counts_on_the_meta_device():
    with torch.device("meta"):
        vae = AuKVAE(AuKConfig())
    assert vae.num_parameters() == 114_534_192
    graph = capture_auk_decode(vae, torch.float32, torch.device("meta"))
    rewrite_graph(graph, "lossless")
    assert nonzero(graph.matches) == LOSSLESS


def _structure(graph) -> list[tuple]:
    """The graph's call_function nodes in order, with node arguments numbered by position (names differ
    between captures)."""
    index = {n: i for i, n in enumerate(graph.graph_module.graph.nodes)}
    as_data = lambda a: f"%{index[a]}" if isinstance(a, fx.Node) else repr(a)  # noqa: E731
    return [(str(n.target), tuple(fx.node.map_aggregate(n.args, as_data)), tuple(sorted(n.kwargs)))
            for n in graph.graph_module.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("level", ["lossless", "channels_last"])
def test_activation_op_and_aten_captures_rewrite_to_the_same_graph(tiny_graph, level):
    """The capture records each activation as `alias_free_snake_module`; with `activations_as_ops=False` it
    records the module's ATen ops, which the `[..., aten]` patterns match: both rewrite to the same graph."""
    vae, captured = tiny_graph
    assert sum(n.target == torch.ops.rewrite.alias_free_snake_module.default
               for n in captured.graph_module.graph.nodes) == 109
    as_ops = copy_graph(captured)
    rewrite_graph(as_ops, level)
    as_aten = capture_auk_decode(vae, torch.float32, torch.device("cpu"), activations_as_ops=False)
    canonicalize(as_aten.graph_module)
    assert not any(n.target == torch.ops.rewrite.alias_free_snake_module.default for n in as_aten.graph_module.graph.nodes)
    rewrite_graph(as_aten, level)
    impl = "exact" if level == "lossless" else "fused"
    assert as_aten.matches[f"alias_free_activation[{impl}, aten]"] == 109
    assert as_aten.matches[f"alias_free_activation[{impl}]"] == 0
    assert _structure(as_aten) == _structure(as_ops)
    assert not any("forward" in m.__dict__ for m in vae.modules())  # the capture's instance forwards are gone


def test_capture_keeps_batch_and_frames_symbolic(tiny_graph):
    _, graph = tiny_graph
    [z] = [n for n in graph.graph_module.graph.nodes if n.op == "placeholder" and n.name == "z"]
    batch, frames, latent = z.meta["val"].shape
    assert isinstance(batch, torch.SymInt) and isinstance(frames, torch.SymInt) and latent == 8
    assert len(graph.range_constraints) == 2


# --------------------------------------------------------------------------------------------- API


def test_optimize_returns_the_same_object_and_keeps_the_state_dict():
    vae = make_vae()
    params = dict(vae.named_parameters())
    keys = list(vae.state_dict())
    assert optimize(vae) is vae
    assert list(vae.state_dict()) == keys
    assert all(p is params[name] for name, p in vae.named_parameters())
    assert set(vae.__dict__) - set(make_vae().__dict__) == {"decode", "decode_tiles", "_rewrite_runner"}


def test_optimize_twice_keeps_the_graph(pair):
    reference, optimized = pair
    with torch.no_grad():
        optimized.decode(latents(1, 2))
    before = report(optimized).graphs
    assert optimize(optimized) is optimized
    with torch.no_grad():
        assert torch.equal(optimized.decode(latents(1, 2)), reference.decode(latents(1, 2)))
    assert len(report(optimized).graphs) == len(before) == 1


def test_level_off_removes_everything():
    vae = make_vae()
    attributes = set(vae.__dict__)
    optimize(vae)
    optimize(vae, level="off")
    assert set(vae.__dict__) == attributes
    assert report(vae).level == "off"
    assert vae.decode.__func__ is AuKVAE.decode


def test_report_is_printable(pair):
    _, optimized = pair
    with torch.no_grad():
        optimized.decode(latents(1, 2))
    summary = report(optimized)
    assert summary.model == "AuKVAE" and summary.level == "lossless"
    [graph] = summary.graphs
    assert graph.dtype == "torch.float32" and graph.device == "cpu" and graph.capture_seconds > 0
    assert "decode" in str(summary) and "alias_free_activation[exact]=109" in str(summary)


# --------------------------------------------------------------------------------------------- fallbacks


@pytest.mark.parametrize("bad", [torch.zeros(2, 8), torch.zeros(1, 3, 5), torch.zeros(1, 0, 8), torch.zeros(0, 3, 8),
                                 [[0.0] * 8]], ids=("rank2", "latent-size", "no-frames", "no-batch", "list"))
def test_bad_latents_raise_the_models_value_error(pair, bad):
    _, optimized = pair
    with pytest.raises(ValueError, match=r"AuKVAE.decode expects normalised latents shaped \[batch, frames, 8\]"):
        with torch.no_grad():
            optimized.decode(bad)


def test_autograd_takes_the_reference_path_and_says_why(pair, caplog):
    reference, optimized = pair
    z = latents(1, 2)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        got = optimized.decode(z)
    summary = report(optimized)
    assert summary.last_path == "reference" and "autograd" in summary.last_reason
    assert any("autograd" in reason for reason in summary.fallbacks)
    assert "autograd" in caplog.text
    assert got.requires_grad  # the reference path kept autograd working
    assert torch.equal(got.detach(), reference.decode(z).detach())


def test_hook_inside_the_decoder_takes_the_reference_path(pair):
    reference, optimized = pair
    calls = []
    z = latents(1, 2)
    with torch.no_grad():
        optimized.decode(z)  # a hook registered after the runner listed the modules is still seen
    handle = optimized.decoder.resblocks[4].activations[1].register_forward_hook(lambda *_: calls.append(1))
    try:
        with torch.no_grad():
            got = optimized.decode(z)
    finally:
        handle.remove()
    summary = report(optimized)
    assert calls, "the user's hook must run"
    assert summary.last_path == "reference" and "decoder.resblocks.4.activations.1 (hooks)" in summary.last_reason
    with torch.no_grad():
        assert torch.equal(got, reference.decode(z))
        optimized.decode(z)
    assert report(optimized).last_path == "graphs"


def test_latents_unlike_the_parameters_take_the_reference_path(pair):
    reference, optimized = pair
    z = latents(1, 2).half()  # eager promotes in the denormalisation; the fp32 graph is not for fp16 input
    with torch.no_grad():
        got = optimized.decode(z)
        assert torch.equal(got, reference.decode(z))
    summary = report(optimized)
    assert summary.last_path == "reference" and "torch.float16" in summary.last_reason
    assert {(g.dtype, g.device) for g in summary.graphs} == {("torch.float32", "cpu")}


def test_failed_capture_takes_the_reference_path_from_then_on(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("export exploded")

    monkeypatch.setattr(auk_runtime, "capture_auk_decode", broken)
    reference = make_vae()
    optimized = optimize(copy.deepcopy(reference))
    z = latents(1, 2)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(optimized.decode(z), reference.decode(z))
    summary = report(optimized)
    assert summary.graphs == [] and summary.last_path == "reference"
    [(reason, count)] = summary.fallbacks.items()
    assert "capture failed" in reason and "export exploded" in reason and count == 2
