"""AuK reference decoder (rewrite/models/auk/model.py): shapes, decode context, checkpoints.

CPU only and fast: the decode tests use `AuKConfig.tiny()` (default strides, kernels and dilations,
channels 128 -> 2) in float64; the full-size model is only built on the meta device.
"""

from __future__ import annotations

import json
import logging
import math
import re
from fractions import Fraction

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from rewrite.models.auk.model import (
    AliasFreeSnakeBeta,
    AuKConfig,
    AuKVAE,
    checkpoint_layout,
    decode_context_frames,
    load_checkpoint,
    receptive_field,
    save_checkpoint,
    weight_norm_state_dict,
)

TINY = AuKConfig.tiny()
HOP = 480


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The decoder is thousands of small ops: one intra-op thread avoids OpenMP spin-waits on a shared box."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def randomized(config: AuKConfig = TINY, seed: int = 0, dtype=torch.float64, post_gain: float = 0.05) -> AuKVAE:
    """A model with random weights scaled to keep activations O(1) and the output well inside the clamp."""
    generator = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return std * torch.randn(shape, generator=generator)

    model = AuKVAE(config)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
                fan_in = module.in_channels * module.kernel_size[0] / module.stride[0]
                gain = 0.5 if ".resblocks." in name else 1.0
                module.weight.copy_(normal(module.weight.shape, gain / math.sqrt(fan_in)))
                if module.bias is not None:
                    module.bias.copy_(normal(module.bias.shape, 0.02))
            elif hasattr(module, "alpha"):
                module.alpha.copy_(normal(module.alpha.shape, 0.3))
                module.beta.copy_(normal(module.beta.shape, 0.3))
        model.decoder.conv_post.weight.mul_(post_gain)
    return model.to(dtype).eval()


def latents(frames: int, config: AuKConfig = TINY, batch: int = 1, seed: int = 1, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, frames, config.latent_dim, generator=generator).to(dtype)


@torch.no_grad()
def decode_frames(model: AuKVAE, z: torch.Tensor) -> torch.Tensor:
    """Decode one clip and view it as ``[frames, hop]``."""
    return model.decode(z)[0].view(z.shape[1], HOP)


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


def test_default_config_geometry():
    config = AuKConfig()
    assert config.hop_length == HOP and TINY.hop_length == HOP
    assert config.stage_channels() == (768, 384, 192, 96, 48, 24)
    assert TINY.stage_channels()[-1] == 2


def test_from_dict_ignores_training_keys_and_makes_tuples(caplog):
    values = {"latent_dim": 64, "upsample_rates": [5, 4, 3, 2, 2, 2], "resblock_dilation_sizes": [[1, 3, 5]] * 3}
    with caplog.at_level(logging.DEBUG, logger="rewrite.models.auk.model"):
        config = AuKConfig.from_dict({**values, "lambda_adv": 1.0, "segment_size": 8192})
    assert config == AuKConfig()
    assert "lambda_adv" in caplog.text and "segment_size" in caplog.text


def test_non_causal_config_is_rejected():
    with pytest.raises(ValueError, match="causal"):
        AuKConfig(act_causal=False)


# --------------------------------------------------------------------------------------------------
# Decode
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 2, 7, 30])
def test_alias_free_activation_keeps_length(length):
    activation = AliasFreeSnakeBeta(3)
    assert activation(torch.randn(2, 3, length)).shape == (2, 3, length)


def test_decode_length_and_clamp():
    model = randomized(post_gain=1.0)  # loud on purpose: the clamp must bite
    wave = model.decode(latents(6, batch=2))
    assert wave.shape == (2, 6 * HOP)
    assert wave.abs().max() == 1.0 and (wave.abs() == 1.0).any()
    quiet = randomized().decode(latents(6))
    assert 0.0 < quiet.abs().max() < 1.0  # the scaling used by the context tests leaves the clamp idle


@pytest.mark.parametrize(
    "shape, problem",
    [((8, 5), "rank 2"), ((1, 5, 7), "latent size 7"), ((1, 0, 8), "zero frames"), ((1, 5, 8, 1), "rank 4")],
)
def test_bad_latent_shapes_raise(shape, problem):
    model = AuKVAE(TINY)
    with pytest.raises(ValueError, match=rf"shaped \[batch, frames, 8\].*{problem}"):
        model.decode(torch.zeros(shape))


