"""The review step: the labels most likely wrong, from a model's out-of-sample detections
(cleanlab's scores), as a file for a labelling tool and a page to look at."""
