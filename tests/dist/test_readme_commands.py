"""Every command line of README.md and docs/ runs as written, or is read by its own parser.

Lines one machine can run are run for real, with only these stand-ins: CIFAR-10 is a small
set of generated CIFAR-format files, `runs/...` is a temporary folder, epochs are cut to one
(two for a resume), `synthetic` runs and runs on image folders and packs stop after 2 or 3
steps, ResNet-50 trains as ResNet-18, a line starting more local ranks
than this 2-core machine has cores starts 2, the hosts `d1`/`d2` are two loopback "hosts"
behind a private sshd (one slot each instead of 4, where hvdtrain trains the small
`simple_cnn`), and `mpirun` gets `--allow-run-as-root`. Lines that need a GPU, Docker
or Slurm are read by the programs that would read them: hvdtrain's parser, horovodrun's own
parser, `bash -n`, `make -n`.
A new line in a document is picked up without anyone adding a test.
"""
import json
import os
import shlex
import subprocess
import sys

import pytest

from helpers import BIN, REPO, run_command
from hvdtrain.cli import parse_config
from hvdtrain.data.datasets import write_cifar_files
from hvdtrain.launch.launcher import parse_args as parse_launch_args
from hvdtrain.launch.command import command_argv
from hvdtrain.models import check_model_name
from hvdtrain.check.preflight import build_parser as preflight_parser
from jobs import JOB_TIMEOUT
from loopback_hosts import SSH_OPTIONS, loopback_hosts
from readme_commands import covered_commands, documents, python_blocks

pytestmark = pytest.mark.dist
COMMANDS = covered_commands()
CIFAR_PATHS = ("~/data/cifar-10-batches-bin", "/data/cifar-10-batches-bin")
# ImageNet as a folder and as a pack: stood in for by generated digit images (20 a class);
# a user's own photos (to fine-tune on) by five other classes of them (docs/fine-tuning.md).
IMAGENET_PATHS = {"~/data/imagenet-rec": "imagenet-rec", "~/data/imagenet": "imagenet",
                  "~/data/photos": "photos"}
FAR_HOSTS = ("d1", "d2")
# One rank a far host: such a line shows the launch across hosts. Two ranks a host, each
# launcher form, run in tests/dist/test_multihost.py and test_preflight.py.
FAR_SLOTS = 1
# Local ranks a line starts at most: one a core.
LOCAL_RANKS = 2
# A deep zoo net trained here as a shallower one of its family: the same code path (a zoo
# ResNet from its name, --last-gamma's blocks) at a third of the cost (README.md's ResNet-50
# lines took 24 s each in the suite, 2026-12-05). ResNet-50 itself is built, exported and
# compared with onnxruntime in tests/unit/test_export.py.
DEEP_MODELS = {"resnet50_v1": "resnet18_v1"}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme")
    write_cifar_files(str(root / "cifar"), num_train=256, num_test=64)
    return root


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with loopback_hosts(tmp_path_factory.mktemp("ssh")) as running:
        yield running


# --- reading a line with the program that will read it ---------------------------------

def horovodrun_args(argv):
    """horovodrun's own parser applied to `argv` (without the program name)."""
    from horovod.runner.launch import parse_args  # pylint: disable=import-outside-toplevel
    saved = sys.argv
    sys.argv = ["horovodrun"] + list(argv)
    try:
        return parse_args()
    except SystemExit as err:
        pytest.fail(f"horovodrun cannot parse {argv}: exit {err.code}")
    finally:
        sys.argv = saved


def program_start(argv):
    """Index of the program in a launcher's argv (hvdtrain, hvdtrain-check or python ...)."""
    for index, word in enumerate(argv):
        if os.path.basename(word) in ("hvdtrain", "hvdtrain-check", "python", "python3") \
                or word == sys.executable:
            return index
    pytest.fail(f"no training program in {argv}")


def check_program(argv):
    """Parse a program a launcher starts: hvdtrain's flags, or an example script that exists."""
    if os.path.basename(argv[0]) == "hvdtrain":
        parse_config(argv[1:])
    elif os.path.basename(argv[0]) == "hvdtrain-check":
        preflight_parser().parse_args(argv[1:])
    elif os.path.basename(argv[0]).startswith("python"):
        assert os.path.exists(os.path.join(REPO, argv[1])), argv
    elif argv[0] == "/usr/sbin/sshd":
        image = open(os.path.join(REPO, "Dockerfile")).read() \
            + open(os.path.join(REPO, "scripts", "install-deps.sh")).read()
        assert "openssh-server" in image  # the image is installed through install-deps.sh
    else:
        pytest.fail(f"unexpected program {argv}")


