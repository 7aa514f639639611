// ---- src/metric_model_reporter.h lines 1-26 (commit d261b8dd2d43de4985ec5f95b9578947df4bd367) ----
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
#pragma once
// ---- src/metric_model_reporter.h lines 55-86 (commit d261b8dd2d43de4985ec5f95b9578947df4bd367) ----

  // Create and use Counters for per-model latency related metrics
  bool latency_counters_enabled_ = true;
  // Create and use Histograms for per-model latency related metrics
  bool latency_histograms_enabled_ = false;
  // Create and use Summaries for per-model latency related metrics
  bool latency_summaries_enabled_ = false;
  // Default bucket boundaries used for each histogram metric. Each value
  // represents a boundary. For example, {100, 500, 2000, 5000} are latencies.
  // in milliseconds in first_response_histogram.
  std::unordered_map<std::string, prometheus::Histogram::BucketBoundaries>
      histogram_options_ = {{kFirstResponseHistogram, {100, 500, 2000, 5000}}};

  // Quantiles used for any summary metrics. Each pair of values represents
  // { quantile, error }. For example, {0.90, 0.01} means to compute the
  // 90th percentile with 1% error on either side, so the approximate 90th
  // percentile value will be between the 89th and 91st percentiles.
  prometheus::Summary::Quantiles quantiles_ = {
      {0.5, 0.05}, {0.9, 0.01}, {0.95, 0.001}, {0.99, 0.001}, {0.999, 0.001}};

  // Whether this reporter's model has caching enabled or not.
  // This helps handle infer_stats aggregation for summaries on cache misses.
  bool cache_enabled_ = false;

 private:
  // Maps the metric family fullname to its lookup key. This field is required
  // because the users are expected to configure metric configuration
  // "ModelMetrics" with the full name displayed from metrics reporting while a
  // different name is used internally. All new histograms must update the map.
  const std::unordered_map<std::string, std::string> metric_map_ = {
      {"nv_inference_first_response_histogram_ms", kFirstResponseHistogram}};
#endif  // TRITON_ENABLE_METRICS
