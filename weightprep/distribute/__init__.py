"""The build beyond one process: a plan of input splits, executors that map work over them, the driver's merge.

``plan`` cuts the inputs into splits that depend only on the inputs and ``read.split_bytes``; ``executors`` runs
the per-split work (``job.SplitJob``) in this process, a local process pool or Ray actors;
``merge`` puts the splits' results together in split order, so every executor and worker count writes the same bytes.
"""
