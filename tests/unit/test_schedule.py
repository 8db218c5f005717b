import pytest

from hvdtrain.loop.engine.schedule import effective_base_lr, lr_at


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


def test_cosine_and_poly_follow_gluoncv_after_the_warmup():
    """Written out from GluonCV's LRScheduler formulas: cosine (1 + cos(pi t)) / 2 and poly
    (1 - t) ** 2, t the share of the post-warm-up steps done."""
    import math
    total, warm = 50, 10  # 10 steps an epoch, 1 warm-up epoch
    for schedule, shape in (("cosine", lambda t: (1 + math.cos(math.pi * t)) / 2),
                            ("poly", lambda t: (1 - t) ** 2)):
        lrs = [lr_at(s, 10, 2.0, warmup_epochs=1, schedule=schedule, total_steps=total)
               for s in range(total + 1)]
        assert lrs[9] == pytest.approx(2.0)
        for step in range(warm, total + 1):
            assert lrs[step] == pytest.approx(2.0 * shape((step - warm) / (total - warm)))
        assert lrs[total] == pytest.approx(0.0)


def test_a_warm_up_as_long_as_the_run_warns_that_the_schedule_never_starts(capfd):
    """Found by a new user's trial: README's recipe line without --epochs (5, the default)
    and --warmup-epochs 5 ended at the peak rate, silently."""
    from hvdtrain import job
    from hvdtrain.config import TrainConfig
    run = dict(model="mlp", dataset="digits", no_cuda=True, kvstore="none", log_interval=0,
               progress=False, lr_schedule="cosine")
    job.train(TrainConfig(**run, epochs=1, warmup_epochs=1))
    err = capfd.readouterr().err
    assert ("--warmup-epochs 1 covers the whole run of 1 epochs (--epochs): the learning rate "
            "only climbs to its peak and never follows --lr-schedule cosine; give --epochs "
            "more than the warm-up") in err, err
    job.train(TrainConfig(**run, epochs=2, warmup_epochs=1))
    assert "covers the whole run" not in capfd.readouterr().err
