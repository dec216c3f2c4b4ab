"""The detector core: what a trained detector needs to exist without training (model
config and building, the fitted shape, shard reading and image preprocessing, batched
detection, the training output's files). Every step imports it; it imports no step."""
