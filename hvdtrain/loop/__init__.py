"""The engine any model trains on, in rooms that show the plan:

- ``engine/``: one step and one epoch for any batch processor (the counts every rank sums,
  the update, accumulation, AMP's scale, the finite guard), sharded evaluation, metrics
  reduced over the ranks, running statistics averaged, the trainer on the run's store
  (``--no-wd``'s exemptions among its settings);
- ``run/``: a run's epochs and what each epoch's end decides (``decisions.py``: evaluate,
  save, stop), the votes at step boundaries, the outputs, leaving together;
- ``recipe/``: what a run adds to the step (clipping, the moving average, last gammas,
  mixing);
- ``weights/``: the weights a run starts from, the parameter files, fine-tuning's phases;
- ``elastic/``: elastic training's state and its run under Horovod's driver.

Lower rooms never import higher ones (tests/unit/test_layout.py): engine, then recipe and
weights, then run, then elastic.
"""
