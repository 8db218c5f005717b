"""The predict row of `make bench`: ``hvdtrain-predict`` on ImageNet-like JPEGs (about 500x375)
at 224 pixels with an exported model, against MXNet's own C++ ``ImageRecordIter`` (resize the
shorter side to 256, centre crop 224, normalise) feeding the same export through
``SymbolBlock``, each with 1 and 2 decoding threads.

    python scripts/bench_predict.py --out PREFIX [--images 96] [--model resnet50_v1]
                                    [--threads 1,2] [--batch-size 16]

The export comes from a run folder made here (randomly initialised weights, 10 classes: the
speed does not depend on the values). Both sides time everything from opening the images to
the last batch's scores; each keeps its best of --rounds. Every process runs one OpenMP
thread (as the rest of the bench), so the figures compare the input work, not the forward.
Writes PREFIX.rank0.json (``{"rank": 0, "rows": [...]}``) as scripts/bench.py reads it.
"""
import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time

from bench_images import make_images


def make_export(folder, tmp, model, size):
    """Export a freshly initialised `model` for the classes of image folder `folder`."""
    import mxnet as mx
    from hvdtrain.data.card import CARD_FILE, model_card, write_card
    from hvdtrain.data.load import load_dataset
    from hvdtrain.models import build_model
    from hvdtrain.serve.export import export
    data = load_dataset("imagefolder", folder, size)
    net = build_model(model, data.num_classes)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, size, size)))
    run = os.path.join(tmp, "run")
    os.makedirs(run)
    net.save_parameters(os.path.join(run, "model.params"))
    write_card(os.path.join(run, CARD_FILE), model_card(model, data))
    out = os.path.join(tmp, "export")
    export(run, out, onnx=False)
    return out


def predict_rate(export_dir, images, threads, batch_size, count):
    from hvdtrain.serve.predict import main
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = main([export_dir, images, "--threads", str(threads), "--batch-size",
                     str(batch_size), "--top-k", "1"])
    if code != 0:
        sys.exit(f"bench_predict: hvdtrain-predict failed (exit {code})")
    return count / (time.perf_counter() - start)


def record_iter_rate(export_dir, pack, threads, batch_size, size):
    import warnings
    import mxnet as mx
    start = time.perf_counter()
    with warnings.catch_warnings():  # "cannot decide type" of `data`: it is float32
        warnings.simplefilter("ignore", UserWarning)
        net = mx.gluon.SymbolBlock.imports(os.path.join(export_dir, "model-symbol.json"),
                                           ["data"], os.path.join(export_dir, "model-0000.params"))
    net.hybridize()
    it = mx.io.ImageRecordIter(
        path_imgrec=os.path.join(pack, "train.rec"), data_shape=(3, size, size),
        batch_size=batch_size, resize=size * 256 // 224, round_batch=False,
        mean_r=123.68, mean_g=116.28, mean_b=103.53, std_r=58.395, std_g=57.12, std_b=57.375,
        preprocess_threads=threads)
    seen = 0
    for batch in it:
        used = batch_size - batch.pad
        net(batch.data[0][:used].as_in_context(mx.cpu())).asnumpy()
        seen += used
    return seen / (time.perf_counter() - start)


def main():
    from hvdtrain.data.pack import pack_folder
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--model", default="resnet50_v1")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    size = 224
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder, pack = os.path.join(tmp, "images"), os.path.join(tmp, "pack")
        make_images(folder, args.images)
        pack_folder(folder, pack)
        export_dir = make_export(folder, tmp, args.model, size)
        images = os.path.join(folder, "train")
        for threads in (int(t) for t in args.threads.split(",")):
            best = {"hvdtrain": 0.0, "mxnet": 0.0}
            for _ in range(args.rounds):
                best["hvdtrain"] = max(best["hvdtrain"], predict_rate(
                    export_dir, images, threads, args.batch_size, args.images))
                best["mxnet"] = max(best["mxnet"], record_iter_rate(
                    export_dir, pack, threads, args.batch_size, size))
            rows.append({"row": f"predict {args.model} at {size}, {threads} thread(s)",
                         "hvdtrain_predict_img_s": best["hvdtrain"],
                         "imagerecorditer_forward_img_s": best["mxnet"],
                         "ratio": best["hvdtrain"] / best["mxnet"], "images": args.images,
                         "batch_size": args.batch_size, "rounds": args.rounds})
            print(json.dumps(rows[-1]))
    with open(args.out + ".rank0.json", "w") as out:
        json.dump({"rank": 0, "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
