"""The HTML run report: one self-contained page per run, and the data step's page."""
