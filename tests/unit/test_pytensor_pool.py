"""PyTensor's max pooling routes its gradient as PyTorch's does: to one element of each window, never to every tie."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytensor = pytest.importorskip("pytensor")


def test_pooled_gradient_goes_to_the_first_tied_maximum_as_in_torch():
    """A plain max sent the gradient to every tied maximum: on digit images ~5 % of the first layer's windows
    tie (zero backgrounds after ReLU), and PyTensor trained another model from the same weights."""
    import pytensor.tensor as pt

    from cnnpar.frameworks.pytensor_runner import max_pool_2x2

    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, size=(2, 3, 5, 5)).astype(np.float32)  # values 0..2: most windows tie; odd side cut
    x[0, 0, :2, :2] = 1.0  # one window all equal
    upstream = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)

    h = pt.tensor4("h", dtype="float32")
    pooled = max_pool_2x2(pt, h)
    grad = pytensor.grad((pooled * upstream).sum(), h)
    pool_and_grad = pytensor.function([h], [pooled, grad], mode="FAST_COMPILE")
    got_pooled, got_grad = pool_and_grad(x)

    xt = torch.from_numpy(x).requires_grad_()
    expected = torch.nn.functional.max_pool2d(xt, 2)
    expected.backward(torch.from_numpy(upstream))
    np.testing.assert_array_equal(got_pooled, expected.detach().numpy())
    np.testing.assert_array_equal(got_grad, xt.grad.numpy())
