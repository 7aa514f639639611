// ---- src/tracer.cc lines 1-26 (commit 25baa7b33e68ba5a1220433c70d447777ef91288) ----
// Copyright 2019-2025, NVIDIA CORPORATION & AFFILIATES. All rights reserved.
//
// Redistribution and use in source and binary forms, with or without
// modification, are permitted provided that the following conditions
// are met:
//  * Redistributions of source code must retain the above copyright
//    notice, this list of conditions and the following disclaimer.
//  * Redistributions in binary form must reproduce the above copyright
//    notice, this list of conditions and the following disclaimer in the
//    documentation and/or other materials provided with the distribution.
//  * Neither the name of NVIDIA CORPORATION nor the names of its
//    contributors may be used to endorse or promote products derived
//    from this software without specific prior written permission.
//
// THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS ``AS IS'' AND ANY
// EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
// IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR
// PURPOSE ARE DISCLAIMED.  IN NO EVENT SHALL THE COPYRIGHT OWNER OR
// CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL,
// EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO,
// PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR
// PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY
// OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT
// (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
// OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.

// ---- src/tracer.cc lines 322-420 (commit 25baa7b33e68ba5a1220433c70d447777ef91288) ----

std::shared_ptr<TraceManager::Trace>
TraceManager::SampleTrace(const TraceStartOptions& start_options)
{
  std::shared_ptr<Trace> ts =
      start_options.trace_setting->SampleTrace(start_options.force_sample);
  if (ts != nullptr) {
    ts->setting_ = start_options.trace_setting;
    if (ts->setting_->mode_ == TRACE_MODE_OPENTELEMETRY) {
#ifndef _WIN32
      auto steady_timestamp_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(
              std::chrono::steady_clock::now().time_since_epoch())
              .count();
      if (ts->span_stacks_.find(ts->trace_id_) == ts->span_stacks_.end()) {
        std::unique_ptr<
            std::stack<opentelemetry::nostd::shared_ptr<otel_trace_api::Span>>>
            st(new std::stack<
                opentelemetry::nostd::shared_ptr<otel_trace_api::Span>>());
        ts->span_stacks_.emplace(ts->trace_id_, std::move(st));
      }
      auto active_span =
          otel_trace_api::GetSpan(start_options.propagated_context);
      if (active_span->GetContext().IsValid()) {
        ts->span_stacks_[ts->trace_id_]->emplace(active_span);
      }
      // Storing "InferRequest" span as a root span
      // to keep it alive for the duration of the request.
      ts->root_span_ =
          ts->StartSpan("InferRequest", steady_timestamp_ns, ts->trace_id_);
      ts->span_stacks_[ts->trace_id_]->emplace(ts->root_span_);
#else
      LOG_ERROR << "Unsupported trace mode: "
                << TraceManager::InferenceTraceModeString(ts->setting_->mode_);
#endif
    }
  }
  return ts;
}

TraceManager::Trace::~Trace()
{
  if (setting_->mode_ == TRACE_MODE_TRITON) {
    // Write trace now
    setting_->WriteTrace(streams_);
  } else if (setting_->mode_ == TRACE_MODE_OPENTELEMETRY) {
#ifndef _WIN32
    EndSpan(trace_id_);
#else
    LOG_ERROR << "Unsupported trace mode: "
              << TraceManager::InferenceTraceModeString(setting_->mode_);
#endif
  }
}