def test_pad_latent_denormalises_to_zero():
    model = randomized()
    generator = torch.Generator().manual_seed(3)
    model.global_mean.copy_(torch.randn(TINY.latent_dim, generator=generator))
    model.global_log_std.copy_(torch.rand(TINY.latent_dim, generator=generator) + 0.1)  # a variance
    pad = model.pad_latent()
    assert pad.shape == (TINY.latent_dim,)
    raw = pad * model.global_log_std.sqrt() + model.global_mean
    torch.testing.assert_close(raw, torch.zeros_like(raw), atol=1e-15, rtol=0)
    with torch.no_grad():
        from_pad = model.decode(pad.expand(1, 4, -1))
        from_zero = model.decoder(torch.zeros(1, TINY.latent_dim, 4, dtype=torch.float64)).squeeze(1)
    torch.testing.assert_close(from_pad, from_zero, atol=1e-13, rtol=0)


# --------------------------------------------------------------------------------------------------
# Decode context (receptive field)
# --------------------------------------------------------------------------------------------------


def test_decode_context_frames_default_geometry():
    # Exact sample reach, in latent frames: 52.556 to the left, 6.379 to the right.
    assert receptive_field(AuKConfig()) == (Fraction(8409, 160), Fraction(1531, 240))
    # An output frame spans one hop: latent frames F - floor(L) .. F + floor(R + 479/480).
    assert decode_context_frames(AuKConfig()) == (52, 7) == AuKVAE(TINY).decode_context_frames()
    # The start-of-project notes' (53, 9) is a looser, still safe, upper bound.
    left, right = decode_context_frames()
    assert left <= 53 and right <= 9


# A clip, and a window of it whose inner frames [A + LEFT, B - RIGHT) have full context.
LEFT, RIGHT = decode_context_frames(TINY)
CLIP, A, B = 90, 12, 82


@pytest.fixture(scope="module")
def context_case():
    model = randomized()
    z = latents(CLIP)
    poisoned = z.clone()
    poisoned[:, :A] = float("nan")
    poisoned[:, B:] = float("nan")
    return decode_frames(model, z), decode_frames(model, z[:, A:B]), decode_frames(model, poisoned)


def test_window_matches_clip_outside_the_halo(context_case):
    clip, window, _ = context_case
    inner = slice(A + LEFT, B - RIGHT)
    assert inner.stop - inner.start >= 10
    assert clip[inner].abs().max() > 1e-2  # a real signal, not clamped (see test_decode_length_and_clamp)
    # float64: the window and the clip run the same ops on different lengths, so only the summation
    # blocking may differ; ~150 layers of 1e-16-relative rounding on O(10) activations stay far below 1e-12.
    torch.testing.assert_close(window[LEFT : B - A - RIGHT], clip[inner], atol=1e-12, rtol=0)
    # Inside the halo the window sees its own padding, not the clip: it differs.
    assert not torch.allclose(window[:LEFT], clip[A : A + LEFT], atol=1e-6, rtol=0)


def test_context_bound_is_valid_and_tight(context_case):
    """NaN latents outside the window mark exactly the output frames that read them.

    IEEE NaN survives every op that reads it (a zero weight included), so this shows the dependency
    cone itself. A finite perturbation cannot: the cone's edge runs through ~80 edge taps of the
    Kaiser filter (0.002 each) in series and stays far below float64 rounding.
    """
    clip, window, poisoned = context_case
    frame_has_nan = poisoned.isnan().any(dim=1)
    assert not frame_has_nan[A + LEFT : B - RIGHT].any()  # the bound is valid ...
    torch.testing.assert_close(poisoned[A + LEFT : B - RIGHT], clip[A + LEFT : B - RIGHT], atol=1e-12, rtol=0)
    assert frame_has_nan[A + LEFT - 1] and frame_has_nan[B - RIGHT]  # ... and one frame less is not enough:
    # with a halo of LEFT - 1 (or RIGHT - 1) frames, the window would emit a frame that reads latents it lacks.
    assert frame_has_nan[: A + LEFT].all() and frame_has_nan[B - RIGHT :].all()


# --------------------------------------------------------------------------------------------------
# Parameters and checkpoint layout
# --------------------------------------------------------------------------------------------------


