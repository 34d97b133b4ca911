from __future__ import annotations

import pytest
import torch

from trainctl.worker.models.gpt import IGNORE_INDEX, build_model, cross_entropy, fused_head_loss


@pytest.mark.parametrize("cap", [15.0, 0.0])
def test_fused_head_loss_matches_the_plain_expression_and_its_gradients(cap: float) -> None:
    torch.manual_seed(0)
    h = torch.randn(2, 16, 32, requires_grad=True)
    w = (torch.randn(300, 32) * 0.5).requires_grad_()
    targets = torch.randint(0, 300, (2, 16))
    targets[0, :3] = IGNORE_INDEX

    logits = torch.nn.functional.linear(h, w)
    if cap > 0:
        logits = cap * torch.tanh(logits / cap)
    plain = cross_entropy(logits, targets)
    grad_h, grad_w = torch.autograd.grad(plain, (h, w))

    fused = fused_head_loss(h, w, targets, cap)
    fused_grad_h, fused_grad_w = torch.autograd.grad(3.0 * fused, (h, w))
    torch.testing.assert_close(fused, plain)
    torch.testing.assert_close(fused_grad_h, 3.0 * grad_h)
    torch.testing.assert_close(fused_grad_w, 3.0 * grad_w)


def test_fused_head_loss_works_without_grad_and_in_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = build_model("tiny", seed=0)
    x = torch.randint(0, 512, (2, 32))
    with torch.no_grad():
        whole, _ = model.loss(x, x)
        # 5 rows a chunk
        monkeypatch.setattr("trainctl.worker.models.gpt.HEAD_CHUNK_ELEMENTS", 512 * 5)
        chunked, _ = model.loss(x, x)
    torch.testing.assert_close(whole, chunked)
    assert whole.item() == pytest.approx(cross_entropy(model(x), x).item(), rel=1e-5)
