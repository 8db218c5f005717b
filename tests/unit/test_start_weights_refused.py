"""``--pretrained`` through MXNet's model store, and every start from weights that cannot be
made: one line, exit 2, nothing of a traceback.

What the pretrained tests prove, and what not: this machine has no route to MXNet's download
host, so the zoo's real files are never read here. Proven: the refusal offline, by MXNet's
real download code against the real host (when its name does not resolve) and against a
closed local port (anywhere); that ``--pretrained`` asks MXNet's store (``get_model_file``)
for ``$MXNET_HOME/models/<model>-<short hash>.params`` and loads what it returns, a
1000-class file in ``save_parameters`` form with its output layer replaced (the store's
SHA-1 check is stubbed to accept that file). Not proven: the zoo files' own key names
(``save_parameters`` form, or the older prefix-less names, both of which load:
test_start_weights.py), and the SHA-1 check and unzip of a real download.
"""
import os
import socket

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon
from mxnet.gluon import nn

from helpers import main_in_process, run_command, tool
from hvdtrain import job
from weights_cases import DIGITS, FIVE, arrays_of, assert_from, made, weights_lines

R18 = "resnet18_v1-a0666292.params"  # the model store's name: model and short hash
PRETRAINED = ["--dataset", "synthetic", "--image-size", "16", "--model", "resnet18_v1",
              "--pretrained", "--no-cuda", "--kvstore", "none", "--log-interval", "0"]


def refused(argv, capfd):
    """Run ``hvdtrain argv`` in this process; assert exit 2 and one line; return it."""
    code, lines = main_in_process(argv, capfd)
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("hvdtrain: error: "), lines
    return lines[0][len("hvdtrain: error: "):]


