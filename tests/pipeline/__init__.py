"""The pipeline end to end through the CLI and the stages: bad input, incremental nights, splicing,
the card, faults and signals."""