void
TraceManager::Trace::CaptureTimestamp(
    const std::string& name, uint64_t timestamp_ns)
{
  if (setting_->level_ & TRITONSERVER_TRACE_LEVEL_TIMESTAMPS) {
    if (setting_->mode_ == TRACE_MODE_TRITON) {
      std::lock_guard<std::mutex> lk(mtx_);
      std::stringstream* ss = nullptr;
      {
        if (streams_.find(trace_id_) == streams_.end()) {
          std::unique_ptr<std::stringstream> stream(new std::stringstream());
          ss = stream.get();
          streams_.emplace(trace_id_, std::move(stream));
        } else {
          ss = streams_[trace_id_].get();
          // If the string stream is not newly created, add "," as there is
          // already content in the string stream
          *ss << ",";
        }
      }
      *ss << "{\"id\":" << trace_id_ << ",\"timestamps\":["
          << "{\"name\":\"" << name << "\",\"ns\":" << timestamp_ns << "}]}";
    } else if (setting_->mode_ == TRACE_MODE_OPENTELEMETRY) {
#ifndef _WIN32
      root_span_->AddEvent(
          name, time_offset_ + std::chrono::nanoseconds{timestamp_ns});
#else
      LOG_ERROR << "Unsupported trace mode: "
                << TraceManager::InferenceTraceModeString(setting_->mode_);
#endif
    }
  }
}