def check_docker(argv):
    """`docker build` needs our Dockerfile; `docker run` an image we build and a command
    its own parsers accept."""
    if argv[1] == "build":
        assert "-t" in argv and os.path.exists(os.path.join(REPO, argv[-1], "Dockerfile"))
        return
    assert argv[1] == "run", argv
    takes_value = {"-v", "--volume", "-p", "--publish", "-e", "--env", "--network", "--gpus",
                   "--name", "--cap-add", "--device", "-w", "--workdir", "--ipc", "--shm-size"}
    index = 2
    while argv[index].startswith("-"):
        index += 2 if argv[index] in takes_value else 1
    image, command = argv[index], argv[index + 1:]
    assert image == "hvdtrain:gpu", argv
    options = argv[2:index]
    if any(o.startswith("--gpus") for o in options):
        # NCCL's shared-memory transport needs more than Docker's default 64 MB /dev/shm.
        assert any(o.startswith(("--shm-size", "--ipc")) for o in options), argv
    if command[0] == "horovodrun":
        args = horovodrun_args(command[1:])
        check_program(args.command)
    else:
        check_program(command)


# --- running a line on this machine ------------------------------------------------------

def is_far(argv):
    """Whether `argv` names the far hosts d1/d2 (directly or through a hostfile of them)."""
    words = " ".join(argv).replace(":", " ").replace(",", " ").split()
    return any(h in words for h in FAR_HOSTS) or any("two-hosts" in w for w in argv)


def localize(argv, workspace):
    """`argv` with this machine's stand-ins for the data and the output folders."""
    out = []
    for word in argv:
        for path in CIFAR_PATHS:
            word = word.replace(path, str(workspace / "cifar"))
        for path, stand_in in IMAGENET_PATHS.items():
            if word == path or word.startswith(path + "/"):  # the folder, or one inside it
                word = str(workspace / stand_in) + word[len(path):]
                ensure_images(workspace)
        out.append(str(workspace / word) if word.startswith("runs/") else word)
    if "--model" in out and out[out.index("--model") + 1] in DEEP_MODELS \
            and "--pretrained" not in out:
        check_model_name(out[out.index("--model") + 1])  # the name as written is one
        out[out.index("--model") + 1] = DEEP_MODELS[out[out.index("--model") + 1]]
    if out[0] in ("horovodrun", "mpirun") and "-np" in out and not is_far(out) \
            and int(out[out.index("-np") + 1]) > LOCAL_RANKS:
        # `-np 4 -H localhost:4` on 2 cores: four start-ups of the same program, no more.
        out[out.index("-np") + 1] = str(LOCAL_RANKS)
        if "-H" in out:
            out[out.index("-H") + 1] = f"localhost:{LOCAL_RANKS}"
    if any(w in ("imagefolder", "recordio") for w in argv) and "--image-size" not in argv:
        out += ["--image-size", "32", "--max-steps", "2"]  # a model-zoo net at 224: minutes
    elif any(w in ("imagefolder", "recordio") for w in argv) and "--max-steps" not in argv:
        # A few steps exercise every option of the step; the evaluation, the outputs and
        # the summary run as after a whole epoch (a recipe line's epoch: 15 steps).
        out += ["--max-steps", "3"]
    elif "synthetic" in argv and "--image-size" in out:
        out[out.index("--image-size") + 1] = "32"  # the same reason
    return out


def ensure_images(workspace):
    """The ImageNet stand-ins: a generated image folder and its pack, and the photos: the
    folder's digit5..digit9 (made once)."""
    from helpers import class_subset, image_sets
    folder, pack = image_sets(str(workspace / "images-source"), per_class=20)
    for stand_in, source in (("imagenet", folder), ("imagenet-rec", pack)):
        if not os.path.exists(workspace / stand_in):
            os.symlink(source, workspace / stand_in)
    if not os.path.exists(workspace / "photos"):
        class_subset(folder, str(workspace / "photos"), [f"digit{d}" for d in range(5, 10)])