def test_default_parameter_count():
    with torch.device("meta"):
        model = AuKVAE()
    count = model.num_parameters()
    assert abs(count - 114.5e6) <= 0.01 * 114.5e6, count


def test_checkpoint_layout_names_and_weight_norm_dim():
    layout = checkpoint_layout()
    assert layout["decoder.conv_pre.weight_g"] == (1536, 1, 1)
    assert layout["decoder.conv_pre.weight_v"] == (1536, 64, 7)
    # ConvTranspose1d weights are [in, out, k]; weight_norm's default dim 0 is the input channels.
    assert layout["decoder.ups.0.weight_g"] == (1536, 1, 1)
    assert layout["decoder.ups.0.weight_v"] == (1536, 768, 10)
    assert layout["decoder.resblocks.17.convs1.2.weight_v"] == (24, 24, 11)
    assert layout["decoder.resblocks.0.activations.5.act.alpha"] == (768,)
    assert layout["decoder.activation_post.act.beta"] == (24,)
    assert layout["decoder.conv_post.weight_v"] == (1, 24, 7) and "decoder.conv_post.bias" not in layout
    assert layout["global_mean"] == layout["global_log_std"] == (64,)
    assert not any(key.endswith(".weight") or "taps" in key for key in layout)


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------


def random_weight_normed_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """A tiny checkpoint whose g is not ||v||: a genuinely weight-normed random model."""
    state = weight_norm_state_dict(randomized(seed=seed, dtype=torch.float32))
    generator = torch.Generator().manual_seed(seed + 1)
    for key in state:
        if key.endswith(".weight_g"):
            state[key] = state[key] * (0.5 + torch.rand(state[key].shape, generator=generator))
    return state


def write(path, state, config: AuKConfig | None = TINY):
    metadata = None if config is None else {"config": json.dumps(config.to_dict())}
    save_file(state, str(path), metadata=metadata)
    return path


def test_loaded_checkpoint_equals_direct_fold(tmp_path):
    state = random_weight_normed_state()
    loaded = load_checkpoint(write(tmp_path / "auk.safetensors", state))
    assert loaded.config == TINY and loaded.unused_keys == ()
    direct = {}
    for key, tensor in state.items():
        if key.endswith(".weight_v"):
            prefix = key[: -len("_v")]
            direct[prefix] = torch._weight_norm(tensor, state[f"{prefix}_g"], 0)
        elif not key.endswith(".weight_g"):
            direct[key] = tensor
    reference = AuKVAE(TINY)
    reference.load_state_dict(direct)
    loaded_state = loaded.state_dict()
    assert loaded_state.keys() == reference.state_dict().keys()
    for key, tensor in reference.state_dict().items():
        assert torch.equal(loaded_state[key], tensor), key
    first_activation = (model.decoder.resblocks[0].activations[0] for model in (loaded, reference))
    assert torch.equal(*(activation.taps for activation in first_activation))


def test_save_checkpoint_round_trip(tmp_path):
    model = randomized(dtype=torch.float32)
    save_checkpoint(model, tmp_path / "auk.safetensors")
    assert "decoder.ups.3.weight_g" in load_file(str(tmp_path / "auk.safetensors"))
    loaded = load_checkpoint(tmp_path / "auk.safetensors")
    z = latents(3, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.decode(z), model.decode(z), atol=1e-5, rtol=0)


def test_unused_keys_are_reported(tmp_path, caplog):
    state = random_weight_normed_state()
    state["encoder.conv_pre.weight_v"] = torch.zeros(3, 1, 7)
    state["flow.proj.weight"] = torch.zeros(2, 2)
    with caplog.at_level(logging.INFO, logger="rewrite.models.auk.model"):
        model = load_checkpoint(write(tmp_path / "auk.safetensors", state))
    assert model.unused_keys == ("encoder.conv_pre.weight_v", "flow.proj.weight")
    assert "2 keys not used" in caplog.text and "encoder.*: 1" in caplog.text and "flow.*: 1" in caplog.text


def test_missing_key_raises_naming_it(tmp_path):
    state = random_weight_normed_state()
    key = "decoder.resblocks.4.convs2.1.weight_g"
    expected = list(checkpoint_layout(TINY)[key])
    del state[key]
    with pytest.raises(ValueError, match=re.escape(f"missing key '{key}' (expected shape {expected})")):
        load_checkpoint(write(tmp_path / "auk.safetensors", state))


