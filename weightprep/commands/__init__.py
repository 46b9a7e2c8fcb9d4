"""Click commands of the build side (``build``, ``inspect``); the trainer and planner keep theirs beside them."""