def to_loopback_hosts(argv, hosts):
    """`argv` with the loopback hosts (FAR_SLOTS each) in place of d1/d2 and their
    hostfiles, and the options that reach their private sshd."""
    out = argv[:1] + ssh_options(argv[0], hosts)
    words = iter(enumerate(argv[1:], 1))
    for index, word in words:
        if word == "-np":
            out += ["-np", str(FAR_SLOTS * len(hosts.addresses))]
            next(words)
        elif word == "-H" and not argv[index + 1].startswith("hostfiles/"):
            out += ["-H", ",".join(f"{a}:{FAR_SLOTS}" for a in hosts.addresses)]
            next(words)
        elif word.startswith("hostfiles/two-hosts"):
            fmt = {".hostfile": "{address} slots={slots}", "4gpu.txt": "{address}:{slots}"}
            fmt = next((f for end, f in fmt.items() if word.endswith(end)), "{address}")
            out.append(hosts.hostfile(slots=FAR_SLOTS, fmt=fmt, name=os.path.basename(word)))
        else:
            out.append(word)
    return out


def ssh_options(launcher, hosts):
    """The options of `launcher` that reach the loopback hosts' private sshd."""
    name = os.path.basename(launcher)
    if name == "horovodrun":
        return ["-p", str(hosts.port), "-i", hosts.key, "--network-interface", "lo"]
    if name == "mpirun":
        ssh = " ".join(SSH_OPTIONS + ["-p", str(hosts.port), "-i", hosts.key])
        return ["-mca", "plm_rsh_args", ssh, "-mca", "btl", "tcp,self",
                "-mca", "btl_tcp_if_include", "lo", "-mca", "oob_tcp_if_include", "lo"]
    return ["-p", str(hosts.port), "-i", hosts.key]  # hvdtrain-launch, check-cluster.sh


def shorten(argv, far=False):
    """Flags that keep a documented training run to a few seconds. On the far hosts (`far`)
    hvdtrain trains the small simple_cnn: what such a line shows is the launch across hosts,
    and four ranks of the default ResNet-18 on two cores take a minute (the same model and
    data at four ranks run for real in README.md's local line)."""
    names = [os.path.basename(w) for w in argv]
    trains = "hvdtrain" in names or "parameter_server.sh" in names \
        or any(w.startswith("examples/") and w.endswith(".py") for w in argv)
    if not trains:
        return []
    extra = ["--epochs", "2" if "--resume" in argv else "1"]
    if far and "hvdtrain" in names:
        extra += ["--model", "simple_cnn"]
    if "hvdtrain" in names or "parameter_server.sh" in names:
        extra += ["--log-interval", "0"]
    if "synthetic" in argv or any(w.startswith("examples/") and w.endswith(".py") for w in argv):
        extra += ["--max-steps", "3"]
    return extra


def zoo_stand_in(model, workspace):
    """The environment in which ``--pretrained`` finds `model`'s ImageNet weights: a stand-in
    file (freshly initialised, 1000 classes, as the zoo's) in $MXNET_HOME/models, accepted by
    MXNet's model store through tests/zoo_stand_in/sitecustomize.py."""
    import hashlib
    import mxnet as mx
    from hvdtrain.models import build_model
    home = workspace / "mxnet-home"
    models = home / "models"
    found = list(models.glob(f"{model}-*.params")) if models.exists() else []
    if not found:
        models.mkdir(parents=True, exist_ok=True)
        net = build_model(model, 1000)
        net.initialize(mx.init.Xavier())
        net(mx.nd.zeros((1, 3, 32, 32)))
        net.save_parameters(str(models / "stand-in.params"))
        sha1 = hashlib.sha1((models / "stand-in.params").read_bytes()).hexdigest()
        found = [models / f"{model}-{sha1[:8]}.params"]
        (models / "stand-in.params").rename(found[0])
    sha1 = hashlib.sha1(found[0].read_bytes()).hexdigest()
    return {"MXNET_HOME": str(home), "HVDTRAIN_TEST_ZOO": f"{model}={sha1}",
            "PYTHONPATH": os.pathsep.join(filter(None, [
                os.path.join(REPO, "tests", "zoo_stand_in"), os.environ.get("PYTHONPATH")]))}


