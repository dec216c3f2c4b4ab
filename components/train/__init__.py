"""detpipe train step."""
