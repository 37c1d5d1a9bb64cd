"""Reading published versions: ``load_split`` and friends for ``tf.data`` (``loader``), and the
datasets page's views (``browse``)."""
