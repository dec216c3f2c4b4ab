"""detpipe evaluate step."""