def run_line(argv, workspace, hosts_factory):
    """Run a documented line here; check its exit status and what it says it writes."""
    env = zoo_stand_in(argv[argv.index("--model") + 1], workspace) \
        if "--pretrained" in argv else None
    argv = localize(argv, workspace)
    name = os.path.basename(argv[0])
    if name == "mpirun":
        argv = argv[:1] + ["--allow-run-as-root"] + argv[1:]
    far = is_far(argv)
    if far:
        hosts = hosts_factory()
        if name in ("horovodrun", "mpirun") and "--gloo" not in argv \
                and not hosts.distinct_hostnames:
            pytest.skip("Open MPI's shared-memory transport crashes when two 'hosts' share "
                        "one hostname, and this sandbox cannot give them their own")
        argv = to_loopback_hosts(argv, hosts)
    argv = argv + shorten(argv, far)
    if argv[0].startswith(("scripts/", "examples/")):
        argv[0] = os.path.join(REPO, argv[0])
    proc = run_command(argv, timeout=JOB_TIMEOUT, env=env)
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stdout[-4000:]}"
    if "--eval-only" in argv:
        report = os.path.join(argv[argv.index("--output-dir") + 1], "eval.json")
        assert json.load(open(report))["samples"] > 0
    elif "--output-dir" in argv:
        metrics = os.path.join(argv[argv.index("--output-dir") + 1], "metrics.jsonl")
        last = json.loads(open(metrics).read().splitlines()[-1])
        assert last["event"] == "end", last
    if name == "hvdtrain-plot":
        assert os.path.getsize(argv[argv.index("-o") + 1]) > 0
    return proc


def ensure_metrics(argv):
    """hvdtrain-plot reads metrics files; a line run on its own finds them made here."""
    for word in argv[1:]:
        if word.endswith("metrics.jsonl") and not os.path.exists(word):
            proc = run_command([os.path.join(BIN, "hvdtrain"), "--dataset", "digits",
                                "--no-cuda", "--epochs", "1", "--log-interval", "0",
                                "--output-dir", os.path.dirname(word)], timeout=JOB_TIMEOUT)
            assert proc.returncode == 0, proc.stdout[-3000:]


def _launch_and_flags(argv):
    """(the launcher part and program of a training line, its program's flags as
    (name, value) pairs), or None for a line that starts no hvdtrain or example."""
    names = [os.path.basename(w) for w in argv]
    if "hvdtrain" not in names and not any(w.startswith("examples/") for w in argv):
        return None
    start = program_start(argv) if "hvdtrain" in names or "python" in names else 0
    head = tuple(argv[:start + (2 if names[start].startswith("python") else 1)])
    rest = argv[len(head):]
    pairs = set()
    for index, word in enumerate(rest):
        if word.startswith("-"):
            value = rest[index + 1] if index + 1 < len(rest) else None
            pairs.add((word, None if value is None or value.startswith("-") else value))
    return head, frozenset(pairs)


def repeats(commands):
    """{command: another command that covers it}: a line with the same launcher invocation
    and program as another line that runs, whose flags (names and values) are all among
    that line's, repeats it: running it would exercise nothing new. The other line comes
    earlier, or (for a line that writes nothing: no --output-dir, which a later line could
    need) anywhere in the documents. A repeat is still read by the programs' own parsers
    (horovodrun's, hvdtrain's)."""
    keyed = [(c, _launch_and_flags(c.argv)) for c in commands]
    keyed = [(c, k) for c, k in keyed if k is not None]
    run, covered = [], {}
    for command, key in keyed:
        earlier = next((c for c, k in run if k[0] == key[0] and key[1] <= k[1]), None)
        if earlier is None:
            run.append((command, key))
        else:
            covered[command] = earlier
    for command, key in list(run):
        if "--output-dir" in command.argv:
            continue
        later = next((c for c, k in run if c is not command and k[0] == key[0]
                      and key[1] < k[1] and c not in covered), None)
        if later is not None:
            covered[command] = later
            run.remove((command, key))
    return covered


REPEATS = repeats(COMMANDS)

