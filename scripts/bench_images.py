"""Input-pipeline rows of `make bench`: hvdtrain's image loader against MXNet's C++
``ImageRecordIter`` on the same ImageNet-like JPEGs (about 500x375), and peak memory for a
pack ten times larger than another.

    python scripts/bench_images.py --out PREFIX [--images N] [--threads 1,2] [--repeats 3]

(a) decode + training transforms at 224, img/s per data worker: hvdtrain from RecordIO and
from the folder, ImageRecordIter (random resized crop, flip, colour jitter, PCA noise) from
RecordIO with the same number of threads. (c) peak RSS of one process iterating a pack of N
images and one of 10 N (the same images repeated), at 64 px to keep it short. Writes
PREFIX.rank0.json (the bench's record format).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

BATCH = 32


class Rate:
    """Images read in `wall` seconds using `cpu` seconds of the process's CPU (all threads:
    ImageRecordIter reads and batches on threads of its own beside its decoding threads)."""

    def __init__(self, images, wall, cpu):
        self.per_second = images / wall
        self.per_cpu_second = images / cpu


def make_images(folder, count, seed=0):
    """`count` smooth random colour JPEGs of 500x375 in 10 class folders of train/ and val/."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    for index in range(count):
        for split in ("train", "val"):
            if split == "val" and (index // 10) % 10:  # a tenth, every class
                continue
            small = rng.integers(0, 256, size=(12, 16, 3), dtype=np.uint8)
            image = Image.fromarray(small).resize((500, 375), Image.BICUBIC)
            path = os.path.join(folder, split, f"c{index % 10}")
            os.makedirs(path, exist_ok=True)
            image.save(os.path.join(path, f"{index:06d}.jpg"), quality=90)


def hvdtrain_rate(kind, root, threads, size=224):
    from hvdtrain.data.sampler import SplitSampler
    from hvdtrain.data.streamed import ImageLoader, load_images
    start, cpu = time.perf_counter(), time.process_time()  # opening the data counts
    data = load_images(kind, root, size)
    loader = ImageLoader(data.train, SplitSampler(data.num_train, shuffle=True), BATCH,
                         train=True, image_size=size, data_workers=threads)
    seen = 0
    for _, labels in loader:
        seen += len(labels)
    return Rate(seen, time.perf_counter() - start, time.process_time() - cpu)


def record_iter_rate(pack, threads):
    import mxnet as mx
    # From before the iterator exists: its constructor already decodes the first batches
    # (0.25 s of a 256-image pack here), work a timer started after it would not count.
    start, cpu = time.perf_counter(), time.process_time()
    it = mx.io.ImageRecordIter(
        path_imgrec=os.path.join(pack, "train.rec"), path_imgidx=os.path.join(pack, "train.idx"),
        data_shape=(3, 224, 224), batch_size=BATCH, shuffle=True, rand_mirror=True,
        random_resized_crop=True, min_random_area=0.08, max_random_area=1.0,
        min_aspect_ratio=3 / 4, max_aspect_ratio=4 / 3, brightness=0.4, contrast=0.4,
        saturation=0.4, pca_noise=0.1, mean_r=123.68, mean_g=116.28, mean_b=103.53,
        std_r=58.395, std_g=57.12, std_b=57.375, preprocess_threads=threads)
    seen = 0
    for batch in it:
        seen += BATCH - batch.pad
    return Rate(seen, time.perf_counter() - start, time.process_time() - cpu)


def repeat_pack(pack, out, times):
    """A pack holding every training record of `pack` `times` times (and its val split)."""
    import mxnet as mx
    import shutil
    os.makedirs(out, exist_ok=True)
    for name in ("val.rec", "val.idx", "classes.txt"):
        shutil.copy(os.path.join(pack, name), out)
    src = mx.recordio.MXIndexedRecordIO(os.path.join(pack, "train.idx"),
                                        os.path.join(pack, "train.rec"), "r")
    dst = mx.recordio.MXIndexedRecordIO(os.path.join(out, "train.idx"),
                                        os.path.join(out, "train.rec"), "w")
    key = 0
    for _ in range(times):
        for old in sorted(src.keys):
            dst.write_idx(key, src.read_idx(old))
            key += 1
    src.close()
    dst.close()


def peak_rss_mb(pack):
    """Peak RSS of a fresh process that opens `pack` and iterates one epoch of it."""
    code = ("import resource, sys; sys.argv = ['x']; import bench_images as b; "
            f"b.hvdtrain_rate('recordio', {pack!r}, 2, size=64); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(__file__)), check=True)
    return int(out.stdout.split()[-1]) / 1024


def main():
    from hvdtrain.data.pack import pack_folder
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved runs of each side; the best of each is reported")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder, pack = os.path.join(tmp, "images"), os.path.join(tmp, "pack")
        make_images(folder, args.images)
        pack_folder(folder, pack)
        for threads in (int(t) for t in args.threads.split(",")):
            # Interleaved repeats, best of each: on a shared machine a load spike then hits
            # one repeat of one side, not the whole comparison.
            measured = {"reference": [], "recordio": [], "folder": []}
            for _ in range(args.repeats):
                measured["reference"].append(record_iter_rate(pack, threads))
                for source, kind, root in (("recordio", "recordio", pack),
                                           ("folder", "imagefolder", folder)):
                    measured[source].append(hvdtrain_rate(kind, root, threads))
            rate = {side: max(r.per_second for r in runs) for side, runs in measured.items()}
            # Images per CPU second: what each side gets from the CPU it used, whatever
            # else was running (ImageRecordIter's reading threads come on top of its
            # decoding threads).
            thrift = {side: max(r.per_cpu_second for r in runs) for side, runs in measured.items()}
            for source in ("recordio", "folder"):
                rows.append({"row": f"input pipeline, {source}, {threads} thread(s)",
                             "hvdtrain_img_s": rate[source],
                             "image_record_iter_img_s": rate["reference"],
                             "ratio": rate[source] / rate["reference"],
                             "per_worker_img_s": rate[source] / threads,
                             "hvdtrain_img_per_cpu_s": thrift[source],
                             "image_record_iter_img_per_cpu_s": thrift["reference"],
                             "cpu_ratio": thrift[source] / thrift["reference"],
                             "repeats": args.repeats})
        big = os.path.join(tmp, "pack10")
        repeat_pack(pack, big, 10)
        small_mb, big_mb = peak_rss_mb(pack), peak_rss_mb(big)
        rows.append({"row": "peak RSS, pack 10x larger", "small_pack_mb": small_mb,
                     "large_pack_mb": big_mb, "difference_mb": big_mb - small_mb})
    with open(args.out + ".rank0.json", "w") as out:
        json.dump({"rank": 0, "rows": rows}, out, indent=1)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
