"""The published format: version folders, ``latest.json``, ``_SUCCESS``, manifests; one build per
version (a lock with a lease); removing stale staging."""