std::string
TraceManager::Trace::RetrieveActivityName(
    TRITONSERVER_InferenceTrace* trace,
    TRITONSERVER_InferenceTraceActivity activity, uint64_t timestamp_ns)
{
  std::string activity_name =
      TRITONSERVER_InferenceTraceActivityString(activity);

  if (activity == TRITONSERVER_TRACE_CUSTOM_ACTIVITY) {
    const char* val = nullptr;
// ---- src/tracer.cc lines 497-720 (commit 25baa7b33e68ba5a1220433c70d447777ef91288) ----
#ifndef _WIN32
void
TraceManager::ProcessOpenTelemetryParameters(
    const triton::server::TraceConfigMap& config_map,
    otlp::OtlpHttpExporterOptions& exporter_options,
    otel_resource::ResourceAttributes& attributes,
    otel_trace_sdk::BatchSpanProcessorOptions& processor_options)
{
  attributes[otel_resource::SemanticConventions::kServiceName] =
      std::string("triton-inference-server");
  auto mode_key = std::to_string(TRACE_MODE_OPENTELEMETRY);
  auto otel_options_it = config_map.find(mode_key);
  if (otel_options_it == config_map.end()) {
    return;
  }
  for (const auto& [setting, value] : otel_options_it->second) {
    // FIXME add more configuration options of OTLP HTTP Exporter
    if (setting == "url") {
      exporter_options.url = std::get<std::string>(value);
    }
    if (setting == "resource") {
      auto user_setting = std::get<std::string>(value);
      auto pos = user_setting.find('=');
      auto key = user_setting.substr(0, pos);
      auto value = user_setting.substr(pos + 1);
      attributes[key] = value;
    }
    if (setting == "bsp_max_queue_size") {
      processor_options.max_queue_size = std::get<uint32_t>(value);
    }
    if (setting == "bsp_schedule_delay") {
      processor_options.schedule_delay_millis =
          std::chrono::milliseconds(std::get<uint32_t>(value));
    }
    if (setting == "bsp_max_export_batch_size") {
      processor_options.max_export_batch_size = std::get<uint32_t>(value);
    }
  }
}

void
TraceManager::Trace::StartSpan(
    TRITONSERVER_InferenceTrace* trace,
    TRITONSERVER_InferenceTraceActivity activity, uint64_t timestamp_ns,
    uint64_t trace_id, std::string display_name)
{
  uint64_t parent_id;
  LOG_TRITONSERVER_ERROR(
      TRITONSERVER_InferenceTraceParentId(trace, &parent_id),
      "getting trace parent id");
  auto span_parent_id = parent_id;

  // Currently, only 2 types of sub-spans are supported:
  // request span and compute span. Compute span is a leaf span
  // and can not be a parent of any sub-span. If parent_id==0,
  // then current model is either a standalone model, or an ensemble model.
  // In both cases, the parent of the new request sub-span is the kRootSpan.
  // A request span with trace id = `trace_id` is a parent of a compute span,
  // started in the same trace.
  // If parent_id > 0, then this is a child trace, spawned from
  // the ensamble's main request. For this instance, the parent
  // span is the ensembles's request span.
  if ((parent_id == 0 && activity == TRITONSERVER_TRACE_REQUEST_START) ||
      (activity == TRITONSERVER_TRACE_COMPUTE_START) ||
      (activity == TRITONSERVER_TRACE_CUSTOM_ACTIVITY)) {
    span_parent_id = trace_id;
  }
  auto span = StartSpan(display_name, timestamp_ns, span_parent_id);

  if (activity == TRITONSERVER_TRACE_REQUEST_START) {
    int64_t model_version;
    const char* request_id;
    LOG_TRITONSERVER_ERROR(
        TRITONSERVER_InferenceTraceModelVersion(trace, &model_version),
        "getting model version");
    LOG_TRITONSERVER_ERROR(
        TRITONSERVER_InferenceTraceRequestId(trace, &request_id),
        "getting request id");
    span->SetAttribute("triton.model_name", display_name);
    span->SetAttribute("triton.model_version", model_version);
    span->SetAttribute("triton.trace_id", trace_id);
    span->SetAttribute("triton.trace_parent_id", parent_id);
    if (std::string(request_id) != "") {
      span->SetAttribute("triton.request_id", request_id);
    }
    triton::common::TritonJson::WriteBuffer buffer;
    PrepareTraceContext(span, &buffer);
    TRITONSERVER_InferenceTraceSetContext(trace, buffer.Contents().c_str());
  }
  span_stacks_[trace_id]->emplace(span);
}

opentelemetry::nostd::shared_ptr<otel_trace_api::Span>
TraceManager::Trace::StartSpan(
    std::string display_name, const uint64_t& raw_timestamp_ns,
    uint64_t trace_id)
{
  otel_trace_api::StartSpanOptions options;
  options.kind = otel_trace_api::SpanKind::kServer;
  options.start_system_time =
      time_offset_ + std::chrono::nanoseconds{raw_timestamp_ns};
  options.start_steady_time =
      otel_common::SteadyTimestamp{std::chrono::nanoseconds{raw_timestamp_ns}};

  // If the new span is a child span, we need to retrieve its parent and
  // provide it through StartSpanOptions to the child span
  if (span_stacks_.find(trace_id) != span_stacks_.end() &&
      !span_stacks_[trace_id]->empty()) {
    options.parent = span_stacks_[trace_id]->top()->GetContext();
  }
  auto provider = opentelemetry::trace::Provider::GetTracerProvider();
  return provider->GetTracer(kTritonTracer)->StartSpan(display_name, options);
}

void
TraceManager::Trace::EndSpan(uint64_t trace_id)
{
  auto timestamp_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  EndSpan(timestamp_ns, trace_id);
}


void
TraceManager::Trace::EndSpan(
    const uint64_t& raw_timestamp_ns, uint64_t trace_id)
{
  if (span_stacks_.find(trace_id) != span_stacks_.end() &&
      !span_stacks_[trace_id]->empty()) {
    otel_trace_api::EndSpanOptions end_options;
    end_options.end_steady_time = otel_common::SteadyTimestamp{
        std::chrono::nanoseconds{raw_timestamp_ns}};
    span_stacks_[trace_id]->top()->End(end_options);
    span_stacks_[trace_id]->pop();
  }
}

void
TraceManager::Trace::ReportToOpenTelemetry(
    TRITONSERVER_InferenceTrace* trace,
    TRITONSERVER_InferenceTraceActivity activity, uint64_t timestamp_ns)
{
  uint64_t id;
  LOG_TRITONSERVER_ERROR(
      TRITONSERVER_InferenceTraceId(trace, &id), "getting trace id");
  if (span_stacks_.find(id) == span_stacks_.end()) {
    std::unique_ptr<
        std::stack<opentelemetry::nostd::shared_ptr<otel_trace_api::Span>>>
        st(new std::stack<
            opentelemetry::nostd::shared_ptr<otel_trace_api::Span>>());
    span_stacks_.emplace(id, std::move(st));
  }

  AddEvent(trace, activity, timestamp_ns, id);
}

void
TraceManager::Trace::AddEvent(
    TRITONSERVER_InferenceTrace* trace,
    TRITONSERVER_InferenceTraceActivity activity, uint64_t timestamp_ns,
    uint64_t trace_id)
{
  std::string activity_name =
      RetrieveActivityName(trace, activity, timestamp_ns);
  static std::string start = "_START";
  static std::string end = "_END";
  if (activity == TRITONSERVER_TRACE_REQUEST_START ||
      activity == TRITONSERVER_TRACE_COMPUTE_START ||
      (activity == TRITONSERVER_TRACE_CUSTOM_ACTIVITY &&
       activity_name.length() > start.length() &&
       std::equal(start.rbegin(), start.rend(), activity_name.rbegin()))) {
    std::string span_name = activity_name;

    if (activity == TRITONSERVER_TRACE_CUSTOM_ACTIVITY) {
      span_name =
          activity_name.substr(0, activity_name.length() - start.length());
    } else if (activity == TRITONSERVER_TRACE_REQUEST_START) {
      const char* model_name;
      LOG_TRITONSERVER_ERROR(
          TRITONSERVER_InferenceTraceModelName(trace, &model_name),
          "getting model name");
      span_name = model_name;
    } else if (activity == TRITONSERVER_TRACE_COMPUTE_START) {
      span_name = "compute";
    }

    StartSpan(trace, activity, timestamp_ns, trace_id, span_name);
  }

  AddEvent(activity_name, timestamp_ns, trace_id);

  if (activity == TRITONSERVER_TRACE_REQUEST_END ||
      activity == TRITONSERVER_TRACE_COMPUTE_END ||
      (activity == TRITONSERVER_TRACE_CUSTOM_ACTIVITY &&
       activity_name.length() > end.length() &&
       std::equal(end.rbegin(), end.rend(), activity_name.rbegin()))) {
    EndSpan(timestamp_ns, trace_id);
  }
}

void
TraceManager::Trace::AddEvent(
    const std::string& event, uint64_t timestamp, uint64_t trace_id)
{
  if (span_stacks_.find(trace_id) != span_stacks_.end() &&
      !span_stacks_[trace_id]->empty()) {
    span_stacks_[trace_id]->top()->AddEvent(
        event, time_offset_ + std::chrono::nanoseconds{timestamp});
  }
}

void
TraceManager::Trace::PrepareTraceContext(
    opentelemetry::nostd::shared_ptr<otel_trace_api::Span> span,
    triton::common::TritonJson::WriteBuffer* buffer)
{
  triton::common::TritonJson::Value json(
      triton::common::TritonJson::ValueType::OBJECT);
  char trace_id[32] = {0};
  char span_id[16] = {0};
  char trace_flags[2] = {0};
  span->GetContext().span_id().ToLowerBase16(span_id);
  span->GetContext().trace_id().ToLowerBase16(trace_id);
// ---- src/tracer.cc lines 777-862 (commit 25baa7b33e68ba5a1220433c70d447777ef91288) ----
}

void
TraceManager::TraceActivity(
    TRITONSERVER_InferenceTrace* trace,
    TRITONSERVER_InferenceTraceActivity activity, uint64_t timestamp_ns,
    void* userp)
{
  uint64_t id;
  LOG_TRITONSERVER_ERROR(
      TRITONSERVER_InferenceTraceId(trace, &id), "getting trace id");

  // The function may be called with different traces but the same 'userp',
  // group the activity of the same trace together for more readable output.
  auto ts =
      reinterpret_cast<std::shared_ptr<TraceManager::Trace>*>(userp)->get();

  std::lock_guard<std::mutex> lk(ts->mtx_);
  if (ts->spawned_traces_tracker_.find(id) ==
      ts->spawned_traces_tracker_.end()) {
    ts->spawned_traces_tracker_.emplace(id);
  }

  if (ts->setting_->mode_ == TRACE_MODE_OPENTELEMETRY) {
#ifndef _WIN32
    ts->ReportToOpenTelemetry(trace, activity, timestamp_ns);
#else
    LOG_ERROR << "Unsupported trace mode: "
              << TraceManager::InferenceTraceModeString(ts->setting_->mode_);
#endif
    return;
  }
  std::stringstream* ss = nullptr;
  {
    if (ts->streams_.find(id) == ts->streams_.end()) {
      std::unique_ptr<std::stringstream> stream(new std::stringstream());
      ss = stream.get();
      ts->streams_.emplace(id, std::move(stream));
    } else {
      ss = ts->streams_[id].get();
      // If the string stream is not newly created, add "," as there is
      // already content in the string stream
      *ss << ",";
    }
  }
  // If 'activity' is TRITONSERVER_TRACE_REQUEST_START then collect
  // and serialize trace details.
  if (activity == TRITONSERVER_TRACE_REQUEST_START) {
    const char* model_name;
    int64_t model_version;
    uint64_t parent_id;
    const char* request_id;

    LOG_TRITONSERVER_ERROR(
        TRITONSERVER_InferenceTraceModelName(trace, &model_name),
        "getting model name");
    LOG_TRITONSERVER_ERROR(
        TRITONSERVER_InferenceTraceModelVersion(trace, &model_version),
        "getting model version");
    LOG_TRITONSERVER_ERROR(
        TRITONSERVER_InferenceTraceParentId(trace, &parent_id),
        "getting trace parent id");
    LOG_TRITONSERVER_ERROR(
        TRITONSERVER_InferenceTraceRequestId(trace, &request_id),
        "getting request id");

    *ss << "{\"id\":" << id << ",\"model_name\":\"" << model_name
        << "\",\"model_version\":" << model_version;

    if (std::string(request_id) != "") {
      *ss << ",\"request_id\":\"" << request_id << "\"";
    }

    if (parent_id != 0) {
      *ss << ",\"parent_id\":" << parent_id;
    }
    *ss << "},";
  }

  *ss << "{\"id\":" << id << ",\"timestamps\":["
      << "{\"name\":\""
      << ts->RetrieveActivityName(trace, activity, timestamp_ns)
      << "\",\"ns\":" << timestamp_ns << "}]}";
}

void
// ---- src/tracer.cc lines 1092-1135 (commit 25baa7b33e68ba5a1220433c70d447777ef91288) ----
}

TraceManager::TraceFile::~TraceFile()
{
  if (!first_write_) {
    trace_file_ << "]";
  }
}

void
TraceManager::TraceFile::SaveTraces(
    std::stringstream& trace_stream, const bool to_index_file)
{
  try {
    if (to_index_file) {
      std::string file_name =
          file_name_ + "." + std::to_string(index_.fetch_add(1));
      std::ofstream file_stream;
      file_stream.open(file_name);
      file_stream << "[";
      file_stream << trace_stream.rdbuf();
      file_stream << "]";
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      if (first_write_) {
        trace_file_.open(file_name_);
        trace_file_ << "[";
        first_write_ = false;
      } else {
        trace_file_ << ",";
      }
      trace_file_ << trace_stream.rdbuf();
    }
  }
  catch (const std::ofstream::failure& e) {
    LOG_ERROR << "failed creating trace file: " << e.what();
  }
  catch (...) {
    LOG_ERROR << "failed creating trace file: reason unknown";
  }
}

std::shared_ptr<TraceManager::Trace>
TraceManager::TraceSetting::SampleTrace(bool force_sample)
