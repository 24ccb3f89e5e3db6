"""AuK audio-codec decoder (Tencent Hunyuan AuK VAE): a plain PyTorch reference.

The AuK VAE decodes 64-channel latents at 50 Hz into a 24 kHz waveform (hop 480) with a BigVGAN-style
decoder (docs/design.md section 9.1). No package ships it, so this module is the reference the optimizer rewrites and
is checked against. It imports nothing from the rest of `rewrite` but the alias-free filter geometry
(`rewrite/kernels/alias_free/geometry.py`, defined once for the model, the ops and the patterns).

Architecture (default geometry; channels ``C0 = upsample_initial_channel`` halve at every stage)::

    z [B, frames, 64] --denormalise--> [B, 64, frames]
    conv_pre          Conv1d 64 -> C0, k=7, "same" padding 3 (the only non-causal layer)
    6 stages, stride s in (5, 4, 3, 2, 2, 2):
        ups.{i}       causal ConvTranspose1d C -> C/2, k=2s, padding 0, last k-s samples dropped
        3 AMP blocks  kernels 3, 7, 11 on the same input, (b1 + b2 + b3) / 3
    activation_post   alias-free SnakeBeta on the last channel count (24)
    conv_post         causal Conv1d 24 -> 1, k=7, no bias
    clamp(-1, 1)      -> waveform [B, frames * 480]

An AMP block is three residual units ``x = x + conv2(act2(conv1(act1(x))))`` with conv1 of dilation
1, 3, 5 and conv2 of dilation 1; every conv but ``conv_pre`` is causal (``dilation * (k - 1)`` zeros on
the left). Every activation is the alias-free SnakeBeta: upsample x2 with a 12-tap Kaiser-windowed sinc
(replicate pad, transposed depthwise conv, crop), SnakeBeta, then a causal low-pass and decimation by 2
with the same taps. The taps are computed, not stored.

Checkpoint layout (safetensors only; weight norm as in ``torch.nn.utils.weight_norm(module, dim=0)``,
which for ``ConvTranspose1d`` is the *input*-channel dim of its ``[in, out, k]`` weight). With stage
``i`` (0..5), ``C_i = C0 / 2**i`` its input channels, kernel index ``b`` (0..2) and ``j = 3 * i + b``::

    global_mean, global_log_std                      [latent_dim]   (log_std is used as a variance)
    decoder.conv_pre.{weight_g [C0, 1, 1], weight_v [C0, latent_dim, 7], bias [C0]}
    decoder.ups.{i}.{weight_g [C_i, 1, 1], weight_v [C_i, C_i/2, 2*s_i], bias [C_i/2]}
    decoder.resblocks.{j}.convs1.{u}.{weight_g [C, 1, 1], weight_v [C, C, k_b], bias [C]}   u = 0..2
    decoder.resblocks.{j}.convs2.{u}.{weight_g, weight_v, bias}                             (C = C_i/2)
    decoder.resblocks.{j}.activations.{m}.act.{alpha, beta} [C]   m = 2u before convs1.u, 2u+1 before convs2.u
    decoder.activation_post.act.{alpha, beta}        [C_last]
    decoder.conv_post.{weight_g [1, 1, 1], weight_v [1, C_last, 7]}

The safetensors metadata may hold ``"config"``: a JSON object of `AuKConfig` fields (unknown,
training-only fields are ignored). The in-memory module holds plain (folded) ``weight`` tensors;
`load_checkpoint` folds ``weight_g``/``weight_v`` with ``torch._weight_norm`` on the target device and
reports the keys it does not use (``encoder.*``, flow heads, ...) in ``model.unused_keys``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rewrite.models.input_casts import input_may_be_cast, plain_weight_dtype
from rewrite.kernels.alias_free.geometry import DOWN_PAD, FILTER_TAPS, RESAMPLE_RATIO, UP_CROP, UP_PAD

logger = logging.getLogger(__name__)

__all__ = [
    "AuKConfig",
    "AuKDecoder",
    "AuKVAE",
    "AliasFreeSnakeBeta",
    "SnakeBeta",
    "checkpoint_layout",
    "decode_context_frames",
    "fold_weight_norm",
    "kaiser_sinc_taps",
    "load_checkpoint",
    "receptive_field",
    "save_checkpoint",
    "weight_norm_state_dict",
]

# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuKConfig:
    """Geometry of the AuK decoder (defaults: the released 24 kHz model, hop 480)."""

    latent_dim: int = 64
    upsample_rates: tuple[int, ...] = (5, 4, 3, 2, 2, 2)
    upsample_kernel_sizes: tuple[int, ...] = (10, 8, 6, 4, 4, 4)
    upsample_initial_channel: int = 1536
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5),) * 3
    snake_logscale: bool = True
    causal: bool = True
    act_causal: bool = True
    sample_rate: int = 24000

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name, _as_tuples(getattr(self, field.name)))
        self._validate()

    def _validate(self) -> None:
        if not (self.causal and self.act_causal):
            raise ValueError("AuKConfig: only the causal AuK decoder (causal=True, act_causal=True) is implemented")
        if len(self.upsample_rates) != len(self.upsample_kernel_sizes):
            raise ValueError("AuKConfig: upsample_rates and upsample_kernel_sizes differ in length")
        for stride, kernel in zip(self.upsample_rates, self.upsample_kernel_sizes):
            if stride < 1 or kernel < stride:
                raise ValueError(f"AuKConfig: upsample kernel {kernel} must be >= its stride {stride} >= 1")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise ValueError("AuKConfig: resblock_kernel_sizes and resblock_dilation_sizes differ in length")
        if self.upsample_initial_channel % 2 ** len(self.upsample_rates):
            raise ValueError(
                f"AuKConfig: upsample_initial_channel={self.upsample_initial_channel} must be divisible by "
                f"2**{len(self.upsample_rates)} (channels halve at every stage)"
            )

    @property
    def hop_length(self) -> int:
        """Waveform samples per latent frame (the product of the upsample rates)."""
        return math.prod(self.upsample_rates)

    def stage_channels(self) -> tuple[int, ...]:
        """Output channels of each upsample stage (the channels its AMP blocks run on)."""
        return tuple(self.upsample_initial_channel // 2 ** (i + 1) for i in range(len(self.upsample_rates)))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> AuKConfig:
        """Build from a (JSON) dict; unknown (training-only) keys are ignored and logged at debug."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            logger.debug("AuKConfig.from_dict: ignoring keys %s", unknown)
        return cls(**{name: _as_tuples(value) for name, value in values.items() if name in known})

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON-able values."""
        return dataclasses.asdict(self)

    @classmethod
    def tiny(cls) -> AuKConfig:
        """Default geometry (strides, kernels, dilations) with few channels (128 -> 2), for tests."""
        return cls(latent_dim=8, upsample_initial_channel=128)


def _as_tuples(value: Any) -> Any:
    """Lists (nested) to tuples, so configs from JSON compare equal to the defaults."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(item) for item in value)
    return value


