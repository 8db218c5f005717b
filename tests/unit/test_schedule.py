import pytest

from hvdtrain.loop.schedule import effective_base_lr, lr_at


def test_constant_without_warmup_or_decay():
    assert [lr_at(s, 10, 0.1) for s in (0, 5, 99)] == [0.1, 0.1, 0.1]


def test_linear_warmup_then_step_decay():
    lrs = [lr_at(s, 10, 1.0, warmup_epochs=1, decay_epochs=(2, 3), decay_factor=0.5)
           for s in range(40)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10:20] == [1.0] * 10
    assert lrs[20:30] == [0.5] * 10
    assert lrs[30:40] == [0.25] * 10


def test_linear_scaling_multiplies_by_workers():
    assert effective_base_lr(0.1, "linear", 8) == pytest.approx(0.8)
    assert effective_base_lr(0.1, "none", 8) == 0.1
