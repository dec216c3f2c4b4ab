"""The operators a converted file needs, counted from the file itself: what a runtime must
support to run it (a phone's interpreter without the Flex delegate, an Edge TPU compiler's list,
a TensorRT parser). Read with the schema readers TensorFlow Lite and ONNX ship, every subgraph
included (a loop's body, a WHILE's branches)."""

from __future__ import annotations

from collections import Counter

from components.export.file_formats import FORMATS


def tflite_ops(path: str) -> dict[str, int]:
    from tensorflow.lite.python import schema_py_generated as schema

    with open(path, "rb") as handle:
        model = schema.Model.GetRootAsModel(handle.read(), 0)
    names = {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    # The schema keeps small codes in a deprecated field and larger ones in a new one: the larger is the code.
    codes = [max(model.OperatorCodes(i).BuiltinCode(), model.OperatorCodes(i).DeprecatedBuiltinCode())
             for i in range(model.OperatorCodesLength())]
    counts: Counter = Counter()
    for index in range(model.SubgraphsLength()):
        graph = model.Subgraphs(index)
        for op in range(graph.OperatorsLength()):
            counts[names.get(codes[graph.Operators(op).OpcodeIndex()], "CUSTOM")] += 1
    return dict(sorted(counts.items()))


def onnx_ops(path: str) -> dict[str, int]:
    import onnx

    counts: Counter = Counter()

    def walk(graph) -> None:
        for node in graph.node:
            counts[node.op_type] += 1
            for attribute in node.attribute:
                for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    walk(sub)

    walk(onnx.load(path).graph)
    return dict(sorted(counts.items()))


def file_ops(path: str) -> dict[str, int]:
    """Operator name → how many times the file uses it."""
    return onnx_ops(path) if path.endswith(FORMATS["onnx"].suffix) else tflite_ops(path)
