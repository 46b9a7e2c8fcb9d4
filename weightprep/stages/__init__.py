"""The build pipeline's stages, in order: read, validate, tokenize, assemble, mask, filter, pack, write.

Each stage is a pure function (or a small frozen dataclass) over a columnar batch from
``weightprep.batches``; ``weightprep.blocks`` chains them per block and counts, ``weightprep.distribute.job`` per input split.
"""
