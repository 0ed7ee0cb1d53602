"""Which attention kernel a compiled train step runs, per layer kind, and the proof in its HLO:
a Pallas kernel compiled for a TPU is a `tpu_custom_call` instruction named after the kernel
(splash_mha_fwd..., splash_mha_dq..., splash_mha_dkv...: forward and the two backward passes)."""

from __future__ import annotations

import collections
import re

from bertjax.model import attention_choice
from bertjax.model.config import EncoderConfig

# `%splash_mha_fwd_segmented_residuals.2 = (...) custom-call(...),
#  custom_call_target="tpu_custom_call"`
_CUSTOM_CALL = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.-]+?)(?:\.\d+)? = .*"
                          r'custom_call_target="tpu_custom_call"', re.MULTILINE)


def tpu_kernels(hlo_text: str) -> dict[str, int]:
    """{Pallas kernel name: instructions} in a compiled HLO module's text."""
    return dict(sorted(collections.Counter(_CUSTOM_CALL.findall(hlo_text)).items()))


def attention_report(encoder: EncoderConfig, platform: str, packed: bool,
                     phases: list[tuple[int, str]]) -> dict:
    """`phases`: (tokens, compiled HLO text) of each train step compiled for `platform`."""
    layers = attention_choice.choices(encoder, platform=platform, training=True, packed=packed)
    wants_splash = attention_choice.SPLASH in layers.values()
    found = [{"seq_len": seq_len, "tpu_kernels": tpu_kernels(text)} for seq_len, text in phases]
    in_hlo = all(any(name.startswith("splash_") for name in p["tpu_kernels"]) for p in found)
    return {"requested": encoder.attention_implementation or "auto", "layers": layers,
            "phases": found, "splash_in_hlo": in_hlo if wants_splash else None}


def describe(report: dict) -> str:
    """One line: the kernel of each layer kind and, for splash, whether the HLO holds it."""
    layers = ", ".join(f"{kind} {kernel}" for kind, kernel in report["layers"].items())
    line = f"attention:   {layers} (model.attention_implementation={report['requested']})"
    if report["splash_in_hlo"] is None:
        return line
    if not report["splash_in_hlo"]:
        return line + "; NO splash kernel found in the compiled HLO"
    names = sorted({name for p in report["phases"] for name in p["tpu_kernels"]
                    if name.startswith("splash_")})
    return line + f"; in the HLO: tpu_custom_call {', '.join(names)}"
