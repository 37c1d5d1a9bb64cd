"""The dataset card of a version: its sections (``sections``), statistics (``stats``), Markdown and
HTML (``render``) and charts (``plot``)."""
