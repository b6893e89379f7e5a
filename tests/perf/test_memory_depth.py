"""perf.memory.transformer_activation_peak for a family with a cost_depth_key (Qwen-Image's 60 identical
blocks): measured at 2, 3 and 4 blocks and continued along the line, it equals the whole model's
meta-device measurement, with no and with every block checkpointed, for Qwen-Image and Qwen-Image-Edit
(its source tokens). The current library line only (skipped on the recipe line, saying so)."""

from __future__ import annotations

import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "Qwen-Image")
    except LibraryLineError as err:
        return str(err)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")


@pytest.mark.parametrize("name, train, depth", [("qwen_image", False, 6), ("qwen_image", True, 6),
                                                ("qwen_image_edit", True, 5)])
def test_depth_line_equals_the_whole_models_measurement(name, train, depth, monkeypatch):
    from fastvideo.models.registry import get_model_family
    from fastvideo.perf import memory

    family = get_model_family(name)
    config = dict(family.reference_config, num_layers=depth)
    layout = family.nominal_layout(128, 256, config)
    measured = []
    whole = memory._measured_peak
    monkeypatch.setattr(memory, "_measured_peak", lambda cfg, *a: measured.append(cfg["num_layers"]) or whole(cfg, *a))
    line = memory.transformer_activation_peak(config, 1, layout, 8, torch.bfloat16, train, checkpoint_fraction=1.0,
                                              family=family)
    assert measured == [2, 3, 4]  # the line, not the whole model
    assert line == whole(config, 1, layout, 8, torch.bfloat16, train, 1.0 if train else 0.0, family, None)
    if name != "qwen_image" or not train:
        return
    # some blocks checkpointed: the whole model, measured
    measured.clear()
    memory.transformer_activation_peak(config, 1, layout, 8, torch.bfloat16, True, checkpoint_fraction=0.5,
                                       family=family)
    assert measured == [depth]
