"""The folder hvdtrain-launch puts first on its workers' PYTHONPATH (see sitecustomize)."""