#: Lines that another test already runs (the same launcher form, program and flags or more,
#: with stronger assertions), or that repeat a line here but for a setting the stand-ins
#: override (epochs) or that this machine ignores (NCCL's log level). They are read by their
#: programs' parsers, not run again; each names what runs it.
RUN_ELSEWHERE = {
    "hvdtrain --dataset digits --no-cuda":
        "tests/unit/test_cli.py::test_single_worker_without_launcher",
    # The script execs this line with more flags.
    "hvdtrain-launch -n 2 -s 2 hvdtrain --kvstore dist_sync --dataset digits --no-cuda":
        "tests/dist/test_examples.py::test_parameter_server_script",
    "examples/parameter_server.sh --output-dir runs/ps":
        "tests/dist/test_examples.py::test_parameter_server_script",
    "horovodrun -np 2 -H localhost:2 python examples/cifar10_resnet18.py --data-dir "
    "~/data/cifar-10-batches-bin --epochs 5":
        "tests/dist/test_examples.py::test_cifar10_resnet18",
    "mpirun -np 4 -H localhost:4 python examples/sweep_mpi.py --lr 0.05 --lr 0.2 --runs-dir "
    "runs/sweep --dataset digits --no-cuda --epochs 5":
        "tests/dist/test_examples.py::"
        "test_sweep_mpi_trains_two_independent_runs_on_sub_communicators",
    "horovodrun --gloo -np 2 -H localhost:2 hvdtrain-check":
        "tests/dist/test_preflight.py::test_every_rank_ready_under_each_launcher",
    "horovodrun -np 2 -H localhost:2 hvdtrain --dataset synthetic --max-steps 20 "
    "--horovod-timeline runs/timeline.json":
        "tests/dist/test_horovod.py::test_timeline_shows_buckets_reduced_in_place",
    # Training across the two hosts under each launcher form: four ranks of hvdtrain's
    # main, two on each loopback host, placement, accuracy and replicas checked
    # (rank_worker.py). README.md:7 and docs/data.md:85 (-H, on CIFAR and on a pack) run
    # here as well; hvdtrain on CIFAR-10 runs locally in README.md:58.
    "horovodrun -np 8 --hostfile hostfiles/two-hosts-4gpu.hostfile hvdtrain --data-dir "
    "~/data/cifar-10-batches-bin":
        "tests/dist/test_multihost.py::test_four_ranks_on_two_hosts",
    "horovodrun --gloo -np 8 -H d1:4,d2:4 hvdtrain --data-dir ~/data/cifar-10-batches-bin":
        "tests/dist/test_multihost.py::test_four_ranks_on_two_hosts",
    "mpirun -np 8 --hostfile hostfiles/two-hosts-4gpu.hostfile --bind-to none -x PATH -x "
    "LD_LIBRARY_PATH hvdtrain --data-dir ~/data/cifar-10-batches-bin":
        "tests/dist/test_multihost.py::test_four_ranks_on_two_hosts",
    "mpirun -np 8 --hostfile hostfiles/two-hosts-4gpu.hostfile --bind-to none -x PATH -x "
    "LD_LIBRARY_PATH -x NCCL_DEBUG=INFO hvdtrain --data-dir ~/data/cifar-10-batches-bin":
        "tests/dist/test_multihost.py::test_four_ranks_on_two_hosts",
    # hvdtrain-check across the two hosts under horovodrun, Gloo and mpirun, four ranks, one
    # with another install (its table and lines checked). On a pack, in
    # tests/unit/test_images.py::test_check_names_a_rank_whose_pack_differs.
    "horovodrun -np 8 -H d1:4,d2:4 hvdtrain-check --data-dir ~/data/cifar-10-batches-bin":
        "tests/dist/test_preflight.py::test_two_hosts_and_a_rank_that_differs",
    "horovodrun -np 8 -H d1:4,d2:4 hvdtrain-check --data-dir ~/data/imagenet-rec":
        "tests/dist/test_preflight.py::test_two_hosts_and_a_rank_that_differs",
    "mpirun -np 8 -H d1:4,d2:4 --bind-to none -x PATH hvdtrain-check --data-dir "
    "~/data/cifar-10-batches-bin":
        "tests/dist/test_preflight.py::test_two_hosts_and_a_rank_that_differs",
    "hvdtrain-launch -n 2 -s 2 -H hostfiles/two-hosts-ps.txt hvdtrain --kvstore dist_sync "
    "--data-dir ~/data/cifar-10-batches-bin --epochs 5":
        "hvdtrain-launch -n 2 -s 2 -H hostfiles/two-hosts-ps.txt hvdtrain --kvstore dist_sync "
        "--data-dir ~/data/cifar-10-batches-bin --gpus 0,1,2,3",
}


