"""Check that MXNet and Horovod are built the way hvdtrain needs them.

    python scripts/check_build.py [--gpu]

Always: Horovod 0.28.1 whose MXNet bindings import, built with Gloo and MPI. With --gpu also:
MXNet built with CUDA (mxnet-cu112, not the CPU wheel) and Horovod built with NCCL. Both are
read from the builds, not from a GPU, so the check runs where no GPU is (``docker build``).
Prints one line per problem and exits 1, or one summary line and exits 0.
scripts/install-deps.sh runs it; it needs nothing but MXNet and Horovod (not hvdtrain).
"""
import argparse
import sys

HOROVOD_VERSION = "0.28.1"


def find_problems(gpu):
    """Lines naming what is wrong with this environment's MXNet and Horovod builds."""
    try:
        import mxnet
        from mxnet.runtime import Features
    except Exception as err:  # pylint: disable=broad-except
        return ["mxnet does not import: %s" % _first_line(err)]
    problems = []
    if gpu and not Features().is_enabled("CUDA"):
        problems.append("MXNet %s is built without CUDA: install mxnet-cu112, not mxnet"
                        % mxnet.__version__)
    try:
        import horovod
        import horovod.mxnet as hvd
    except Exception as err:  # pylint: disable=broad-except
        return problems + ["horovod.mxnet does not import (Horovod must be built against the "
                           "installed MXNet): %s" % _first_line(err)]
    if horovod.__version__ != HOROVOD_VERSION:
        problems.append("Horovod is %s, not %s" % (horovod.__version__, HOROVOD_VERSION))
    if not hvd.gloo_built():
        problems.append("Horovod is built without Gloo (HOROVOD_WITH_GLOO=1)")
    if not hvd.mpi_built():
        problems.append("Horovod is built without MPI (HOROVOD_WITH_MPI=1)")
    if gpu and not hvd.nccl_built():
        problems.append("Horovod is built without NCCL (HOROVOD_GPU_OPERATIONS=NCCL)")
    return problems


def _first_line(err):
    text = str(err).strip()
    return "%s: %s" % (type(err).__name__, text.splitlines()[0] if text else "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true",
                        help="also require CUDA in MXNet and NCCL in Horovod")
    args = parser.parse_args(argv)
    problems = find_problems(args.gpu)
    for line in problems:
        print("check_build: %s" % line, file=sys.stderr)
    if problems:
        return 1
    import horovod.mxnet as hvd
    import mxnet.runtime
    print("check_build: ok: mxnet %s (CUDA %s), horovod %s (Gloo, MPI%s)" % (
        mxnet.__version__, "on" if mxnet.runtime.Features().is_enabled("CUDA") else "off",
        HOROVOD_VERSION, ", NCCL" if hvd.nccl_built() else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
