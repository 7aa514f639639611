// ---- internal/storage/v2/cassandra/tracestore/to_dbmodel.go lines 1-3, 20-25, 262-285 (commit a8f77b08e72cbd5b882b8c3125d9fee46d2d9f79) ----
// Copyright (c) 2025 The Jaeger Authors.
// Copyright The OpenTelemetry Authors
// SPDX-License-Identifier: Apache-2.0

const (
	noServiceName    = "OTLPResourceNoServiceName"
	eventNameAttr    = "event"
	statusError      = "ERROR"
	statusOk         = "OK"
func spanEventsToDbLogs(events ptrace.SpanEventSlice) []dbmodel.Log {
	if events.Len() == 0 {
		return nil
	}

	logs := make([]dbmodel.Log, 0, events.Len())
	for i := 0; i < events.Len(); i++ {
		event := events.At(i)
		fields := make([]dbmodel.KeyValue, 0, event.Attributes().Len()+1)
		_, eventAttrFound := event.Attributes().Get(eventNameAttr)
		if event.Name() != "" && !eventAttrFound {
			fields = append(fields, dbmodel.KeyValue{
				Key:         eventNameAttr,
				ValueType:   dbmodel.StringType,
				ValueString: event.Name(),
			})
		}
		fields = appendTagsFromAttributes(fields, event.Attributes())
		logs = append(logs, dbmodel.Log{
			//nolint:gosec // G115 // Timestamp is guaranteed non-negative by schema constraints
			Timestamp: int64(model.TimeAsEpochMicroseconds(event.Timestamp().AsTime())),
			Fields:    fields,
		})
	}
