"""The AuK audio-codec family: the reference decoder the project ships (`model.py`), its capture, runner, ops
and patterns' references. `AuKVAE` and `AuKConfig` are importable from here, the public path of the model."""

from rewrite.models.auk.model import AuKConfig, AuKVAE  # noqa: F401  (the public path: rewrite.models.auk.AuKVAE)
