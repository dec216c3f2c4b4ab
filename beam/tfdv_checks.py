"""TFDV statistics, schema and anomalies for the converted dataset.

Statistics are computed inside the Beam job (`stats_transform`); schema inference,
validation and the HTML view run afterwards on the (small) statistics protos.
"""

from __future__ import annotations

import logging

import apache_beam as beam
import tensorflow_data_validation as tfdv
from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2, statistics_pb2
from tfx_bsl.coders import example_coder

from beam import feature_keys as K

logger = logging.getLogger(__name__)


class _DecodeExamples(beam.DoFn):
    def setup(self):
        self._decoder = example_coder.ExamplesToRecordBatchDecoder()

    def process(self, batch):
        yield self._decoder.DecodeBatch(batch)


def stats_transform(examples: beam.PCollection, label: str, output_path: str) -> beam.PCollection:
    """Serialized Examples → TFDV statistics written to `output_path` (binary proto)."""
    return (
        examples
        | f"Batch{label}" >> beam.BatchElements(min_batch_size=32, max_batch_size=256)
        | f"ToArrow{label}" >> beam.ParDo(_DecodeExamples())
        | f"Stats{label}" >> tfdv.GenerateStatistics(tfdv.StatsOptions())
        | f"WriteStats{label}" >> tfdv.WriteStatisticsToBinaryFile(output_path)
    )


def infer_schema(train_stats: statistics_pb2.DatasetFeatureStatisticsList, num_labels: int) -> schema_pb2.Schema:
    """TFDV's inferred schema plus the constraints the detection task needs."""
    schema = tfdv.infer_schema(train_stats, infer_feature_shape=False)
    encoded = tfdv.get_feature(schema, K.ENCODED)
    encoded.presence.min_fraction = 1.0
    encoded.presence.min_count = 1
    for key in K.BOX_KEYS:
        feature = tfdv.get_feature(schema, key)
        feature.float_domain.min = 0.0
        feature.float_domain.max = 1.0
    label = tfdv.get_feature(schema, K.CLASS_LABEL)
    label.int_domain.min = 1
    label.int_domain.max = num_labels
    # Categorical domains learnt from a sample would flag legitimate new file names.
    for key in (K.FILENAME, K.SOURCE_ID, K.KEY_SHA256, K.ENCODED):
        feature = tfdv.get_feature(schema, key)
        feature.ClearField("domain")
    return schema


def find_anomalies(
    stats: statistics_pb2.DatasetFeatureStatisticsList, schema: schema_pb2.Schema
) -> anomalies_pb2.Anomalies:
    return tfdv.validate_statistics(stats, schema)


def anomaly_lines(anomalies: anomalies_pb2.Anomalies) -> list[str]:
    """One readable line per anomalous feature."""
    lines = []
    for feature, info in sorted(anomalies.anomaly_info.items()):
        lines.append(f"{feature}: {info.short_description} — {info.description}")
    if anomalies.HasField("dataset_anomaly_info"):
        info = anomalies.dataset_anomaly_info
        lines.append(f"(dataset): {info.short_description} — {info.description}")
    return lines


def statistics_html(train: statistics_pb2.DatasetFeatureStatisticsList,
                    val: statistics_pb2.DatasetFeatureStatisticsList) -> str:
    """TFDV's own Facets rendering, train beside val."""
    return tfdv.get_statistics_html(lhs_statistics=train, rhs_statistics=val,
                                    lhs_name="train", rhs_name="val")
