"""One shard at a time: write it (``writer``: from the source, or record by record from a base shard),
splice it from byte ranges of its base shard (``splice``), and check it against its planned members
(``checks``). The write, reuse and validate stages are built on these; each reads its inputs from, and
stages its outputs in, the build's staging prefix (``image_tfrecords.staging``).
"""

