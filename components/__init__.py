"""detpipe."""
