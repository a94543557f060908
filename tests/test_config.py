"""gdnflow.config: knobs set for a block, restored afterwards, unknown names refused."""
import pytest

from gdnflow import config
from gdnflow.config import settings


def test_override_sets_knobs_for_the_block_and_restores_them():
    before = (settings.gdn_fused, settings.conv_workspace_bytes)
    with config.override(gdn_fused=not before[0], conv_workspace_bytes=1234):
        assert (settings.gdn_fused, settings.conv_workspace_bytes) == (not before[0], 1234)
    assert (settings.gdn_fused, settings.conv_workspace_bytes) == before


def test_override_restores_after_an_exception():
    before = settings.sparse_blocks_per_sm
    with pytest.raises(RuntimeError), config.override(sparse_blocks_per_sm=before + 3):
        raise RuntimeError("inside")
    assert settings.sparse_blocks_per_sm == before


def test_unknown_knob_is_refused_and_nothing_changes():
    before = settings.gdn_vectorize
    with pytest.raises(TypeError, match="no knob named 'gdn_fusde'"):
        with config.override(gdn_vectorize=not before, gdn_fusde=False):
            pass
    assert settings.gdn_vectorize == before
    with pytest.raises(AttributeError):
        settings.not_a_knob = 1
