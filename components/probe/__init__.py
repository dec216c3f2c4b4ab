"""detpipe probe step."""