def test_lines_run_elsewhere_name_what_runs_them():
    """Each line RUN_ELSEWHERE skips is still in a document, and what it names exists: a
    test function, or a line of the documents that this file runs."""
    texts = {command.text for command in COMMANDS}
    for line, runner in RUN_ELSEWHERE.items():
        assert line in texts, f"no document has this line any more: {line}"
        if "::" in runner:
            path, name = runner.split("::")
            assert f"def {name}(" in open(os.path.join(REPO, path)).read(), runner
        else:
            assert runner in texts and runner not in RUN_ELSEWHERE, runner


def _param(command):
    # Lines on the far hosts start 4 ranks behind a private sshd on 2 cores: minutes.
    slow = is_far(command.argv) and command.first in ("horovodrun", "mpirun",
                                                      "hvdtrain-launch")
    return pytest.param(command, id=str(command), marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("command", [_param(c) for c in COMMANDS])
def test_documented_command(command, workspace, request):
    argv = command.argv
    first = command.first
    hosts_factory = lambda: request.getfixturevalue("hosts")  # noqa: E731 (started on demand)
    if first == "make":
        for target in argv[1:]:
            dry = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True,
                                 text=True, timeout=60)
            assert dry.returncode == 0, f"make has no target {target}: {dry.stderr}"
        return  # CI runs `make demo` and `make test` themselves (.ci/run)
    if first == "docker":
        check_docker(argv)
        return
    if first == "sbatch":
        script = os.path.join(REPO, argv[-1])
        assert subprocess.run(["bash", "-n", script]).returncode == 0
        text = open(script).read().replace("\\\n", " ")
        launch = shlex.split(text[text.index("mpirun"):].splitlines()[0])
        check_program([w.replace("$SLURM_JOB_ID", "1") for w in launch[program_start(launch):]])
        return
    if first == "horovodrun":
        args = horovodrun_args(argv[1:])
        check_program(args.command)
        if command in REPEATS:
            return  # read, not run: REPEATS[command] runs the same command with more flags
    elif first == "hvdtrain-launch":
        # One quoted string is read as launch.py's bash reads it.
        check_program(command_argv(parse_launch_args(argv[1:]).command))
        if command in REPEATS:
            return  # read, not run, as above
    elif first == "hvdtrain":
        if "--help" in argv:
            parse_or_help = run_command([os.path.join(BIN, "hvdtrain"), "--help"], timeout=60)
            assert parse_or_help.returncode == 0
            return
        check_program(argv)
    elif first == "scripts/" and argv[0].endswith("install-deps.sh"):
        script = os.path.join(REPO, argv[0])
        assert subprocess.run(["bash", "-n", script]).returncode == 0
        return  # `make install` runs it for real before the suite
    elif first == "hvdtrain-plot":
        ensure_metrics(localize(argv, workspace))
    elif first == "mpirun":
        check_program(argv[program_start(argv):])
    elif first == "examples/":
        assert subprocess.run(["bash", "-n", os.path.join(REPO, argv[0])]).returncode == 0
    elif first == "hvdtrain-pack" and not os.path.exists(localize(argv, workspace)[1]):
        from hvdtrain.data.sample_images import write_digit_images  # the line before it
        write_digit_images(localize(argv, workspace)[1], per_class=20)
    if command.text in RUN_ELSEWHERE:
        return  # read above; run by RUN_ELSEWHERE[command.text]
    run_line(argv, workspace, hosts_factory)


PYTHON_BLOCKS = [(document, block) for document in documents()
                 for block in python_blocks(open(os.path.join(REPO, document)).read())]


@pytest.mark.parametrize("document, block", PYTHON_BLOCKS,
                         ids=[f"{d}#{i}" for i, (d, _) in enumerate(PYTHON_BLOCKS)])
def test_documented_python_runs(document, block, tmp_path):
    """Library snippets run as written, as one worker."""
    script = tmp_path / "snippet.py"
    script.write_text(block)
    proc = run_command([sys.executable, str(script)], timeout=JOB_TIMEOUT, cwd=str(tmp_path))
    assert proc.returncode == 0, f"{document}:\n{block}\n{proc.stdout[-3000:]}"