# ---------------------------------------------------------------------------------------------------
# Alias-free SnakeBeta activation
# ---------------------------------------------------------------------------------------------------

# FILTER_TAPS, RESAMPLE_RATIO, UP_PAD, UP_CROP, DOWN_PAD: `rewrite.kernels.alias_free.geometry` (imported above)
FILTER_CUTOFF = 0.25  # of the (2x) sample rate: the original Nyquist
FILTER_HALF_WIDTH = 0.3


def kaiser_beta(attenuation_db: float) -> float:
    """Kaiser's empirical window parameter for a stop-band attenuation in dB."""
    if attenuation_db > 50.0:
        return 0.1102 * (attenuation_db - 8.7)
    if attenuation_db >= 21.0:
        return 0.5842 * (attenuation_db - 21.0) ** 0.4 + 0.07886 * (attenuation_db - 21.0)
    return 0.0


def kaiser_sinc_taps(
    cutoff: float = FILTER_CUTOFF, half_width: float = FILTER_HALF_WIDTH, num_taps: int = FILTER_TAPS
) -> torch.Tensor:
    """Low-pass FIR taps (float64, summing to 1): a sinc at `cutoff` under a Kaiser window.

    `cutoff` and `half_width` are fractions of the sample rate. The attenuation follows Kaiser's design
    formula for a transition band of width ``4 * half_width`` (as in BigVGAN / alias-free-torch), and the
    taps are centred between samples for an even `num_taps`.
    """
    half = num_taps // 2
    attenuation = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95
    window = torch.kaiser_window(num_taps, periodic=False, beta=kaiser_beta(attenuation), dtype=torch.float64)
    offsets = torch.arange(num_taps, dtype=torch.float64) - (num_taps - 1) / 2
    taps = 2 * cutoff * window * torch.sinc(2 * cutoff * offsets)
    return taps / taps.sum()


