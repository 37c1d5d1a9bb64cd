"""The pure rules the stages apply: split assignment and duplicates (``splits``), shard counts and
members (``shards``), and what a build takes over from the version before it (``base_version``)."""
