"""The tune step: a hyperparameter search whose trials are short versions of the training they
tune, scored on a part of the train split held out for it (never on val)."""