class SnakeBeta(nn.Module):
    """``x + 1/(beta + 1e-9) * sin(alpha * x)**2`` with per-channel alpha, beta (exp'd if log-scale)."""

    def __init__(self, channels: int, logscale: bool = True) -> None:
        super().__init__()
        init = torch.zeros if logscale else torch.ones
        self.logscale = logscale
        self.alpha = nn.Parameter(init(channels))
        self.beta = nn.Parameter(init(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.view(1, -1, 1)
        beta = self.beta.view(1, -1, 1)
        if self.logscale:
            alpha, beta = alpha.exp(), beta.exp()
        return x + 1.0 / (beta + 1e-9) * torch.sin(x * alpha).pow(2)


class AliasFreeSnakeBeta(nn.Module):
    """SnakeBeta at twice the sample rate: upsample x2 -> SnakeBeta -> causal low-pass, decimate x2.

    Maps ``[B, C, L]`` to ``[B, C, L]``. The filter taps are a non-persistent buffer (not in checkpoints).
    """

    def __init__(self, channels: int, logscale: bool = True) -> None:
        super().__init__()
        self.act = SnakeBeta(channels, logscale)
        self.register_buffer("taps", torch.empty(1, 1, FILTER_TAPS), persistent=False)
        self.reset_taps()

    @torch.no_grad()
    def reset_taps(self) -> None:
        """(Re)compute the filter taps in place, e.g. after ``to_empty()`` (they are not in checkpoints)."""
        self.taps.copy_(kaiser_sinc_taps().view(1, 1, FILTER_TAPS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.downsample(self.act(self.upsample(x)))

    def upsample(self, x: torch.Tensor) -> torch.Tensor:
        """Band-limited x2 upsampling: ``[B, C, L] -> [B, C, 2L]``."""
        channels = x.shape[1]
        padded = F.pad(x, (UP_PAD, UP_PAD), mode="replicate")
        taps = self.taps.expand(channels, -1, -1)
        y = RESAMPLE_RATIO * F.conv_transpose1d(padded, taps, stride=RESAMPLE_RATIO, groups=channels)
        return y[..., UP_CROP:-UP_CROP]

    def downsample(self, x: torch.Tensor) -> torch.Tensor:
        """Causal low-pass and x2 decimation: ``[B, C, 2L] -> [B, C, L]``."""
        channels = x.shape[1]
        padded = F.pad(x, (DOWN_PAD, 0), mode="replicate")
        return F.conv1d(padded, self.taps.expand(channels, -1, -1), stride=RESAMPLE_RATIO, groups=channels)


# ---------------------------------------------------------------------------------------------------
# Convolutions and blocks
# ---------------------------------------------------------------------------------------------------


class CausalConv1d(nn.Conv1d):
    """Conv1d that zero-pads ``dilation * (kernel - 1)`` on the left only: output n sees inputs <= n."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, bias: bool = True):
        super().__init__(in_channels, out_channels, kernel_size, dilation=dilation, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.dilation[0] * (self.kernel_size[0] - 1), 0)))


class CausalConvTranspose1d(nn.ConvTranspose1d):
    """ConvTranspose1d (padding 0) whose last ``kernel - stride`` outputs are dropped: ``L -> L * stride``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y[..., : x.shape[-1] * self.stride[0]]


class AMPBlock(nn.Module):
    """Three residual units ``x + conv2(act(conv1(act(x))))``; conv1 dilated (1, 3, 5), conv2 dilation 1."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...], logscale: bool) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(CausalConv1d(channels, channels, kernel_size, dilation=d) for d in dilations)
        self.convs2 = nn.ModuleList(CausalConv1d(channels, channels, kernel_size) for _ in dilations)
        self.activations = nn.ModuleList(AliasFreeSnakeBeta(channels, logscale) for _ in range(2 * len(dilations)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit, (conv1, conv2) in enumerate(zip(self.convs1, self.convs2)):
            h = conv1(self.activations[2 * unit](x))
            h = conv2(self.activations[2 * unit + 1](h))
            x = x + h
        return x


class AuKDecoder(nn.Module):
    """The BigVGAN-style generator: raw latents ``[B, latent_dim, frames]`` -> ``[B, 1, frames * hop]``."""

    def __init__(self, config: AuKConfig) -> None:
        super().__init__()
        channels = (config.upsample_initial_channel, *config.stage_channels())
        self.num_kernels = len(config.resblock_kernel_sizes)
        self.conv_pre = nn.Conv1d(config.latent_dim, channels[0], 7, padding=3)
        self.ups = nn.ModuleList(
            CausalConvTranspose1d(channels[i], channels[i + 1], kernel, stride)
            for i, (stride, kernel) in enumerate(zip(config.upsample_rates, config.upsample_kernel_sizes))
        )
        self.resblocks = nn.ModuleList(
            AMPBlock(stage_channels, kernel, dilations, config.snake_logscale)
            for stage_channels in channels[1:]
            for kernel, dilations in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes)
        )
        self.activation_post = AliasFreeSnakeBeta(channels[-1], config.snake_logscale)
        self.conv_post = CausalConv1d(channels[-1], 1, 7, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_pre(x)
        for stage, upsample in enumerate(self.ups):
            x = self.amp_blocks(stage, upsample(x))
        x = self.conv_post(self.activation_post(x))
        return x.clamp(-1.0, 1.0)

    def amp_blocks(self, stage: int, x: torch.Tensor) -> torch.Tensor:
        """The stage's parallel AMP blocks on the same input, averaged: ``(b1 + b2 + b3) / 3``."""
        blocks = self.resblocks[stage * self.num_kernels : (stage + 1) * self.num_kernels]
        total = blocks[0](x)
        for block in blocks[1:]:
            total = total + block(x)
        return total / self.num_kernels


# ---------------------------------------------------------------------------------------------------
# The VAE decode wrapper
# ---------------------------------------------------------------------------------------------------


class AuKVAE(nn.Module):
    """AuK VAE decode side: normalised latents ``[B, frames, latent_dim]`` -> waveform ``[B, frames * hop]``.

    ``global_mean`` and ``global_log_std`` (``[latent_dim]``) denormalise the latents; despite its name
    the second is used as a variance: ``raw = z * sqrt(global_log_std) + global_mean``.
    """

    def __init__(self, config: AuKConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else AuKConfig()
        self.decoder = AuKDecoder(self.config)
        self.register_buffer("global_mean", torch.zeros(self.config.latent_dim))
        self.register_buffer("global_log_std", torch.ones(self.config.latent_dim))
        self.unused_keys: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: AuKConfig | Mapping[str, Any]) -> AuKVAE:
        """Build a randomly initialised model from a config (or a config dict)."""
        if not isinstance(config, AuKConfig):
            config = AuKConfig.from_dict(config)
        return cls(config)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Decode normalised latents ``[B, frames, latent_dim]`` to a waveform ``[B, frames * hop]`` in [-1, 1]."""
        self._check_latents(z)
        raw = z * self.global_log_std.sqrt() + self.global_mean
        return self.decoder(raw.transpose(1, 2)).squeeze(1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Same as `decode`."""
        return self.decode(z)

    def decode_tiles(self, z: torch.Tensor):
        """Streaming decode: yields ``(first_frame, waveform)`` pieces in order. This plain model decodes the
        whole clip as one piece starting at frame 0; an optimized model (`rewrite.optimize`) yields one
        piece per tiled window as each finishes."""
        yield 0, self.decode(z)

    def pad_latent(self) -> torch.Tensor:
        """The normalised latent ``[latent_dim]`` that denormalises to raw zero: ``-mean / sqrt(var)``."""
        return -self.global_mean / self.global_log_std.sqrt()

    def decode_context_frames(self) -> tuple[int, int]:
        """Latent frames of (left, right) context an output frame depends on; see `decode_context_frames`."""
        return decode_context_frames(self.config)

    def num_parameters(self) -> int:
        """Parameter count (weight norm folded: one ``weight`` per conv)."""
        return sum(p.numel() for p in self.parameters())

    def _check_latents(self, z: torch.Tensor) -> None:
        expected = f"[batch, frames, {self.config.latent_dim}] with batch >= 1 and frames >= 1"
        shape = tuple(z.shape) if isinstance(z, torch.Tensor) else None
        problem = None
        if shape is None:
            problem = f"got {type(z).__name__}, not a tensor"
        elif len(shape) != 3:
            problem = f"got rank {len(shape)} shape {shape}"
        elif shape[2] != self.config.latent_dim:
            problem = f"got latent size {shape[2]} (shape {shape})"
        elif shape[0] == 0 or shape[1] == 0:
            problem = f"got an empty batch or zero frames (shape {shape})"
        if problem is not None:
            raise ValueError(f"AuKVAE.decode expects normalised latents shaped {expected}; {problem}")
        needed = self._refused_latent_dtype(z)
        if needed is not None:
            raw = torch.promote_types(torch.result_type(z, self.global_log_std), self.global_mean.dtype)
            raise ValueError(f"AuKVAE.decode expects latents of the model's dtype {needed}, or of one that the "
                             f"denormalisation (z * sqrt(global_log_std) + global_mean) promotes to it; got {z.dtype}, "
                             f"which it promotes to {raw} (cast them: z.to({needed}))")

    def _refused_latent_dtype(self, z: torch.Tensor) -> torch.dtype | None:
        """The dtype `decoder.conv_pre` needs where it would raise for the denormalised `z` (``z * sqrt(var) +
        mean`` promotes the dtype: an fp32 model takes bf16, fp16 and integer latents; the conv then needs its
        weight's dtype), else None; also None where something might cast on the way
        (`rewrite.models.input_casts.input_may_be_cast`, the decoder and ``conv_pre``) or ``conv_pre`` has no
        plain ``weight`` parameter."""
        conv = self.decoder.conv_pre
        needed = plain_weight_dtype(conv)
        raw = torch.promote_types(torch.result_type(z, self.global_log_std), self.global_mean.dtype)
        if needed is None or raw == needed or input_may_be_cast(z, [self.decoder, conv]):
            return None
        return needed


# ---------------------------------------------------------------------------------------------------
# Receptive field (decode context) from the layer geometry
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexMap:
    """Which input samples ``[lo(n), hi(n)]`` a layer's output sample ``n`` reads.

    ``upsample`` is the output rate over the input rate; ``period`` is a number of output samples after
    which ``lo`` and ``hi`` repeat, shifted by ``period / upsample`` input samples. Sample ``n`` of a
    signal at ``r`` samples per latent frame sits at position ``n / r`` latent frames.
    """

    lo: Callable[[int], int]
    hi: Callable[[int], int]
    upsample: Fraction = Fraction(1)
    period: int = 1

    def then(self, later: IndexMap) -> IndexMap:
        """This layer followed by `later` (reads compose backwards; both maps are monotone)."""
        return IndexMap(
            lo=lambda n: self.lo(later.lo(n)),
            hi=lambda n: self.hi(later.hi(n)),
            upsample=self.upsample * later.upsample,
            period=self.period * later.period,
        )

    def reach(self) -> tuple[Fraction, Fraction]:
        """Exact (left, right) reach in input samples: max over output phases of the position offsets."""
        positions = [(n / self.upsample, n) for n in range(self.period)]
        left = max(pos - self.lo(n) for pos, n in positions)
        right = max(self.hi(n) - pos for pos, n in positions)
        return left, right


def conv_map(kernel: int, dilation: int = 1, left_pad: int = 0) -> IndexMap:
    """Stride-1 conv after ``left_pad`` samples of padding: reads ``n - left_pad + [0, dilation*(kernel-1)]``."""
    return IndexMap(lo=lambda n: n - left_pad, hi=lambda n: n - left_pad + dilation * (kernel - 1))


def causal_conv_map(kernel: int, dilation: int = 1) -> IndexMap:
    """Causal conv: left pad ``dilation * (kernel - 1)``, so it reads ``[n - dilation*(kernel-1), n]``."""
    return conv_map(kernel, dilation, left_pad=dilation * (kernel - 1))


def transposed_conv_map(kernel: int, stride: int, input_pad: int = 0, crop: int = 0) -> IndexMap:
    """Transposed conv of an input padded by ``input_pad``, whose first ``crop`` outputs are dropped.

    Full output ``t = n + crop`` receives padded input ``i`` when ``0 <= t - stride * i < kernel``.
    """
    return IndexMap(
        lo=lambda n: -((kernel - 1 - n - crop) // stride) - input_pad,  # ceil((t - kernel + 1) / stride)
        hi=lambda n: (n + crop) // stride - input_pad,
        upsample=Fraction(stride),
        period=stride,
    )


def strided_conv_map(kernel: int, stride: int, left_pad: int) -> IndexMap:
    """Conv with stride after ``left_pad`` samples of padding: reads ``stride*n - left_pad + [0, kernel-1]``."""
    return IndexMap(
        lo=lambda n: stride * n - left_pad,
        hi=lambda n: stride * n - left_pad + kernel - 1,
        upsample=Fraction(1, stride),
    )


def alias_free_activation_map() -> IndexMap:
    """The alias-free SnakeBeta as one layer: upsample x2 (SnakeBeta is pointwise) then causal low-pass.

    Composed exactly rather than summed per sub-layer: the worst phases of the two filters do not
    coincide (summed: reach (17/2, 5/2) input samples; composed: (8, 2)).
    """
    upsample = transposed_conv_map(FILTER_TAPS, RESAMPLE_RATIO, input_pad=UP_PAD, crop=UP_CROP)
    return upsample.then(strided_conv_map(FILTER_TAPS, RESAMPLE_RATIO, left_pad=DOWN_PAD))


def _amp_block_reach(kernel: int, dilations: tuple[int, ...]) -> tuple[Fraction, Fraction]:
    """Reach of one AMP block in samples of its rate: its residual units in series."""
    activation = alias_free_activation_map().reach()
    left = right = Fraction(0)
    for dilation in dilations:
        unit = (activation, causal_conv_map(kernel, dilation).reach(), activation, causal_conv_map(kernel).reach())
        for reach in unit:
            left, right = left + reach[0], right + reach[1]
    return left, right  # the residual path adds (0, 0), never more


def receptive_field(config: AuKConfig) -> tuple[Fraction, Fraction]:
    """Exact (left, right) reach of one output sample, in latent frames.

    Per-layer reaches (exact over the layer's output phases) are converted to latent frames at the
    layer's input rate and summed in series; a stage's parallel AMP blocks contribute their maximum.
    On the default geometry: (8409/160, 1531/240) = (52.556..., 6.379...).
    """
    left = right = Fraction(0)
    rate = Fraction(1)  # samples per latent frame at the current layer's input

    def add(reach: tuple[Fraction, Fraction], upsample: Fraction = Fraction(1)) -> None:
        nonlocal left, right, rate
        left, right, rate = left + reach[0] / rate, right + reach[1] / rate, rate * upsample

    add(conv_map(7, left_pad=3).reach())  # conv_pre: "same" padding, the one non-causal layer
    for stride, kernel in zip(config.upsample_rates, config.upsample_kernel_sizes):
        upsample = transposed_conv_map(kernel, stride)  # causal: the dropped outputs are at the end
        add(upsample.reach(), upsample.upsample)
        blocks = [_amp_block_reach(k, d) for k, d in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes)]
        add((max(b[0] for b in blocks), max(b[1] for b in blocks)))
    add(alias_free_activation_map().reach())  # activation_post
    add(causal_conv_map(7).reach())  # conv_post
    return left, right


def decode_context_frames(config: AuKConfig | None = None) -> tuple[int, int]:
    """Latent frames (left, right) of context an output frame needs: (52, 7) on the default geometry.

    Latent frame ``j`` sits at position ``j``; output frame ``F`` covers positions ``F + t / hop`` for
    ``t < hop``. With the sample reach ``(L, R)`` of `receptive_field`, frame ``F`` reads latent frames
    ``F - floor(L)`` to ``F + floor(R + (hop - 1) / hop)``. Windows that keep this much context on each
    side decode their inner frames exactly as the whole clip does. The bound is tight (the tests poison
    the latents just outside it with NaN). The start-of-project notes quoted (53, 9): a safe but looser bound (53 is
    ``ceil(L)``, which counts the latent frame's own width once more).
    """
    config = config if config is not None else AuKConfig()
    left, right = receptive_field(config)
    last_sample_offset = Fraction(config.hop_length - 1, config.hop_length)
    return math.floor(left), math.floor(right + last_sample_offset)


# ---------------------------------------------------------------------------------------------------
# Checkpoints (safetensors only)
# ---------------------------------------------------------------------------------------------------

WEIGHT_NORM_DIM = 0  # torch.nn.utils.weight_norm's default, for Conv1d and ConvTranspose1d alike
CONFIG_METADATA_KEY = "config"


def _conv_prefixes(model: nn.Module) -> set[str]:
    return {name for name, module in model.named_modules() if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d))}


def weight_norm_state_dict(model: AuKVAE) -> dict[str, torch.Tensor]:
    """The checkpoint layout of `model`: each conv ``weight`` w becomes ``weight_g`` = ||w|| over the
    dims other than 0 (keepdim) and ``weight_v`` = w; every other tensor is kept as is."""
    convs = _conv_prefixes(model)
    state: dict[str, torch.Tensor] = {}
    for key, tensor in model.state_dict().items():
        prefix, _, leaf = key.rpartition(".")
        if leaf == "weight" and prefix in convs:
            state[f"{prefix}.weight_g"] = torch.norm_except_dim(tensor, 2, WEIGHT_NORM_DIM)
            state[f"{prefix}.weight_v"] = tensor.clone()
        else:
            state[key] = tensor.clone()
    return state


def checkpoint_layout(config: AuKConfig | None = None) -> dict[str, tuple[int, ...]]:
    """Key -> shape of every checkpoint tensor the model reads (built on the meta device: no weights)."""
    return _layout_of(_meta_model(config))


def _meta_model(config: AuKConfig | None) -> AuKVAE:
    with torch.device("meta"):
        return AuKVAE(config)


def _layout_of(model: AuKVAE) -> dict[str, tuple[int, ...]]:
    return {key: tuple(tensor.shape) for key, tensor in weight_norm_state_dict(model).items()}


def fold_weight_norm(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace each ``weight_g``/``weight_v`` pair by ``weight = g * v / ||v||`` (``torch._weight_norm``,
    dim 0), computed on the tensors' device; other tensors pass through."""
    folded: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key.endswith(".weight_v"):
            prefix = key[: -len("_v")]
            folded[prefix] = torch._weight_norm(tensor, state[f"{prefix}_g"], WEIGHT_NORM_DIM)
        elif not key.endswith(".weight_g"):
            folded[key] = tensor
    return folded


def save_checkpoint(model: AuKVAE, path: str | Path) -> None:
    """Write `model` in the checkpoint layout (weight-normed g/v pairs) with its config as metadata."""
    from safetensors.torch import save_file

    tensors = {key: tensor.detach().cpu().contiguous() for key, tensor in weight_norm_state_dict(model).items()}
    save_file(tensors, str(path), metadata={CONFIG_METADATA_KEY: json.dumps(model.config.to_dict())})


def load_checkpoint(
    path: str | Path,
    device: torch.device | str | None = None,
    config: AuKConfig | None = None,
    dtype: torch.dtype = torch.float32,
) -> AuKVAE:
    """Load an AuK checkpoint (safetensors only, never a pickle) into an eval-mode `AuKVAE` on `device`.

    The config comes from the file's metadata when stored there (a `config` argument that disagrees is
    an error), else from `config`, else the default. Weight norm is folded on `device` in `dtype`. Keys
    the decoder does not use (``encoder.*``, training-only heads) are logged at INFO and kept in
    ``model.unused_keys``. A missing key, a wrong shape or a non-finite value raises ValueError naming
    the key.
    """
    from safetensors.torch import load_file

    device, dtype = _checked_device(device), _checked_dtype(dtype)
    path = _checked_file(path)
    model = _meta_model(_resolve_config(_read_metadata(path), config, path))
    layout = _layout_of(model)
    try:
        tensors = load_file(str(path), device=str(device))
    except Exception as error:  # safetensors' own errors name neither the file nor the problem plainly
        raise ValueError(f"checkpoint {path}: cannot read its tensors (truncated or corrupted file?): "
                         f"{type(error).__name__}: {error}") from error
    _validate_tensors(tensors, layout, path)
    unused = sorted(set(tensors) - set(layout))
    _log_unused(unused, path)
    model = _materialize(model, device, dtype)
    model.load_state_dict(fold_weight_norm({key: tensors[key].to(dtype) for key in layout}))
    model.unused_keys = tuple(unused)
    return model.eval()


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _checked_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A floating torch dtype, or its name ("float32", "bfloat16", "float16")."""
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype or one of {sorted(_DTYPES)}; got {dtype!r}")
    return dtype


def _checked_device(device: torch.device | str | None) -> torch.device:
    try:
        device = torch.device(device) if device is not None else torch.device("cpu")
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device: {error}") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} requested but CUDA is not available here "
                         "(torch.cuda.is_available() is False)")
    return device


def _checked_file(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"checkpoint {path} is a directory; expected a .safetensors file")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path}: no such file")
    with path.open("rb") as handle:
        head = handle.read(8)
    header_bytes = int.from_bytes(head, "little") if len(head) == 8 else -1
    if header_bytes <= 0 or header_bytes > path.stat().st_size - 8:
        kind = " (it looks like a torch pickle or zip archive)" if head[:2] in (b"PK", b"\x80\x02") else ""
        raise ValueError(f"checkpoint {path} is not a safetensors file{kind}: load_checkpoint reads safetensors "
                         "only, never pickles")
    return path


def _read_metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return handle.metadata() or {}
    except Exception as error:
        raise ValueError(f"checkpoint {path}: cannot read its safetensors header (truncated or corrupted file?): "
                         f"{type(error).__name__}: {error}") from error


def _resolve_config(metadata: Mapping[str, str], config: AuKConfig | None, path: str | Path) -> AuKConfig:
    if CONFIG_METADATA_KEY not in metadata:
        return config if config is not None else AuKConfig()
    try:
        values = json.loads(metadata[CONFIG_METADATA_KEY])
    except json.JSONDecodeError as error:
        raise ValueError(f"checkpoint {path}: its {CONFIG_METADATA_KEY!r} metadata is not valid JSON: {error}") from error
    if not isinstance(values, dict):
        raise ValueError(f"checkpoint {path}: its {CONFIG_METADATA_KEY!r} metadata must be a JSON object, "
                         f"got {type(values).__name__}")
    stored = AuKConfig.from_dict(values)
    if config is not None and config != stored:
        raise ValueError(f"checkpoint {path}: the config argument {config} differs from the stored config {stored}")
    return stored


def _validate_tensors(tensors: Mapping[str, torch.Tensor], layout: Mapping[str, tuple[int, ...]], path) -> None:
    missing = [key for key in layout if key not in tensors]
    if missing:
        listed = ", ".join(f"{key!r} (expected shape {list(layout[key])})" for key in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ValueError(f"checkpoint {path}: missing key {listed}{more}")
    for key, shape in layout.items():
        tensor = tensors[key]
        if tuple(tensor.shape) != shape:
            raise ValueError(
                f"checkpoint {path}: key {key!r} has shape {list(tensor.shape)}, expected shape {list(shape)}"
            )
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"checkpoint {path}: key {key!r} holds non-finite values (inf or nan)")
    variance = tensors.get("global_log_std")
    if variance is not None and not bool((variance > 0).all()):
        raise ValueError(f"checkpoint {path}: key 'global_log_std' must be positive (it is the latent variance; "
                         f"decode takes its square root); its minimum is {variance.min().item()}")


def _log_unused(unused: list[str], path: str | Path) -> None:
    if not unused:
        return
    groups: dict[str, int] = {}
    for key in unused:
        group = key.split(".", 1)[0]
        groups[group] = groups.get(group, 0) + 1
    summary = ", ".join(f"{group}.*: {count}" for group, count in sorted(groups.items()))
    logger.info("checkpoint %s: %d keys not used by the decoder (%s)", path, len(unused), summary)
    logger.debug("checkpoint %s: unused keys %s", path, unused)


def _materialize(model: AuKVAE, device: torch.device, dtype: torch.dtype) -> AuKVAE:
    """The meta `model` as uninitialised storage on `device` (no random init of ~114 M weights), with its
    filter taps computed."""
    model = model.to_empty(device=device).to(dtype)
    for module in model.modules():
        if isinstance(module, AliasFreeSnakeBeta):
            module.reset_taps()
    return model
