"""The table of supported models (`rewrite.supported`): recognition, runners, random-init builds, captures.

The API, `rewrite-debug`, `rewrite-bench` and `rewrite-demo` read this one table; these tests pin what each
of them relies on: the TypeError for an unsupported module, recognition without importing diffusers, the
runners' protocol, seeded builds that leave the caller's RNG alone, and casts without diffusers' warning.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from rewrite import supported
from rewrite.pipeline import rewrite_graph

SUPPORTED = ("diffusers.AutoencoderKLWan (Wan 2.1 / 2.2), rewrite.models.auk.AuKVAE, "
             "diffusers.AutoencoderKLQwenImage")


def test_names_and_rows():
    assert supported.names() == ("wan2.1", "wan2.2", "auk", "qwenimage")
    assert supported.get("auk").family == "auk" and supported.get("wan2.2").family == "wan"
    with pytest.raises(ValueError, match="unknown model 'sd3'; supported: wan2.1, wan2.2, auk, qwenimage"):
        supported.get("sd3")


def test_an_unsupported_module_is_a_type_error_naming_the_supported_models():
    assert supported.supported_names() == SUPPORTED
    with pytest.raises(TypeError) as error:
        supported.runner_class_for(nn.Linear(2, 2))
    assert str(error.value) == f"optimize() supports {SUPPORTED}; got torch.nn.modules.linear.Linear"


@pytest.mark.parametrize("name, runner", [("wan2.1", "WanRunner"), ("wan2.2", "WanRunner"), ("auk", "AuKRunner"),
                                                 ("qwenimage", "QwenImageRunner")])
def test_each_row_recognises_its_own_models(name, runner):
    module = supported.get(name).build("tiny")
    assert supported.model_for(module).name == name
    assert supported.runner_class_for(module).__name__ == runner
    assert [m.name for m in supported.MODELS if m.recognise(module)] == [name]


def test_recognising_an_auk_model_does_not_import_diffusers():
    code = ("import sys; from rewrite import supported; from rewrite.models.auk.model import AuKConfig, AuKVAE; "
            "supported.model_for(AuKVAE(AuKConfig.tiny())); print('diffusers' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("name", ["wan2.1", "auk", "qwenimage"])
def test_runners_satisfy_the_runner_protocol(name):
    row = supported.get(name)
    module = row.build("tiny")
    runner = row.runner_class()(module, "lossless", rewrite_graph)
    assert isinstance(runner, supported.Runner)
    assert runner.level == "lossless" and isinstance(runner.options, dict)
    assert isinstance(runner.cuda_graph_counts(), dict) and runner.graph_reports() == []


def test_builds_are_seeded_and_keep_the_callers_random_state():
    state = torch.random.get_rng_state()
    row = supported.get("auk")
    first, second, other = (row.build("tiny", seed=s).state_dict() for s in (0, 0, 1))
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_a_dtype_cast_of_a_wan_build_prints_no_diffusers_warning(capfd):
    vae = supported.get("wan2.1").build("tiny", dtype=torch.bfloat16)
    assert {p.dtype for p in vae.parameters()} == {torch.bfloat16}
    assert "should be kept in float32" not in capfd.readouterr().err


def test_a_meta_build_allocates_no_weights():
    vae = supported.get("auk").build("full", device="meta", dtype=torch.bfloat16)
    assert {p.device.type for p in vae.parameters()} == {"meta"}
    assert {p.dtype for p in vae.parameters()} == {torch.bfloat16}


def test_capture_names_its_options():
    row = supported.get("wan2.1")
    with pytest.raises(TypeError, match="wan2.1: capture takes no option activations_as_ops"):
        row.capture(nn.Linear(2, 2), torch.float32, torch.device("cpu"), activations_as_ops=False)
