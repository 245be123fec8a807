"""OTLP/HTTP traces: ExportTraceServiceRequest in protobuf or JSON, read into plain spans."""
