"""TFDV statistics, schema and anomalies for the converted dataset.

Statistics are computed over the features each shard's writer kept (beam/feature_batches.py,
`feature_statistics`) in the driver once the job has run; schema inference, validation and
the HTML view run afterwards on the (small) statistics protos.
"""

from __future__ import annotations

import logging
from typing import Iterable

import pyarrow as pa
import tensorflow_data_validation as tfdv
from tensorflow_data_validation.statistics import stats_impl
from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2, statistics_pb2

from beam.contract import feature_keys as K

logger = logging.getLogger(__name__)

OBJECT_KEYS = (*K.BOX_KEYS, K.CLASS_TEXT, K.CLASS_LABEL, K.DIFFICULT, K.BOX_WIDTH, K.BOX_HEIGHT)


# Features unique to each image. As plain strings TFDV's default exact top-k combiner
# keeps every distinct value, so memory grows with the number of images; marked as
# non-categorical strings (which the sketch-based top-k generator honours), TFDV computes
# presence and lengths only.
_UNIQUE_PER_IMAGE = (K.FILENAME, K.SOURCE_ID, K.KEY_SHA256)


def statistics_schema() -> schema_pb2.Schema:
    schema = schema_pb2.Schema()
    for key in _UNIQUE_PER_IMAGE:
        feature = schema.feature.add(name=key, type=schema_pb2.BYTES)
        feature.string_domain.is_categorical = schema_pb2.StringDomain.CATEGORICAL_NO
    return schema


def statistics_options() -> tfdv.StatsOptions:
    return tfdv.StatsOptions(schema=statistics_schema(), experimental_use_sketch_based_topk_uniques=True)


def feature_statistics(batches: Iterable[pa.RecordBatch]) -> statistics_pb2.DatasetFeatureStatisticsList:
    """TFDV statistics of Arrow batches of features (`features_batch`), one batch in memory
    at a time. TFDV's own generators and accumulators (what its `GenerateStatistics` runs
    inside Beam's combiner), fed batch by batch in this process: a Beam pipeline around them
    cost ~2 s of building and running on 20,000 records, the statistics ~0.2 s."""
    generators = stats_impl.get_generators(statistics_options(), in_memory=True)
    accumulators = [generator.create_accumulator() for generator in generators]
    for batch in batches:
        accumulators = [generator.add_input(accumulator, batch)
                        for generator, accumulator in zip(generators, accumulators)]
    return stats_impl.extract_statistics_output(accumulators, generators)


def task_schema(train_stats: statistics_pb2.DatasetFeatureStatisticsList, num_labels: int,
                pinned: schema_pb2.Schema | None = None) -> schema_pb2.Schema:
    """The pinned schema, or TFDV's inferred one, plus the constraints the task needs:
    boxes in [0, 1], labels within the label map."""
    schema = schema_pb2.Schema()
    schema.CopyFrom(pinned if pinned is not None else tfdv.infer_schema(train_stats, infer_feature_shape=False))
    # The statistics leave out the image bytes (every written record has them, by
    # construction); a schema pinned from an earlier build that lists them would call
    # the feature missing.
    for feature in [f for f in schema.feature if f.name == K.ENCODED]:
        schema.feature.remove(feature)
    for key in K.BOX_KEYS:
        feature = tfdv.get_feature(schema, key)
        feature.float_domain.min = 0.0
        feature.float_domain.max = 1.0
    label = tfdv.get_feature(schema, K.CLASS_LABEL)
    label.int_domain.min = 1
    label.int_domain.max = num_labels
    if pinned is None:
        # Learnt from one sample, these would flag legitimate data: new file names and
        # hashes, PNGs after a JPEG-only split, and images with no boxes (negatives).
        for key in (K.FILENAME, K.SOURCE_ID, K.KEY_SHA256, K.FORMAT):
            tfdv.get_feature(schema, key).ClearField("domain")
        for key in OBJECT_KEYS:
            if any(f.name == key for f in schema.feature):
                tfdv.get_feature(schema, key).ClearField("value_count")
    return schema


def class_domain(schema: schema_pb2.Schema) -> schema_pb2.StringDomain | None:
    """The class names a schema lists (inline or as a named domain), if it lists them."""
    if not any(f.name == K.CLASS_TEXT for f in schema.feature):
        return None
    try:
        domain = tfdv.get_domain(schema, K.CLASS_TEXT)
    except ValueError:  # no domain: any class name passes
        return None
    return domain if isinstance(domain, schema_pb2.StringDomain) else None


def add_drift_checks(schema: schema_pb2.Schema, threshold: float, classes: bool = True) -> None:
    """Compare with previous statistics: the class distribution (L-infinity distance;
    unless `classes` is False) and box sizes (Jensen-Shannon divergence), each against
    `threshold`."""
    if classes:
        tfdv.get_feature(schema, K.CLASS_TEXT).drift_comparator.infinity_norm.threshold = threshold
    for key in (K.BOX_WIDTH, K.BOX_HEIGHT):
        if any(f.name == key for f in schema.feature):
            tfdv.get_feature(schema, key).drift_comparator.jensen_shannon_divergence.threshold = threshold


def find_anomalies(
    stats: statistics_pb2.DatasetFeatureStatisticsList, schema: schema_pb2.Schema,
    previous: statistics_pb2.DatasetFeatureStatisticsList | None = None,
) -> anomalies_pb2.Anomalies:
    return tfdv.validate_statistics(stats, schema, previous_statistics=previous)


def anomaly_lines(anomalies: anomalies_pb2.Anomalies) -> list[str]:
    """One readable line per anomalous feature."""
    lines = []
    for feature, info in sorted(anomalies.anomaly_info.items()):
        lines.append(f"{feature} | {info.short_description} | {info.description}")
    if anomalies.HasField("dataset_anomaly_info"):
        info = anomalies.dataset_anomaly_info
        lines.append(f"(dataset) | {info.short_description} | {info.description}")
    return lines


def statistics_html(train: statistics_pb2.DatasetFeatureStatisticsList,
                    val: statistics_pb2.DatasetFeatureStatisticsList) -> str:
    """TFDV's own Facets rendering, train beside val."""
    return tfdv.get_statistics_html(lhs_statistics=train, rhs_statistics=val,
                                    lhs_name="train", rhs_name="val")
