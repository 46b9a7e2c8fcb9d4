"""The build beyond one process: a plan of input parts, executors that map work over them, the driver's merge.

``plan`` cuts the inputs into parts that depend only on the inputs and ``read.part_bytes``; ``executors`` runs
the per-part work (``job.PartJob``) in this process, a local process pool or Ray actors;
``merge`` puts the parts' results together in part order, so every executor and worker count writes the same bytes.
"""
