"""ResNet-18 on CIFAR-10 with Horovod, written with hvdtrain's library API.

    horovodrun -np 4 -H localhost:4 python examples/cifar10_resnet18.py \
        --data-dir ~/data/cifar-10-batches-bin --epochs 5

The `hvdtrain` command does the same with more options; this is the whole story on a page:
one store, one process per device, rank 0's parameters everywhere before the first step,
data split by worker, gradients averaged over the global batch, metrics summed over ranks.
"""
import argparse

import hvdtrain

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--data-dir", required=True, help="CIFAR-10 binary files")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=64, help="per device")
parser.add_argument("--lr", type=float, default=0.1, help="for the global batch")
parser.add_argument("--max-steps", type=int)
parser.add_argument("--output-dir")
parser.add_argument("--no-cuda", action="store_true")
args = parser.parse_args()

try:  # a bad flag or missing data files: one line, exit 2
    cfg = hvdtrain.TrainConfig(dataset="cifar10", data_dir=args.data_dir, model="resnet18_v1",
                               epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                               max_steps=args.max_steps, no_cuda=args.no_cuda,
                               output_dir=args.output_dir, log_interval=20)
    data = hvdtrain.load_dataset("cifar10", args.data_dir)    # random crop + flip, normalised
except hvdtrain.ConfigError as err:
    parser.exit(2, f"{parser.prog}: error: {err}\n")
net = hvdtrain.build_model("resnet18_v1", classes=data.num_classes)

dist = hvdtrain.DistContext.from_store(hvdtrain.create_store("horovod"))  # hvd.init() here
hvdtrain.setup_logging(dist.rank)                              # INFO from rank 0 only
devices = hvdtrain.select_devices(dist.local_rank, cfg.no_cuda)   # gpu(local_rank % visible)

hvdtrain.initialize(net, devices, data.image_shape, cfg.seed, dist.rank)
trainer = hvdtrain.build_trainer(net, cfg, dist)               # Gluon Trainer on the store
hvdtrain.broadcast_parameters(trainer, cfg.batch_size * len(devices) * dist.num_workers)

metrics = hvdtrain.MetricsWriter(args.output_dir and f"{args.output_dir}/metrics.jsonl",
                                 enabled=dist.is_root)
result = hvdtrain.fit(net, trainer, data, devices, dist, cfg, hvdtrain.Outputs(metrics))
if dist.is_root:
    print(f"test accuracy {result['test_acc']:.4f} on {result['test_count']:.0f} images")