class Headless(gluon.HybridBlock):
    """A net with no 'output' block and not sequential: its output layer cannot be told."""

    def __init__(self, classes, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.body = nn.Conv2D(4, 3)
            self.fc = nn.Dense(classes)

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        return self.fc(self.body(x))


@pytest.mark.parametrize("case", ["another architecture", "another input", "truncated",
                                  "not a parameter file", "no weights in the folder",
                                  "does not exist"])
def test_weights_that_do_not_fit_are_one_line(case, tmp_path, capfd, five):
    path = tmp_path / "w.params"
    if case == "another architecture":
        made("mlp", 10, (3, 16, 16)).save_parameters(str(path))
        needle = (f"--init-from {path} holds 1.weight, which has no place in this pool_cnn "
                  f"(4 such arrays): weights for another architecture")
    elif case == "another input":
        made("pool_cnn", 5, (1, 16, 16)).save_parameters(str(path))
        needle = (f"--init-from {path}: 0.weight is (32, 1, 3, 3) there, (32, 3, 3, 3) here: "
                  f"weights for another architecture")
    elif case == "truncated":
        made("pool_cnn", 5, (3, 16, 16)).save_parameters(str(path))
        path.write_bytes(path.read_bytes()[:os.path.getsize(path) // 2])
        needle = (f"--init-from {path}: {path} ({os.path.getsize(path)} bytes) is truncated or "
                  f"not an MXNet parameter file: MXNet cannot read it")
    elif case == "not a parameter file":
        path.write_text("hello")
        needle = "(5 bytes) is truncated or not an MXNet parameter file: MXNet cannot read it"
    elif case == "no weights in the folder":
        path = tmp_path
        needle = (f"--init-from {tmp_path} holds no weights: no complete checkpoint, "
                  f"model.params, or exported model")
    else:
        path = tmp_path / "nothing"
        needle = f"--init-from {path} does not exist"
    line = refused(FIVE + ["--data-dir", five[0], "--init-from", str(path)], capfd)
    assert line.startswith(needle) or needle in line, line


def test_a_checkpoint_of_another_model_is_one_line(two_epochs, capfd):
    line = refused(DIGITS + ["--model", "mlp", "--init-from", str(two_epochs)], capfd)
    assert line == (f"--init-from {two_epochs}: checkpoint {two_epochs}/checkpoints/epoch-0002 "
                    f"holds a simple_cnn, not --model mlp: give --model simple_cnn")


def test_other_classes_and_no_output_layer_to_replace_is_one_line(monkeypatch, tmp_path,
                                                                  capfd, five):
    source = Headless(10)
    source.initialize()
    source(mx.nd.zeros((1, 3, 16, 16)))
    source.save_parameters(str(tmp_path / "ten.params"))
    monkeypatch.setattr(job, "build_model", lambda name, classes: Headless(classes))
    line = refused(FIVE + ["--data-dir", five[0], "--init-from", str(tmp_path / "ten.params")],
                   capfd)
    assert line == (f"--init-from {tmp_path}/ten.params: fc.weight is (10, 784) there, (5, 784) "
                    f"here: the data has 5 classes, the file 10, and this model has no output "
                    f"layer hvdtrain can replace (an 'output' block, or a sequential net "
                    f"ending in a layer with parameters)")


@pytest.mark.parametrize("flags,needle", [
    (["--init-from", "x", "--pretrained", "--model", "resnet18_v1"],
     "give either --pretrained or --init-from, not both"),
    (["--init-from", "x", "--resume", "y"],
     "--init-from starts a new run from weights, --resume y continues an earlier one with "
     "its optimizer state: give one of them"),
    (["--freeze-epochs", "1"], "--freeze-epochs fine-tunes the weights a run starts from: "
                               "add --init-from or --pretrained"),
    (["--head-lr-mult", "10"], "--head-lr-mult fine-tunes the weights a run starts from"),
    (["--pretrained"], "--pretrained: the model zoo has ImageNet weights for its own models "
                       "only, not for simple_cnn"),
    (["--init-from", "x", "--head-lr-mult", "0"], "--head-lr-mult must be positive, got 0.0"),
    (["--init-from", "x", "--freeze-epochs", "-1"], "--freeze-epochs must be >= 0, got -1"),
])
def test_flags_that_do_not_go_together_are_one_line(flags, needle, capfd):
    assert needle in refused(DIGITS + flags, capfd)


# -- --pretrained ----------------------------------------------------------------------------

def closed_port_url():
    """A local URL nothing listens on: MXNet's download is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def resolves(host):
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


@pytest.mark.parametrize("repo", ["MXNet's host", "a closed port"])
def test_pretrained_offline_is_one_line_naming_the_file_and_folder(repo, tmp_path):
    """A real process and MXNet's real download code: nothing it prints gets through."""
    env = {"MXNET_HOME": str(tmp_path / "mxnet")}
    if repo == "MXNet's host":
        from mxnet.gluon.model_zoo.model_store import apache_repo_url
        if resolves(apache_repo_url.split("/")[2]):
            pytest.skip("this machine can reach MXNet's download host")
    else:
        env["MXNET_GLUON_REPO"] = closed_port_url()
    proc = run_command([tool("hvdtrain")] + PRETRAINED, timeout=120, env=env)
    assert proc.returncode == 2, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith("hvdtrain: error: --pretrained: MXNet's model store could not "
                               "download resnet18_v1's ImageNet weights (ConnectionError: ")
    assert f"; place {R18} in {tmp_path}/mxnet/models ($MXNET_HOME/models), unzipped from " \
           f"http" in lines[0] and lines[0].endswith("gluon/models/resnet18_v1-a0666292.zip")


def test_pretrained_file_that_fails_the_checksum_is_said(monkeypatch, tmp_path, capfd):
    monkeypatch.setenv("MXNET_HOME", str(tmp_path))
    monkeypatch.setenv("MXNET_GLUON_REPO", closed_port_url())
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / R18).write_bytes(b"not the zoo's file")
    line = refused(PRETRAINED, capfd)
    assert line.startswith(f"--pretrained: the {R18} there does not match the zoo's checksum, "
                           f"and MXNet's model store could not download"), line


def test_pretrained_loads_what_mxnets_model_store_returns(start, monkeypatch, tmp_path):
    """The file placed where the store looks (its SHA-1 check stubbed): a 1000-class
    resnet18_v1 in save_parameters form; the run has 10 classes."""
    from mxnet.gluon.model_zoo import model_store
    monkeypatch.setenv("MXNET_HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    source = made("resnet18_v1", 1000, (3, 16, 16))
    source.save_parameters(str(tmp_path / "models" / R18))
    asked = []
    monkeypatch.setattr(model_store, "check_sha1", lambda path, sha1: asked.append(path) or True)
    code, lines, arrays = start(PRETRAINED)
    assert code == 0, lines
    assert asked == [str(tmp_path / "models" / R18)]
    expected = arrays_of(source)
    head = ("output.weight", "output.bias")
    assert_from(arrays, expected, [p for p in expected if p not in head])
    assert arrays["output.weight"].shape == (10, 512)
    [line] = weights_lines(lines)
    assert line.startswith(f"--pretrained: loaded 100 of the model's 102 arrays from "
                           f"{tmp_path}/models/{R18} (all but the output layer)"), line
    assert line.endswith("the data has 10 classes, the file 1000); left out of the file: "
                         "output.weight (1000, 512), output.bias (1000,)"), line
    assert not np.array_equal(arrays["output.bias"], expected["output.bias"][:10])
