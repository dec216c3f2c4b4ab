"""The fingerprint-source step: the dataset's files listed and hashed, the data step's cache key."""
