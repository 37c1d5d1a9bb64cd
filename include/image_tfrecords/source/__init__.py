"""Reading a source: listing a folder or an S3 prefix (as of a snapshot time), reading files without
leaving it, and the checks of source and destination before any work starts."""
