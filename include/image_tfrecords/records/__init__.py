"""What a record is: TFRecord framing (and ``.tfindex``), ``tf.train.Example`` encoding, the record
schema (feature keys), labels.csv columns as features, and TFDS's metadata for a version."""
