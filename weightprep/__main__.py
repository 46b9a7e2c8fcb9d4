"""``python -m weightprep`` (and ``torchrun -m weightprep`` / ``accelerate launch -m weightprep``)."""

from weightprep.cli import run

run()
