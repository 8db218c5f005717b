"""After training: ``hvdtrain-export`` (a run or checkpoint to MXNet's deployable pair and
ONNX) and ``hvdtrain-predict`` (an export on image files, folders and packs)."""