def test_misshaped_key_raises_naming_it(tmp_path):
    state = random_weight_normed_state()
    key = "decoder.ups.2.weight_v"
    expected = list(state[key].shape)
    state[key] = torch.zeros(expected[0], expected[1], expected[2] + 1)
    wrong = list(state[key].shape)
    with pytest.raises(ValueError, match=re.escape(f"'{key}' has shape {wrong}, expected shape {expected}")):
        load_checkpoint(write(tmp_path / "auk.safetensors", state))


@pytest.mark.parametrize("key, bad", [("decoder.conv_post.weight_v", float("inf")), ("global_mean", float("nan"))])
def test_non_finite_value_raises_naming_it(tmp_path, key, bad):
    state = random_weight_normed_state()
    state[key] = state[key].clone()
    state[key].view(-1)[0] = bad
    with pytest.raises(ValueError, match=rf"'{key}' holds non-finite"):
        load_checkpoint(write(tmp_path / "auk.safetensors", state))


def test_config_comes_from_metadata_or_argument(tmp_path):
    state = random_weight_normed_state()
    with pytest.raises(ValueError, match="differs from the stored config"):
        load_checkpoint(write(tmp_path / "with_config.safetensors", state), config=AuKConfig())
    bare = write(tmp_path / "bare.safetensors", state, config=None)
    assert load_checkpoint(bare, config=TINY).config == TINY
    with pytest.raises(ValueError, match="expected shape"):  # the default (full-size) config does not fit
        load_checkpoint(bare)


# ------------------------------------------------------------------------------ bad checkpoint files


def test_a_torch_pickle_is_refused_as_not_safetensors(tmp_path):
    path = tmp_path / "auk.pt"
    torch.save(random_weight_normed_state(), path)
    with pytest.raises(ValueError, match=r"is not a safetensors file \(it looks like a torch pickle"):
        load_checkpoint(path)


def test_a_directory_or_a_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="is a directory; expected a .safetensors file"):
        load_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_checkpoint(tmp_path / "missing.safetensors")


def test_malformed_config_metadata_names_the_file_and_key(tmp_path):
    path = tmp_path / "auk.safetensors"
    save_file(random_weight_normed_state(), str(path), metadata={"config": "{not json"})
    with pytest.raises(ValueError, match=r"auk.safetensors: its 'config' metadata is not valid JSON"):
        load_checkpoint(path)
    save_file(random_weight_normed_state(), str(path), metadata={"config": "[1, 2]"})
    with pytest.raises(ValueError, match="must be a JSON object"):
        load_checkpoint(path)


@pytest.mark.parametrize("damage", ["truncated", "corrupted header"])
def test_a_damaged_file_is_named(tmp_path, damage):
    path = write(tmp_path / "auk.safetensors", random_weight_normed_state())
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(data[:8] + b"#" * 16 + data[24:])
    with pytest.raises(ValueError, match="auk.safetensors"):
        load_checkpoint(path)


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_a_non_positive_latent_variance_is_refused_naming_the_key(tmp_path, value):
    state = random_weight_normed_state()
    state["global_log_std"] = state["global_log_std"].clone()
    state["global_log_std"][3] = value
    with pytest.raises(ValueError, match="key 'global_log_std' must be positive"):
        load_checkpoint(write(tmp_path / "auk.safetensors", state))


def test_dtype_by_name_and_bad_dtype_or_device(tmp_path):
    path = write(tmp_path / "auk.safetensors", random_weight_normed_state())
    assert load_checkpoint(path, dtype="bfloat16").decoder.conv_pre.weight.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        load_checkpoint(path, dtype="float64x")
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        load_checkpoint(path, dtype=torch.int32)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            load_checkpoint(path, device="cuda")
    with pytest.raises(ValueError, match="device"):
        load_checkpoint(path, device="gpu0")


def test_the_plain_model_streams_one_piece():
    model = randomized(dtype=torch.float32)
    z = latents(3, dtype=torch.float32)
    with torch.no_grad():
        pieces = list(model.decode_tiles(z))
        assert len(pieces) == 1 and pieces[0][0] == 0 and torch.equal(pieces[0][1], model.decode(z))
