"""The shard contract: what the data job writes and every step reads.

The tf.Example feature keys (`feature_keys`), the files beside the shards and their counts
(`manifest`, `files`), the label map (`label_map`), the rejects rows (`rejects`) and which
images go into a shard and how they are read (`images`, `exif`). The data job (beam/), the
trainer, the evaluator, the server and the pipeline all import these modules, and nothing
else of the Beam job's; they import nothing of the job, of components/ or of pipeline/
(tests/test_import_cycles.py).
"""
