"""Every telemetry name stagescope emits or reads, in one place.

Metric names (with their unit suffix, ``_total`` on counters), label keys, span names and attribute
keys, the stage and lever vocabularies and the histogram bucket sets live here. Instrumentation,
dashboards, alerts, analysis and the external adapters import them; a test fails if a metric name is
spelled out anywhere else.

Units: every duration we emit is in **seconds** (Prometheus and OpenTelemetry convention) unless a
name says otherwise; analysis output is in milliseconds and says so in its keys (``*_ms``).
"""

from __future__ import annotations

from typing import Final

# --------------------------------------------------------------------------------------------------
# Stages: where a request's time goes. Each request's stage intervals are measured on one monotonic
# clock (see stagescope.instrumentation.record) and published as child spans and histograms.
# --------------------------------------------------------------------------------------------------
STAGE_NETWORK: Final = "network"  # client-observed time not spent in the server (client minus server)
STAGE_FEATURE_FETCH: Final = "feature_fetch"  # reading features from a feature store / cache
STAGE_PREPROCESS: Final = "preprocess"  # CPU work turning the request into model input
STAGE_BATCH_WAIT: Final = "batch_wait"  # enqueued -> batch closed (waiting for a dynamic batch to fill)
STAGE_QUEUE: Final = "queue"  # batch closed -> executor free (waiting for a free executor / GPU)
STAGE_COMPUTE: Final = "compute"  # model forward on the accelerator (GPU execution)
STAGE_PREFILL: Final = "prefill"  # LLM: prompt processing up to the first token
STAGE_DECODE: Final = "decode"  # LLM: first token -> last token
STAGE_POSTPROCESS: Final = "postprocess"  # CPU work turning model output into the answer
STAGE_EGRESS: Final = "egress"  # serialization and response write
STAGE_COLD_START: Final = "cold_start"  # time a request waited for a model load
# Stages of an LLM engine's request that its own spans measure (vLLM, SGLang; see
# analysis/ingest/engines.py for the upstream files each one follows).
STAGE_FRONT_END: Final = "front_end"  # engine's front end: API server, tokenization, hand-off (IPC)
STAGE_GATEWAY: Final = "gateway"  # a gateway / router in front of the engine, outside the engine's span
# Stages other servers measure that stagescope's own instrumentation has no exact match for (Triton's
# trace timestamps, see analysis/ingest/triton.py); a team may record them too.
STAGE_RECEIVE: Final = "receive"  # the server reading the request off the network (Triton HTTP_RECV_*)
STAGE_DESERIALIZE: Final = "deserialize"  # the server's frontend parsing the request into tensors
STAGE_COMPUTE_INPUT: Final = "compute_input"  # input tensors copied / prepared for the model (to the GPU)
STAGE_COMPUTE_OUTPUT: Final = (
    "compute_output"  # output tensors copied / prepared after the model (from the GPU)
)
# s4-events: time a request was held for capacity that did not exist yet, while the service's new pods
# were Pending (scheduling, image pull, start, model load): a gateway or activator in front of the
# service (e.g. Knative's activator buffering requests during a scale-from-zero) marks it with a stage
# span named pod_pending, or any stage span carrying stagescope.stage.kind = pod_pending.
STAGE_POD_PENDING: Final = "pod_pending"

STAGES: Final[tuple[str, ...]] = (
    STAGE_NETWORK,
    STAGE_FEATURE_FETCH,
    STAGE_PREPROCESS,
    STAGE_BATCH_WAIT,
    STAGE_QUEUE,
    STAGE_COMPUTE,
    STAGE_PREFILL,
    STAGE_DECODE,
    STAGE_POSTPROCESS,
    STAGE_EGRESS,
    STAGE_COLD_START,
    STAGE_RECEIVE,
    STAGE_DESERIALIZE,
    STAGE_COMPUTE_INPUT,
    STAGE_COMPUTE_OUTPUT,
    STAGE_FRONT_END,
    STAGE_GATEWAY,
    STAGE_POD_PENDING,
)
#: Stages that are waiting rather than working: tail latency mostly lives here.
WAITING_STAGES: Final[frozenset[str]] = frozenset(
    {STAGE_BATCH_WAIT, STAGE_QUEUE, STAGE_COLD_START, STAGE_POD_PENDING}
)
#: Time in no stage, reported by the analysis (never emitted by instrumentation).
UNATTRIBUTED: Final = "unattributed"

STAGE_DESCRIPTIONS: Final[dict[str, str]] = {
    STAGE_NETWORK: "client-observed latency minus server duration (network and proxies)",
    STAGE_FEATURE_FETCH: "feature store / cache reads",
    STAGE_PREPROCESS: "CPU preprocessing (tokenize, decode, resize, validate)",
    STAGE_BATCH_WAIT: "waiting for a dynamic batch to fill (enqueue to batch close)",
    STAGE_QUEUE: "waiting for a free executor / accelerator (batch close to execution start)",
    STAGE_COMPUTE: "model forward on the accelerator (GPU execution)",
    STAGE_PREFILL: "LLM prompt processing (prefill), up to the first token",
    STAGE_DECODE: "LLM token generation after the first token",
    STAGE_POSTPROCESS: "CPU postprocessing of model output",
    STAGE_EGRESS: "response serialization and write",
    STAGE_COLD_START: "waiting for a model load (cold start)",
    STAGE_FRONT_END: "an LLM engine's front end: its API server (request parsing, chat template, "
    "tokenization) and the hand-off to the engine core, before the request joins the engine's queue, "
    "and the hand-back after its last token",
    STAGE_GATEWAY: "a gateway or router in front of the engine (its own work, and the network to and "
    "from the engine): the request's outer span minus the engine's",
    STAGE_RECEIVE: "the server reading the request body off the network",
    STAGE_DESERIALIZE: "the server's frontend parsing the request into input tensors",
    STAGE_COMPUTE_INPUT: "copying / preparing input tensors for the model (host to GPU)",
    STAGE_COMPUTE_OUTPUT: "copying / preparing output tensors after the model (GPU to host)",
    STAGE_POD_PENDING: "held for capacity while the service's new pods were Pending (scheduling, image "
    "pull, start, model load)",
}

# --------------------------------------------------------------------------------------------------
# Stage kinds: what a stage's time *is*. A team's own stage ("rerank", "tokenize", "retrieve") names
# one of these, and the analysis chooses its lever rules by kind, not by name. Built-in stages imply
# theirs (STAGE_KINDS); a custom stage without a kind is KIND_UNKNOWN (no lever is guessed for it).
# --------------------------------------------------------------------------------------------------
KIND_FETCH: Final = "fetch"
KIND_CPU: Final = "cpu"
KIND_BATCH_WAIT: Final = "batch_wait"
KIND_QUEUE: Final = "queue"
KIND_COMPUTE: Final = "compute"
KIND_PREFILL: Final = "prefill"
KIND_DECODE: Final = "decode"
KIND_NETWORK: Final = "network"
KIND_INGRESS: Final = "ingress"
KIND_EGRESS: Final = "egress"
KIND_COLD_START: Final = "cold_start"
KIND_POD_PENDING: Final = "pod_pending"  # s4-events: held while new pods were Pending (see STAGE_POD_PENDING)
KIND_UNKNOWN: Final = "unknown"  # named by no one: never passed as kind=, only reported

#: The kinds a stage may be given (``stagescope.stage(name, kind=...)``), in vocabulary order.
KINDS: Final[tuple[str, ...]] = (
    KIND_FETCH,
    KIND_CPU,
    KIND_BATCH_WAIT,
    KIND_QUEUE,
    KIND_COMPUTE,
    KIND_PREFILL,
    KIND_DECODE,
    KIND_NETWORK,
    KIND_INGRESS,
    KIND_EGRESS,
    KIND_COLD_START,
    KIND_POD_PENDING,
)
KIND_DESCRIPTIONS: Final[dict[str, str]] = {
    KIND_FETCH: "reading data the request needs from another store or service (feature store, cache, "
    "vector index, retrieval): cut by caching",
    KIND_CPU: "CPU work on the request path (tokenize, decode, resize, validate, format the answer): "
    "cut by moving it to a worker pool",
    KIND_BATCH_WAIT: "waiting for a dynamic batch to fill: cut by capping the batch wait",
    KIND_QUEUE: "waiting for a free executor or accelerator: cut by scaling out (or cheaper requests)",
    KIND_COMPUTE: "model execution on the accelerator (a forward pass, a reranker, an embedding): cut by "
    "quantizing, compiling or caching results",
    KIND_PREFILL: "LLM prompt processing up to the first token: cut by chunked prefill",
    KIND_DECODE: "LLM token generation after the first token: cut by a smaller running batch or "
    "speculative decoding",
    KIND_NETWORK: "time between client and server (network, proxies): cut by smaller responses",
    KIND_INGRESS: "the server receiving and decoding the request (reading the body, parsing it into "
    "tensors, copying inputs to the device): cut by smaller requests",
    KIND_EGRESS: "serializing, copying out and writing the response: cut by smaller responses",
    KIND_COLD_START: "waiting for a model load: cut by prewarming",
    KIND_POD_PENDING: "held for capacity while new pods were Pending (scheduling, image pull, model load): "
    "cut by warm spare pods",
    KIND_UNKNOWN: "a stage whose kind nobody named: the analysis reports it and chooses no lever",
}
#: The kind each built-in stage implies.
STAGE_KINDS: Final[dict[str, str]] = {
    STAGE_NETWORK: KIND_NETWORK,
    STAGE_FEATURE_FETCH: KIND_FETCH,
    STAGE_PREPROCESS: KIND_CPU,
    STAGE_BATCH_WAIT: KIND_BATCH_WAIT,
    STAGE_QUEUE: KIND_QUEUE,
    STAGE_COMPUTE: KIND_COMPUTE,
    STAGE_PREFILL: KIND_PREFILL,
    STAGE_DECODE: KIND_DECODE,
    STAGE_POSTPROCESS: KIND_CPU,
    STAGE_EGRESS: KIND_EGRESS,
    STAGE_COLD_START: KIND_COLD_START,
    STAGE_RECEIVE: KIND_INGRESS,
    STAGE_DESERIALIZE: KIND_INGRESS,
    STAGE_COMPUTE_INPUT: KIND_INGRESS,
    STAGE_COMPUTE_OUTPUT: KIND_EGRESS,
    STAGE_FRONT_END: KIND_CPU,  # an engine's API server: parsing, chat template, tokenization, IPC
    STAGE_GATEWAY: KIND_NETWORK,  # a proxy in front of the engine, and the network to it
    STAGE_POD_PENDING: KIND_POD_PENDING,
}
#: Stage names past a process's cap of custom names are recorded under this one name (their kind is
#: kept), and counted in METRIC_STAGES_FOLDED.
STAGE_OVERFLOW: Final = "other_stage"
#: Custom stage names a process admits before folding the rest into STAGE_OVERFLOW (explicit
#: argument, then ENV_MAX_CUSTOM_STAGES, then this). Built-in stages never count against it.
DEFAULT_MAX_CUSTOM_STAGES: Final = 32
#: A stage name is a label value: 1 to 64 characters of letters, digits and ``_ . : -``, starting
#: with a letter or digit (``rerank``, ``safety-filter``, ``retrieve.v2``).
STAGE_NAME_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}"
#: Names a team cannot give a stage: the analysis' own and the overflow name.
RESERVED_STAGE_NAMES: Final[frozenset[str]] = frozenset({UNATTRIBUTED, STAGE_OVERFLOW})

# --------------------------------------------------------------------------------------------------
# Levers: no-retrain fixes the analysis can recommend.
# --------------------------------------------------------------------------------------------------
LEVER_CACHE_FEATURES: Final = "cache-features"
LEVER_CACHE_RESULTS: Final = "cache-results"
LEVER_OFFLOAD_PREPROCESSING: Final = "offload-preprocessing"
LEVER_CAP_BATCH_WAIT: Final = "cap-batch-wait"
LEVER_REDUCE_BATCH_TOKENS: Final = "reduce-batch-tokens"
LEVER_SCALE_OUT: Final = "scale-out"
LEVER_PREWARM: Final = "prewarm"
LEVER_QUANTIZE: Final = "quantize"
LEVER_COMPILE_RUNTIME: Final = "compile-runtime"
LEVER_SHRINK_RESPONSE: Final = "shrink-response"
LEVER_CHUNKED_PREFILL: Final = "chunked-prefill"
LEVER_SPECULATIVE_DECODING: Final = "speculative-decoding"
#: More API-server (front-end) processes in front of one engine: vLLM ``--api-server-count N`` (vllm
#: serve), SGLang ``--tokenizer-worker-num N``: tokenization and request handling in parallel.
LEVER_MORE_API_SERVERS: Final = "more-api-servers"
#: Cap what a request may generate (``max_tokens`` / ``max_completion_tokens`` budget per route or
#: client): long outputs, not slow steps, make the tail of an end-to-end SLO.
LEVER_CAP_OUTPUT_TOKENS: Final = "cap-output-tokens"
#: Give the KV cache room before adding replicas (vLLM ``--gpu-memory-utilization`` up,
#: ``--kv-cache-dtype fp8``, ``--max-num-seqs`` down; SGLang ``--mem-fraction-static``): preemptions
#: that rise with the running batch mean requests are evicted and recomputed.
LEVER_KV_CACHE_HEADROOM: Final = "kv-cache-headroom"
#: Reuse shared prompt prefixes (vLLM ``--enable-prefix-caching``, prefix-aware routing across
#: replicas; SGLang's radix cache is on unless ``--disable-radix-cache``).
LEVER_PREFIX_CACHING: Final = "prefix-caching"
LEVER_SHRINK_REQUEST: Final = "shrink-request"
# s4-events: deploys, scale events and model swaps (analysis.events, analysis.event_rules): what makes a
# rollout, a scale-up or a model swap invisible to clients.
#: Roll out with maxSurge (new pods start before old ones stop; maxUnavailable 0) and a readiness probe
#: that passes only once the model is loaded and warm (Kubernetes Deployment
#: spec.strategy.rollingUpdate.maxSurge / maxUnavailable; container readinessProbe), so no request
#: reaches a pod that cannot serve it yet and serving capacity never drops during the rollout.
LEVER_SURGE_READINESS: Final = "surge-with-readiness"
#: Keep warm spare capacity so a scale-up does not wait for scheduling, image pull and model load:
#: low-priority placeholder pods that real pods preempt (a PriorityClass with a negative value, the
#: cluster-autoscaler's "overprovisioning" pattern), or an HPA minReplicas above the usual floor.
LEVER_PREWARMED_PODS: Final = "prewarmed-pods"
#: Add replicas before a model swap (or a planned rollout) so the remaining capacity covers the pods
#: that are reloading, swap them a few at a time behind readiness, then scale back.
LEVER_SCALE_AHEAD: Final = "scale-ahead-of-swap"

# --- s4-levers-b (issue 18): FLEET levers -----------------------------------------------------------
#: Scale on queue depth instead of CPU: the autoscaler's target is a resource metric (CPU, memory) that
#: lags a queue on an accelerator; scale on the queue instead (KEDA's ``prometheus`` trigger on
#: ``vllm:num_requests_waiting``, or an HPA ``autoscaling/v2`` ``External``/``Pods`` metric; see
#: shared/docs/REFERENCE.md section 4). Evidence from kube-state-metrics' HPA series or the SLO file's
#: ``autoscaler_metric``.
LEVER_SCALE_ON_QUEUE_DEPTH: Final = "scale-on-queue-depth"
#: Cap the concurrent requests (streams) an engine admits: vLLM ``--max-num-seqs``, SGLang
#: ``--max-running-requests``, a gateway's max in-flight requests. vLLM's docs (configuration/
#: optimization.md, "Preemption"): with too little KV cache for the batch, requests are preempted and
#: recomputed; "Decrease max_num_seqs or max_num_batched_tokens" when no memory is left to give.
LEVER_CONCURRENCY_LIMIT: Final = "concurrency-limit"
#: Route a request to the replica whose KV cache holds its prefix: vLLM production-stack router
#: ``routingLogic: kvaware`` / ``prefixaware`` (docs use_cases/kv-cache-aware-routing), SGLang router
#: ``--policy cache_aware``, llm-d's prefix-cache scorer.
LEVER_KV_CACHE_AWARE_ROUTING: Final = "kv-cache-aware-routing"
#: kube-state-metrics' HPA series (kubernetes/kube-state-metrics docs/horizontalpodautoscaler-metrics.md;
#: internal/store/hpa.go: ``metric_name`` is the resource's name, ``cpu`` or ``memory``, for a Resource
#: metric, the metric's name otherwise; ``metric_target_type`` one of value / utilization / average).
KSM_HPA_SPEC_TARGET_METRIC: Final = "kube_horizontalpodautoscaler_spec_target_metric"
KSM_HPA_SPEC_MAX_REPLICAS: Final = "kube_horizontalpodautoscaler_spec_max_replicas"
KSM_HPA_SPEC_MIN_REPLICAS: Final = "kube_horizontalpodautoscaler_spec_min_replicas"
KSM_HPA_CURRENT_REPLICAS: Final = "kube_horizontalpodautoscaler_status_current_replicas"
KSM_HPA_DESIRED_REPLICAS: Final = "kube_horizontalpodautoscaler_status_desired_replicas"
KSM_LABEL_HPA: Final = "horizontalpodautoscaler"
KSM_LABEL_METRIC_NAME: Final = "metric_name"
KSM_LABEL_METRIC_TARGET_TYPE: Final = "metric_target_type"
#: Autoscaler metrics that are resources, not load: an autoscaler on these alone lags a queue.
AUTOSCALER_RESOURCE_METRICS: Final[frozenset[str]] = frozenset({"cpu", "memory"})
#: Labels of vllm:cache_config_info (vLLM CacheConfig.metrics_info: every cache setting as a label).
VLLM_LABEL_GPU_MEMORY_UTILIZATION: Final = "gpu_memory_utilization"
VLLM_LABEL_NUM_GPU_BLOCKS: Final = "num_gpu_blocks"
VLLM_LABEL_BLOCK_SIZE: Final = "block_size"
#: Labels that tell one replica's (one KV cache's) series from another's: a Prometheus scrape's
#: ``instance``, Kubernetes' ``pod``, vLLM's data-parallel ``engine``, SGLang's ``dp_rank``.
REPLICA_LABELS: Final[tuple[str, ...]] = ("instance", "pod", "engine", "dp_rank")

# -- s4-levers-a (issue 18, workload levers) -------------------------------------------------------
#: Serve prefill and decode on separate pools (disaggregated serving: vLLM's disaggregated prefill,
#: ``--kv-transfer-config`` with a KV connector, docs.vllm.ai "Disaggregated Prefilling
#: (experimental)"; SGLang's PD disaggregation, ``--disaggregation-mode prefill|decode`` with a
#: transfer backend, docs.sglang.ai "PD Disaggregation"): decode steps no longer share the GPU with
#: other requests' long prefills, so inter-token gaps stop spiking while those run.
LEVER_SEPARATE_PREFILL_DECODE: Final = "separate-prefill-decode"
#: A prompt-length budget per route or client: cap prompt tokens or truncate the context (vLLM's
#: ``truncate_prompt_tokens`` sampling/request parameter; ``--max-model-len`` as a hard limit;
#: fewer retrieved chunks in a RAG route): long prompts at the normal per-token prefill cost own the tail.
LEVER_CAP_PROMPT_TOKENS: Final = "cap-prompt-tokens"
#: Iteration-level (continuous) batching instead of a static batcher on a streaming route: a request
#: joins the running batch at the next decode step (Orca, OSDI'22; vLLM and SGLang schedule every
#: step, ``--max-num-seqs`` / ``--max-running-requests`` bound the batch; TGI's router;
#: Hugging Face ``generate()`` on a fixed batch is the static case).
LEVER_CONTINUOUS_BATCHING: Final = "continuous-batching"
#: Cascade routing to a smaller model: the small model answers first and escalates to the large one
#: when it is not confident (FrugalGPT, Chen et al. 2023; RouteLLM, Ong et al. 2024); requests that
#: escalate pay both models. The escalation rate is measured from ATTR_ESCALATED where present.
LEVER_CASCADE_SMALL_MODEL: Final = "cascade-small-model"

LEVERS: Final[tuple[str, ...]] = (
    LEVER_CACHE_FEATURES,
    LEVER_CACHE_RESULTS,
    LEVER_OFFLOAD_PREPROCESSING,
    LEVER_CAP_BATCH_WAIT,
    LEVER_REDUCE_BATCH_TOKENS,
    LEVER_SCALE_OUT,
    LEVER_PREWARM,
    LEVER_QUANTIZE,
    LEVER_COMPILE_RUNTIME,
    LEVER_SHRINK_RESPONSE,
    LEVER_CHUNKED_PREFILL,
    LEVER_SPECULATIVE_DECODING,
    LEVER_SHRINK_REQUEST,
    LEVER_MORE_API_SERVERS,
    LEVER_CAP_OUTPUT_TOKENS,
    LEVER_KV_CACHE_HEADROOM,
    LEVER_PREFIX_CACHING,
    LEVER_SURGE_READINESS,
    LEVER_PREWARMED_PODS,
    LEVER_SCALE_AHEAD,
    LEVER_SCALE_ON_QUEUE_DEPTH,
    LEVER_CONCURRENCY_LIMIT,
    LEVER_KV_CACHE_AWARE_ROUTING,
    LEVER_SEPARATE_PREFILL_DECODE,
    LEVER_CAP_PROMPT_TOKENS,
    LEVER_CONTINUOUS_BATCHING,
    LEVER_CASCADE_SMALL_MODEL,
)

#: The order a plan applies levers in when one is not enough (analysis.plan): phase -> its levers,
#: phases in the seeds' order of practice: measure (time in no stage: add spans, no lever), fix the
#: autoscaler's signal (``scale-on-queue-depth`` where the autoscaler is seen scaling on CPU, else
#: ``scale-out``: every other lever's prediction reads the queue the autoscaler leaves), cut
#: per-request cost, batching, caching, then
#: capacity (memory and processes added to the serving engine). A lever in no phase goes last.
LEVER_PHASES: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("measure", ()),
    ("autoscale-signal", (LEVER_SCALE_ON_QUEUE_DEPTH, LEVER_SCALE_OUT)),
    ("per-request-cost", (
        LEVER_QUANTIZE, LEVER_COMPILE_RUNTIME, LEVER_OFFLOAD_PREPROCESSING, LEVER_SHRINK_REQUEST,
        LEVER_SHRINK_RESPONSE, LEVER_CAP_OUTPUT_TOKENS, LEVER_PREWARM,
        LEVER_CAP_PROMPT_TOKENS, LEVER_CASCADE_SMALL_MODEL,
    )),
    ("batching", (
        LEVER_CAP_BATCH_WAIT, LEVER_REDUCE_BATCH_TOKENS, LEVER_CHUNKED_PREFILL, LEVER_SPECULATIVE_DECODING,
        LEVER_CONCURRENCY_LIMIT, LEVER_CONTINUOUS_BATCHING,
    )),
    ("caching", (LEVER_CACHE_FEATURES, LEVER_CACHE_RESULTS, LEVER_PREFIX_CACHING, LEVER_KV_CACHE_AWARE_ROUTING)),
    ("capacity", (
        LEVER_KV_CACHE_HEADROOM, LEVER_MORE_API_SERVERS, LEVER_SEPARATE_PREFILL_DECODE, LEVER_SURGE_READINESS,
        LEVER_PREWARMED_PODS, LEVER_SCALE_AHEAD,
    )),
)  # fmt: skip
#: ``report["plan_status"]``: the plan's last step meets the SLO, or the levers ran out first
#: (``report["plan_left"]`` then says what is left); None when one lever is enough (no plan).
PLAN_MET: Final = "met"
PLAN_NOT_MET: Final = "not_met"

# --------------------------------------------------------------------------------------------------
# s4-events. Events: deploys, scale events, model swaps and config changes the analysis puts on the
# timeline (``analyze --events FILE``: JSON lines ``{time, kind, ...}``; kube-state-metrics series;
# stagescope's own model-load counter). A breach that follows an event is attributed to it.
# --------------------------------------------------------------------------------------------------
EVENT_DEPLOY: Final = "deploy"  # a rollout: new pods replace old ones (deployment generation change)
EVENT_SCALE: Final = "scale"  # replicas added or removed (HPA, kubectl scale); pods Pending while added
EVENT_MODEL_SWAP: Final = "model_swap"  # a model (re)loaded or replaced in running pods
EVENT_CONFIG: Final = "config"  # a configuration change (batching, limits, flags) without a rollout
EVENT_KINDS: Final[tuple[str, ...]] = (EVENT_DEPLOY, EVENT_SCALE, EVENT_MODEL_SWAP, EVENT_CONFIG)
EVENT_SOURCE_FILE: Final = "events-file"  # analyze --events FILE
EVENT_SOURCE_KSM: Final = "kube-state-metrics"  # scraped kube-state-metrics series
EVENT_SOURCE_STAGESCOPE: Final = "stagescope"  # stagescope's own metrics (model loads)

# kube-state-metrics (kubernetes/kube-state-metrics docs/metrics/workload/deployment-metrics.md and
# pod-metrics.md): gauges; deployments labelled namespace and deployment, pods namespace, pod and uid;
# times are Unix seconds.
KSM_DEPLOYMENT_GENERATION: Final = "kube_deployment_metadata_generation"  # desired state's generation
KSM_DEPLOYMENT_OBSERVED_GENERATION: Final = "kube_deployment_status_observed_generation"  # controller saw it
KSM_DEPLOYMENT_SPEC_REPLICAS: Final = "kube_deployment_spec_replicas"  # desired pods
KSM_DEPLOYMENT_REPLICAS: Final = "kube_deployment_status_replicas"  # pods (old and new)
KSM_DEPLOYMENT_REPLICAS_AVAILABLE: Final = "kube_deployment_status_replicas_available"
KSM_DEPLOYMENT_REPLICAS_UNAVAILABLE: Final = "kube_deployment_status_replicas_unavailable"
KSM_DEPLOYMENT_REPLICAS_UPDATED: Final = "kube_deployment_status_replicas_updated"  # pods of the new template
KSM_DEPLOYMENT_MAX_SURGE: Final = "kube_deployment_spec_strategy_rollingupdate_max_surge"  # pods over spec
KSM_POD_PHASE: Final = "kube_pod_status_phase"  # 1 for the pod's phase label, 0 for the others
KSM_POD_CREATED: Final = "kube_pod_created"  # Unix creation time (s)
KSM_POD_SCHEDULED_TIME: Final = "kube_pod_status_scheduled_time"  # Unix time the pod was scheduled (s)
KSM_LABEL_NAMESPACE: Final = "namespace"
KSM_LABEL_DEPLOYMENT: Final = "deployment"
KSM_LABEL_POD: Final = "pod"
KSM_LABEL_PHASE: Final = "phase"
KSM_PHASE_PENDING: Final = "Pending"
#: Every kube-state-metrics series the analysis reads (a live Prometheus is range-queried for these,
#: and for kube_pod_status_phase{phase="Pending"}).
KSM_METRICS: Final[tuple[str, ...]] = (
    KSM_DEPLOYMENT_GENERATION, KSM_DEPLOYMENT_OBSERVED_GENERATION, KSM_DEPLOYMENT_SPEC_REPLICAS,
    KSM_DEPLOYMENT_REPLICAS, KSM_DEPLOYMENT_REPLICAS_AVAILABLE, KSM_DEPLOYMENT_REPLICAS_UNAVAILABLE,
    KSM_DEPLOYMENT_REPLICAS_UPDATED, KSM_DEPLOYMENT_MAX_SURGE, KSM_POD_CREATED, KSM_POD_SCHEDULED_TIME,
)  # fmt: skip

# --------------------------------------------------------------------------------------------------
# SLIs: which latency an SLO is about.
# --------------------------------------------------------------------------------------------------
SLI_E2E: Final = "e2e"  # server request duration (arrival to last byte written)
SLI_TTFT: Final = "ttft"  # server: request arrival to first token written
SLI_ITL: Final = "itl"  # server: gap between consecutive tokens of one stream (one sample per gap)
SLIS: Final[tuple[str, ...]] = (SLI_E2E, SLI_TTFT, SLI_ITL)

# --------------------------------------------------------------------------------------------------
# Report status (``report["status"]`` of `stagescope analyze`, every per-route entry too). No data is
# never a verdict: an SLO with 0 samples is ``no_data`` with ``breached`` null, not "met".
# --------------------------------------------------------------------------------------------------
STATUS_BREACHED: Final = "breached"  # the SLO's quantile is above its threshold
STATUS_MET: Final = "met"  # the SLO's quantile is at or below its threshold, over at least one sample
STATUS_NO_DATA: Final = "no_data"  # no sample for the SLO: report["no_data_reason"] says why
#: Worst first: the order in which a report over several routes (or SLOs) picks its top level. An SLO
#: that could not be checked ranks above one that was checked and met, so "met" at the top means every
#: entry was checked and met.
STATUSES: Final[tuple[str, ...]] = (STATUS_BREACHED, STATUS_NO_DATA, STATUS_MET)

# --------------------------------------------------------------------------------------------------
# Prometheus metric names (stagescope's own). Durations in seconds.
# --------------------------------------------------------------------------------------------------
METRIC_REQUEST_DURATION: Final = (
    "stagescope_request_duration_seconds"  # histogram: route, model, status_class
)
METRIC_STAGE_DURATION: Final = "stagescope_stage_duration_seconds"  # histogram: stage, kind, model
METRIC_QUEUE_DEPTH: Final = "stagescope_queue_depth"  # gauge: model; requests waiting (batch_wait + queue)
METRIC_INFLIGHT: Final = "stagescope_inflight_requests"  # gauge: requests being served right now
METRIC_BATCH_SIZE: Final = "stagescope_batch_size"  # histogram: model; items per executed batch
METRIC_INTER_TOKEN: Final = "stagescope_inter_token_latency_seconds"  # histogram: model; one sample per gap
METRIC_SPANS_EXPORTED: Final = "stagescope_spans_exported_total"  # counter: exporter
METRIC_SPANS_DROPPED: Final = "stagescope_spans_dropped_total"  # counter: exporter, reason
METRIC_REQUESTS_SHED: Final = "stagescope_requests_shed_total"  # counter: route, model; 429 answers
METRIC_MODEL_LOADS: Final = "stagescope_model_loads_total"  # counter: model; model (re)loads
METRIC_MODEL_READY: Final = "stagescope_model_ready"  # gauge: model; 1 when the model is loaded
METRIC_EXECUTOR_BUSY: Final = "stagescope_executor_busy_seconds_total"  # counter: model; executor busy time
METRIC_STAGES_FOLDED: Final = "stagescope_stages_folded_total"  # counter: stage intervals past the name cap
#: counter: stage()/add_stage() calls whose kind was not the one recorded (not one of KINDS, or not the
#: name's kind in this process); recorded anyway, so the request goes on (instrumentation/stagenames.py)
METRIC_STAGE_KIND_ERRORS: Final = "stagescope_stage_kind_errors_total"
# What a model-changing lever would do, measured by the service when it loads (service/variants.py):
# labels model, variant (VARIANT_SERVING or the lever's name) and, for batch times, rows.
METRIC_MODEL_EVAL_ACCURACY: Final = "stagescope_model_eval_accuracy_ratio"  # gauge: share of eval set right
METRIC_MODEL_EVAL_SAMPLES: Final = "stagescope_model_eval_samples"  # gauge: size of the held-out eval set
METRIC_MODEL_VARIANT_BATCH: Final = "stagescope_model_variant_batch_seconds"  # gauge: median s per batch (CPU s on CPU engines)
# What a fleet-changing lever would do to one request's time holding an executor, measured by the service
# (the llama.cpp demo's sizing probe: every slot busy, as served and with the lever's servers); label variant.
METRIC_EXECUTOR_SERVICE: Final = "stagescope_executor_service_seconds"  # gauge: median s per request, all busy
# The same by occupancy (a host whose cores the servers share): one request's time with LABEL_BUSY_OWN
# slots of its server busy and LABEL_BUSY_OTHERS on the other servers; labels variant, busy_own, busy_others.
METRIC_EXECUTOR_OCCUPANCY: Final = "stagescope_executor_occupancy_service_seconds"  # gauge: median s per request
# The cores the request's server process got (CPU s over wall s) in that occupancy's measurement: the
# probe's times are rescaled from that share to what the run's servers will be left (analysis.cpu_budget).
METRIC_EXECUTOR_OCCUPANCY_CPU: Final = "stagescope_executor_occupancy_cpu_cores"  # gauge: cores, same labels
# The CPU a run's own processes take on the machine the servers share, and the cores there are: what the
# scale-out model leaves the servers (analysis.cpu_budget). Label LABEL_ROLE, and LABEL_REPLICA for engines.
METRIC_PROCESS_CPU: Final = "stagescope_process_cpu_seconds_total"  # counter: CPU s (user + system)
METRIC_PROCESS_CPU_READ_FAILURES: Final = "stagescope_process_cpu_read_failures_total"  # counter: failed reads
METRIC_HOST_CPU_CORES: Final = "stagescope_host_cpu_cores"  # gauge: cores this process may run on (affinity, cgroup quota)
METRIC_HOST_CPU_COMPETING: Final = "stagescope_host_cpu_competing_seconds_total"  # counter: CPU s of the usable cores taken at this priority or above
LABEL_ROLE: Final = "role"  # which process: ROLE_GATEWAY, ROLE_CLIENT or ROLE_ENGINE
ROLE_GATEWAY: Final = "gateway"  # the stagescope gateway itself (spans, metrics, the relay of every token)
ROLE_CLIENT: Final = "client"  # the load generator's process (the demo's, with its metrics recorder)
ROLE_ENGINE: Final = "engine"  # an engine server the gateway started (llama-server), one per LABEL_REPLICA

# OpenTelemetry GenAI semantic conventions, as Prometheus renders them (dots to underscores + unit).
METRIC_GENAI_TTFT: Final = "gen_ai_server_time_to_first_token_seconds"  # arrival to first token
METRIC_GENAI_TPOT: Final = "gen_ai_server_time_per_output_token_seconds"  # per request: decode / (n-1)
METRIC_GENAI_REQUEST_DURATION: Final = "gen_ai_server_request_duration_seconds"

# GPU exporter (dcgm-exporter names are read from its counters CSV; these are stagescope's own).
METRIC_GPU_UP: Final = "stagescope_gpu_up"  # gauge: gpu; 0 when NVML calls for that GPU fail
METRIC_GPU_EXPORTER_UP: Final = "stagescope_gpu_exporter_up"  # gauge: 0 when NVML is unavailable
DCGM_VGPU_LICENSE_STATUS: Final = "DCGM_FI_DEV_VGPU_LICENSE_STATUS"  # in dcgm's default list; no NVML call
DCGM_GPU_UTIL: Final = "DCGM_FI_DEV_GPU_UTIL"
DCGM_MEM_COPY_UTIL: Final = "DCGM_FI_DEV_MEM_COPY_UTIL"
DCGM_FB_USED: Final = "DCGM_FI_DEV_FB_USED"
DCGM_FB_FREE: Final = "DCGM_FI_DEV_FB_FREE"
DCGM_POWER_USAGE: Final = "DCGM_FI_DEV_POWER_USAGE"
DCGM_SM_CLOCK: Final = "DCGM_FI_DEV_SM_CLOCK"
DCGM_GPU_TEMP: Final = "DCGM_FI_DEV_GPU_TEMP"
DCGM_XID_ERRORS: Final = "DCGM_FI_DEV_XID_ERRORS"
DCGM_MEM_CLOCK: Final = "DCGM_FI_DEV_MEM_CLOCK"
DCGM_MEMORY_TEMP: Final = "DCGM_FI_DEV_MEMORY_TEMP"
DCGM_TOTAL_ENERGY: Final = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
DCGM_PCIE_REPLAY: Final = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
DCGM_ENC_UTIL: Final = "DCGM_FI_DEV_ENC_UTIL"
DCGM_DEC_UTIL: Final = "DCGM_FI_DEV_DEC_UTIL"
DCGM_FB_RESERVED: Final = "DCGM_FI_DEV_FB_RESERVED"
DCGM_NVLINK_BANDWIDTH_TOTAL: Final = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
DCGM_UNCORRECTABLE_REMAPPED_ROWS: Final = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
DCGM_CORRECTABLE_REMAPPED_ROWS: Final = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
DCGM_ROW_REMAP_FAILURE: Final = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
DCGM_PCIE_TX_BYTES: Final = "DCGM_FI_PROF_PCIE_TX_BYTES"  # gauge, bytes/s in default-counters.csv
DCGM_PCIE_RX_BYTES: Final = "DCGM_FI_PROF_PCIE_RX_BYTES"
# DCP profiling fields (ratio 0..1); stagescope reads them from NVML GPM on Hopper and newer.
DCGM_PROF_GR_ENGINE_ACTIVE: Final = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
DCGM_PROF_PIPE_TENSOR_ACTIVE: Final = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DCGM_PROF_DRAM_ACTIVE: Final = "DCGM_FI_PROF_DRAM_ACTIVE"
# Clock-event (throttle) reasons, a gauge holding NVML's bitmask: dcgm-exporter HEAD reads the field as
# DCGM_FI_DEV_CLOCKS_EVENT_REASONS (internal/pkg/collector/clock_events_collector.go); DCGM 3.3 renamed
# it from DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, which its headers keep as an alias (older CSVs use it).
DCGM_CLOCKS_EVENT_REASONS: Final = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
DCGM_CLOCK_THROTTLE_REASONS: Final = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"  # the name before DCGM 3.3
DCGM_ECC_SBE_VOL_TOTAL: Final = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
DCGM_ECC_DBE_VOL_TOTAL: Final = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
DCGM_ECC_SBE_AGG_TOTAL: Final = "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"
DCGM_ECC_DBE_AGG_TOTAL: Final = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"
# dcgm-exporter "label" fields: added as labels to every GPU metric when listed in the counters CSV.
DCGM_LABEL_DRIVER_VERSION: Final = "DCGM_FI_DRIVER_VERSION"
DCGM_LABEL_NVML_VERSION: Final = "DCGM_FI_NVML_VERSION"
DCGM_LABEL_SERIAL: Final = "DCGM_FI_DEV_SERIAL"
DCGM_LABEL_VBIOS_VERSION: Final = "DCGM_FI_DEV_VBIOS_VERSION"
# stagescope's sub-second view of GPU utilization: NVML samples (or polls at --interval) kept for a
# window (set it to the scrape interval), published as max and mean so a 15 s scrape shows a 1 s peak.
METRIC_GPU_UTIL_WINDOW_MAX: Final = "stagescope_gpu_utilization_window_max_percent"  # gauge: dcgm + engine
METRIC_GPU_UTIL_WINDOW_MEAN: Final = "stagescope_gpu_utilization_window_mean_percent"  # gauge: dcgm + engine
METRIC_GPU_UTIL_WINDOW_SAMPLES: Final = (
    "stagescope_gpu_utilization_window_samples"  # gauge: samples in window
)
METRIC_GPU_WINDOW_SECONDS: Final = "stagescope_gpu_utilization_window_seconds"  # gauge: window length (s)
# Per-process GPU use (pid), so a service can be matched to its GPU.
METRIC_GPU_PROCESS_MEMORY: Final = "stagescope_gpu_process_memory_used_bytes"  # gauge: gpu, UUID, pid
METRIC_GPU_PROCESS_UTIL: Final = "stagescope_gpu_process_utilization_percent"  # gauge: gpu, UUID, pid, engine
METRIC_GPU_SCRAPE_ERRORS: Final = "stagescope_gpu_nvml_errors_total"  # counter: gpu; NVML calls that failed
LABEL_ENGINE: Final = "engine"  # "gpu" / "memory_copy" (device), "sm" / "memory_copy" (process)
LABEL_PID: Final = "pid"
DCGM_BLANK_SENTINEL: Final = 9223372036854775794
# The host label: dcgm-exporter HEAD writes ``hostname`` (commit d5e5f51, 2026-05-12, "Rename Hostname
# label to hostname", internal/pkg/rendermetrics/render_metrics.go), its releases up to 4.5.3-4.8.2
# ``Hostname``; stagescope's exporter writes the new one, the old one with --legacy-hostname-label.
DCGM_LABEL_HOSTNAME: Final = "hostname"
DCGM_LABEL_HOSTNAME_LEGACY: Final = "Hostname"
DCGM_LABELS: Final[tuple[str, ...]] = ("gpu", "UUID", "pci_bus_id", "device", "modelName", DCGM_LABEL_HOSTNAME)
DCGM_LABELS_LEGACY: Final[tuple[str, ...]] = (*DCGM_LABELS[:-1], DCGM_LABEL_HOSTNAME_LEGACY)
SIMULATED_ACCELERATOR_MODEL_NAME: Final = "simulated-accelerator"

# vLLM (prefix ``vllm:``, label ``model_name``).
VLLM_NUM_RUNNING: Final = "vllm:num_requests_running"
VLLM_NUM_WAITING: Final = "vllm:num_requests_waiting"
VLLM_KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
VLLM_PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
VLLM_GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
VLLM_REQUEST_SUCCESS: Final = "vllm:request_success_total"
VLLM_TTFT: Final = "vllm:time_to_first_token_seconds"
VLLM_ITL: Final = "vllm:inter_token_latency_seconds"
VLLM_TPOT: Final = "vllm:request_time_per_output_token_seconds"
VLLM_E2E: Final = "vllm:e2e_request_latency_seconds"
VLLM_QUEUE_TIME: Final = "vllm:request_queue_time_seconds"
VLLM_PREFILL_TIME: Final = "vllm:request_prefill_time_seconds"
VLLM_DECODE_TIME: Final = "vllm:request_decode_time_seconds"
VLLM_INFERENCE_TIME: Final = "vllm:request_inference_time_seconds"
VLLM_LABEL_MODEL: Final = "model_name"
# vLLM V1 (vllm/v1/metrics/loggers.py): every family also carries ``engine`` (the data-parallel engine
# index); counters are exposed with ``_total`` by prometheus_client whatever the source name says.
VLLM_LABEL_ENGINE: Final = "engine"
VLLM_NUM_PREEMPTIONS: Final = "vllm:num_preemptions_total"
VLLM_PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries_total"  # tokens queried
VLLM_PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits_total"  # tokens found in the cache
VLLM_GPU_PREFIX_CACHE_QUERIES: Final = "vllm:gpu_prefix_cache_queries_total"  # before the rename
VLLM_GPU_PREFIX_CACHE_HITS: Final = "vllm:gpu_prefix_cache_hits_total"  # before the rename
VLLM_GPU_CACHE_USAGE: Final = "vllm:gpu_cache_usage_perc"  # before kv_cache_usage_perc (0..1)
VLLM_ITERATION_TOKENS: Final = "vllm:iteration_tokens_total"  # histogram: tokens per engine step
VLLM_SPEC_DRAFTS: Final = "vllm:spec_decode_num_drafts_total"
VLLM_SPEC_DRAFT_TOKENS: Final = "vllm:spec_decode_num_draft_tokens_total"
VLLM_SPEC_ACCEPTED_TOKENS: Final = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_TPOT_LEGACY: Final = "vllm:time_per_output_token_seconds"  # before inter_token_latency_seconds
VLLM_CACHE_CONFIG_INFO: Final = "vllm:cache_config_info"  # gauge 1, configuration in labels
VLLM_LABEL_PREFIX_CACHING: Final = "enable_prefix_caching"  # label of VLLM_CACHE_CONFIG_INFO

# SGLang (prefix ``sglang:``, python/sglang/srt/metrics/collector.py; labels ``model_name`` and the
# ranks of the process that published the series: ``tp_rank``, ``dp_rank``, ``pp_rank``, ...).
SGLANG_LABEL_MODEL: Final = "model_name"
SGLANG_LABEL_STAGE: Final = "stage"  # of SGLANG_PER_STAGE_LATENCY
SGLANG_PER_STAGE_LATENCY: Final = "sglang:per_stage_req_latency_seconds"  # histogram: stage
SGLANG_QUEUE_TIME: Final = "sglang:queue_time_seconds"  # histogram: wait queue -> forward
SGLANG_TTFT: Final = "sglang:time_to_first_token_seconds"
SGLANG_ITL: Final = "sglang:inter_token_latency_seconds"
SGLANG_E2E: Final = "sglang:e2e_request_latency_seconds"
SGLANG_NUM_QUEUE_REQS: Final = "sglang:num_queue_reqs"  # gauge: requests in the waiting queue
SGLANG_NUM_RUNNING_REQS: Final = "sglang:num_running_reqs"
SGLANG_TOKEN_USAGE: Final = "sglang:token_usage"  # gauge 0..1: KV cache pool in use
SGLANG_CACHE_HIT_RATE: Final = "sglang:cache_hit_rate"  # gauge 0..1: prefix (radix) cache hit rate
SGLANG_RETRACTED: Final = "sglang:num_retracted_requests_total"  # counter: requests retracted (preempted)
SGLANG_SPEC_ACCEPT_RATE: Final = "sglang:spec_accept_rate"  # gauge 0..1
SGLANG_PROMPT_TOKENS: Final = "sglang:prompt_tokens_total"
SGLANG_CACHED_TOKENS: Final = "sglang:cached_tokens_total"  # prompt tokens served from the cache
SGLANG_NUM_REQUESTS: Final = "sglang:num_requests_total"

# llama.cpp's llama-server (``--metrics``; prefix ``llamacpp:``, no labels). Names as its
# tools/server/server-task.cpp (server_task_result_metrics::to_metrics) writes them in the vendored
# llama.cpp of llama-cpp-python 0.3.36. The stagescope gateway re-exports them with LABEL_REPLICA.
LLAMACPP_PROMPT_TOKENS: Final = "llamacpp:prompt_tokens_total"  # counter: prompt tokens processed (not cached)
LLAMACPP_PROMPT_TOKENS_CACHED: Final = "llamacpp:prompt_tokens_cached_total"  # counter
LLAMACPP_PROMPT_SECONDS: Final = "llamacpp:prompt_seconds_total"  # counter: seconds processing prompts
LLAMACPP_TOKENS_PREDICTED: Final = "llamacpp:tokens_predicted_total"  # counter: generated tokens
LLAMACPP_TOKENS_PREDICTED_SECONDS: Final = "llamacpp:tokens_predicted_seconds_total"  # counter: seconds
LLAMACPP_DECODE_CALLS: Final = "llamacpp:n_decode_total"  # counter: llama_decode() calls (engine steps)
LLAMACPP_TOKENS_MAX: Final = "llamacpp:n_tokens_max"  # counter (as llama.cpp types it): longest sequence
LLAMACPP_PROMPT_TPS: Final = "llamacpp:prompt_tokens_seconds"  # gauge: prompt tokens/s
LLAMACPP_PREDICTED_TPS: Final = "llamacpp:predicted_tokens_seconds"  # gauge: generated tokens/s
LLAMACPP_REQUESTS_PROCESSING: Final = "llamacpp:requests_processing"  # gauge: busy slots
LLAMACPP_REQUESTS_DEFERRED: Final = "llamacpp:requests_deferred"  # gauge: requests waiting for a slot
LLAMACPP_BUSY_SLOTS_PER_DECODE: Final = "llamacpp:n_busy_slots_per_decode"  # gauge: mean busy slots per step
LLAMACPP_METRICS: Final[tuple[str, ...]] = (
    LLAMACPP_PROMPT_TOKENS, LLAMACPP_PROMPT_TOKENS_CACHED, LLAMACPP_PROMPT_SECONDS, LLAMACPP_TOKENS_PREDICTED,
    LLAMACPP_TOKENS_PREDICTED_SECONDS, LLAMACPP_DECODE_CALLS, LLAMACPP_TOKENS_MAX, LLAMACPP_PROMPT_TPS,
    LLAMACPP_PREDICTED_TPS, LLAMACPP_REQUESTS_PROCESSING, LLAMACPP_REQUESTS_DEFERRED,
    LLAMACPP_BUSY_SLOTS_PER_DECODE,
)  # fmt: skip
LABEL_REPLICA: Final = "replica"  # which llama-server behind the gateway ("0", "1", ...)
# Per-response ``timings`` of llama-server (tools/server/server-common.cpp, server_slot_stats::to_json),
# put on the gateway's server span. Milliseconds, as llama.cpp reports them.
ATTR_LLAMACPP_PROMPT_N: Final = "llamacpp.timings.prompt_n"  # prompt tokens processed (not from cache)
ATTR_LLAMACPP_PROMPT_MS: Final = "llamacpp.timings.prompt_ms"  # ms processing this prompt
ATTR_LLAMACPP_CACHE_N: Final = "llamacpp.timings.cache_n"  # prompt tokens reused from the slot's cache
ATTR_LLAMACPP_PREDICTED_N: Final = "llamacpp.timings.predicted_n"  # tokens generated
ATTR_LLAMACPP_PREDICTED_MS: Final = "llamacpp.timings.predicted_ms"  # ms generating them
# derived by the gateway: ms from handing the request to its slot to llama.cpp starting its prompt
# (prefill stage minus prompt_ms): waiting for room in the engine's batch behind other prompts
ATTR_LLAMACPP_PROMPT_WAIT_MS: Final = "llamacpp.prompt_wait_ms"
ATTR_REPLICA: Final = "stagescope.replica"  # which engine replica served the request
HEADER_REPLICA: Final = "x-stagescope-replica"  # gateway response header: the replica that served it ("0", "1", ...)

# Triton (labels ``model``, ``version``; cumulative microsecond counters).
TRITON_REQUEST_SUCCESS: Final = "nv_inference_request_success"
TRITON_REQUEST_FAILURE: Final = "nv_inference_request_failure"
TRITON_INFERENCE_COUNT: Final = "nv_inference_count"
TRITON_EXEC_COUNT: Final = "nv_inference_exec_count"
TRITON_PENDING: Final = "nv_inference_pending_request_count"
TRITON_REQUEST_DURATION_US: Final = "nv_inference_request_duration_us"
TRITON_QUEUE_DURATION_US: Final = "nv_inference_queue_duration_us"
TRITON_COMPUTE_INPUT_US: Final = "nv_inference_compute_input_duration_us"
TRITON_COMPUTE_INFER_US: Final = "nv_inference_compute_infer_duration_us"
TRITON_COMPUTE_OUTPUT_US: Final = "nv_inference_compute_output_duration_us"
TRITON_GPU_UTILIZATION: Final = "nv_gpu_utilization"
TRITON_GPU_MEMORY_USED: Final = "nv_gpu_memory_used_bytes"
# Time to first response (histogram, milliseconds, whole milliseconds per observation: core's
# infer_response.cc divides nanoseconds by 1e6 in integers); only with --metrics-config
# histogram_latencies=true.
TRITON_FIRST_RESPONSE_MS: Final = "nv_inference_first_response_histogram_ms"
# Response cache (only for models with the cache on). Hits count in request_success, request and queue
# durations but not in nv_inference_count / exec_count or the compute counters (core infer_stats.cc).
TRITON_CACHE_HITS: Final = "nv_cache_num_hits_per_model"
TRITON_CACHE_MISSES: Final = "nv_cache_num_misses_per_model"
TRITON_CACHE_HIT_US: Final = "nv_cache_hit_duration_per_model"  # cumulative microseconds
TRITON_CACHE_MISS_US: Final = "nv_cache_miss_duration_per_model"  # cumulative microseconds
TRITON_LABEL_MODEL: Final = "model"
TRITON_LABEL_VERSION: Final = "version"
# Triton's traces (server src/tracer.cc): the trace file's timestamp names (core's
# TRITONSERVER_InferenceTraceActivityString and the frontends' CaptureTimestamp calls) and the
# OpenTelemetry mode's span names and attributes.
TRITON_TS_REQUEST_START: Final = "REQUEST_START"
TRITON_TS_QUEUE_START: Final = "QUEUE_START"
TRITON_TS_COMPUTE_START: Final = "COMPUTE_START"
TRITON_TS_COMPUTE_INPUT_END: Final = "COMPUTE_INPUT_END"
TRITON_TS_COMPUTE_OUTPUT_START: Final = "COMPUTE_OUTPUT_START"
TRITON_TS_COMPUTE_END: Final = "COMPUTE_END"
TRITON_TS_REQUEST_END: Final = "REQUEST_END"
TRITON_TS_HTTP_RECV_START: Final = "HTTP_RECV_START"
TRITON_TS_HTTP_RECV_END: Final = "HTTP_RECV_END"
TRITON_TS_HTTP_SEND_START: Final = "HTTP_SEND_START"
TRITON_TS_HTTP_SEND_END: Final = "HTTP_SEND_END"
TRITON_TS_GRPC_WAITREAD_START: Final = "GRPC_WAITREAD_START"
TRITON_TS_GRPC_WAITREAD_END: Final = "GRPC_WAITREAD_END"
TRITON_TS_GRPC_SEND_START: Final = "GRPC_SEND_START"
TRITON_TS_GRPC_SEND_END: Final = "GRPC_SEND_END"
TRITON_TS_INFER_RESPONSE_COMPLETE: Final = "INFER_RESPONSE_COMPLETE"
TRITON_SPAN_ROOT: Final = "InferRequest"  # OpenTelemetry mode: the request's root span
TRITON_SPAN_COMPUTE: Final = "compute"  # OpenTelemetry mode: a model span's compute child
TRITON_ATTR_MODEL_NAME: Final = "triton.model_name"
TRITON_ATTR_MODEL_VERSION: Final = "triton.model_version"
TRITON_ATTR_TRACE_ID: Final = "triton.trace_id"
TRITON_ATTR_TRACE_PARENT_ID: Final = "triton.trace_parent_id"
TRITON_ATTR_REQUEST_ID: Final = "triton.request_id"

# --------------------------------------------------------------------------------------------------
# Prometheus label keys.
# --------------------------------------------------------------------------------------------------
LABEL_ROUTE: Final = "route"  # route template, never the raw path
LABEL_MODEL: Final = "model"  # from a configured set; others fold into OTHER_MODEL
LABEL_STATUS_CLASS: Final = "status_class"  # "2xx", "4xx", "5xx", STATUS_CLASS_CLIENT_CLOSED
LABEL_STAGE: Final = "stage"
LABEL_KIND: Final = "kind"  # the stage's kind (a function of the stage name: adds no series)
LABEL_EXPORTER: Final = "exporter"
LABEL_REASON: Final = "reason"
LABEL_GPU: Final = "gpu"
LABEL_VARIANT: Final = "variant"  # model variant: VARIANT_SERVING or the lever that would serve it
LABEL_ROWS: Final = "rows"  # rows (work units) in a micro-benchmark batch
LABEL_BUSY_OWN: Final = "busy_own"  # busy slots of the request's own server ("1", "2", ...)
LABEL_BUSY_OTHERS: Final = "busy_others"  # busy slots of the other servers on the same host ("0", "1", ...)
VARIANT_SERVING: Final = "serving"  # the model as it is served now
OTHER_MODEL: Final = "other"  # folded value for models outside the configured set
UNMATCHED_ROUTE: Final = "unmatched"  # route label for paths that match no route template
#: The HTTP methods OpenTelemetry's HTTP semantic conventions know (``http.request.method``); a server
#: span of another method is named "HTTP" (and its method attribute ``_OTHER``).
HTTP_KNOWN_METHODS: Final = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "QUERY"}
)

# A request whose client went away before the answer was complete (mid-upload, while the server
# worked, or mid-stream): not a server error. Recorded with HTTP status 499 (nginx's "client closed
# request") on its span and the analysis' ``requests.status_code``, and with its own status class on
# the request histogram; neither the analysis' SLI samples nor the generated SLO rules count it.
STATUS_CODE_CLIENT_CLOSED: Final = 499
STATUS_CLASS_CLIENT_CLOSED: Final = "client_closed"

# Why a span was not exported: values of the ``reason`` label of METRIC_SPANS_DROPPED.
DROP_QUEUE_FULL: Final = "queue_full"  # the bounded queue (span thread or exporter) was full
DROP_BUILD_FAILED: Final = "build_failed"  # the record could not be turned into spans / encoded
DROP_WRITE_FAILED: Final = "write_failed"  # span file: the write failed (disk full, I/O error, no directory)
DROP_EXPORT_FAILED: Final = "export_failed"  # OTLP: every retry of the batch failed (down, hanging, 429/5xx)
DROP_REJECTED: Final = "rejected"  # OTLP: the collector refused the data for good (4xx, partial success)
DROP_SHUTDOWN: Final = "shutdown"  # not written by the shutdown deadline, or handed over after the stop
DROP_REASONS: Final[tuple[str, ...]] = (
    DROP_QUEUE_FULL, DROP_BUILD_FAILED, DROP_WRITE_FAILED, DROP_EXPORT_FAILED, DROP_REJECTED, DROP_SHUTDOWN,
)  # fmt: skip

# --------------------------------------------------------------------------------------------------
# Span names and attribute keys.
# --------------------------------------------------------------------------------------------------
#: Server span name: "{method} {route template}" as opentelemetry-instrumentation-fastapi names it.
SERVER_SPAN_NAME_FORMAT: Final = "{method} {route}"
ATTR_STAGE: Final = "stagescope.stage"  # on stage spans: the stage name
ATTR_STAGE_KIND: Final = "stagescope.stage.kind"  # on stage spans: the stage's kind (KINDS)
ATTR_BATCH_SIZE: Final = "stagescope.batch_size"  # on the server span: size of the batch it ran in
ATTR_INPUT_HASH: Final = "stagescope.input_hash"  # hash of the input, never the content
ATTR_MODEL: Final = "stagescope.model"  # folded model label value
ATTR_COLD_START: Final = "stagescope.cold_start"  # bool: request waited for a model load
ATTR_QUEUE_DEPTH: Final = "stagescope.queue_depth"  # int: requests waiting when this one was enqueued
ATTR_SAMPLED_REASON: Final = "stagescope.sampled_reason"  # "slow", "error", "baseline"
SAMPLED_SLOW: Final = "slow"  # sampled_reason: slower than the slow threshold, kept with probability 1
SAMPLED_ERROR: Final = "error"  # sampled_reason: failed (5xx or exception), kept with probability 1
SAMPLED_BASELINE: Final = "baseline"  # sampled_reason: kept by the head sampler (its ratio, in `th`)
SAMPLED_REASONS: Final[tuple[str, ...]] = (SAMPLED_SLOW, SAMPLED_ERROR, SAMPLED_BASELINE)
ATTR_ITL_MEAN: Final = "stagescope.itl.mean"  # seconds, mean inter-token gap of this stream
ATTR_ITL_P99: Final = "stagescope.itl.p99"  # seconds
ATTR_ITL_MAX: Final = "stagescope.itl.max"  # seconds
ATTR_TOKEN_GAPS: Final = "stagescope.itl.gaps"  # list of every gap in seconds (capped length)
# list, same order as ATTR_TOKEN_GAPS: streams decoding on the engine when each gap ended (the running
# decode batch of the step that produced the token), where the server can count them
ATTR_TOKEN_RUNNING: Final = "stagescope.itl.running"
ATTR_ERROR_TYPE: Final = "error.type"
ATTR_CLIENT: Final = "stagescope.client"  # bool, on the load generator's CLIENT spans
# s4-levers-a: bool on a request span: a cascade's small model escalated this request to the large
# one (set by a service that runs or shadows a cascade; absent: the escalation rate is unknown)
ATTR_ESCALATED: Final = "stagescope.escalated"

# GenAI semantic conventions.
GENAI_OPERATION_NAME: Final = "gen_ai.operation.name"
GENAI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GENAI_REQUEST_MODEL: Final = "gen_ai.request.model"
GENAI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GENAI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
# vLLM's llm_request span attributes (double, seconds).
VLLM_SPAN_NAME: Final = "llm_request"
VLLM_ATTR_QUEUE: Final = "gen_ai.latency.time_in_queue"
VLLM_ATTR_TTFT: Final = "gen_ai.latency.time_to_first_token"
VLLM_ATTR_E2E: Final = "gen_ai.latency.e2e"
VLLM_ATTR_PREFILL: Final = "gen_ai.latency.time_in_model_prefill"
VLLM_ATTR_DECODE: Final = "gen_ai.latency.time_in_model_decode"
VLLM_ATTR_INFERENCE: Final = "gen_ai.latency.time_in_model_inference"
VLLM_ATTR_PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"
VLLM_ATTR_COMPLETION_TOKENS: Final = "gen_ai.usage.completion_tokens"
# vLLM's request-lifecycle child spans of llm_request (tests/tracing/test_request_lifecycle_tracing.py).
VLLM_SPAN_QUEUE: Final = "vllm.request.queue"
VLLM_SPAN_PREFILL: Final = "vllm.request.prefill"
VLLM_SPAN_DECODE: Final = "vllm.request.decode"
VLLM_SPAN_WAIT_REMOTE_KV: Final = "vllm.request.wait_remote_kv"
#: vLLM's and SGLang's child span names -> the stage they measure. SGLang's are its request stages
#: (python/sglang/srt/observability/req_time_stats.py ``RequestStage``), spans under the request's
#: root span ("Req <rid>") and its thread spans.
ENGINE_CHILD_SPAN_STAGES: Final[dict[str, str]] = {
    VLLM_SPAN_QUEUE: STAGE_QUEUE,
    VLLM_SPAN_PREFILL: STAGE_PREFILL,
    VLLM_SPAN_DECODE: STAGE_DECODE,
    VLLM_SPAN_WAIT_REMOTE_KV: STAGE_QUEUE,
    "tokenize": STAGE_FRONT_END,
    "api_server_dispatch": STAGE_FRONT_END,
    "dispatch": STAGE_FRONT_END,
    "dpc_dispatch": STAGE_FRONT_END,
    "dc_dispatch": STAGE_FRONT_END,
    "request_process": STAGE_FRONT_END,
    "prefill_waiting": STAGE_QUEUE,
    "prefill_forward": STAGE_PREFILL,
    "chunked_prefill": STAGE_PREFILL,
    "decode_waiting": STAGE_DECODE,
    "decode_forward": STAGE_DECODE,
    "decode_loop": STAGE_DECODE,
}
#: ``requests.source`` of a request an LLM engine's own span measured.
SOURCE_VLLM: Final = "vllm"
SOURCE_SGLANG: Final = "sglang"

# --------------------------------------------------------------------------------------------------
# Probability sampling (OpenTelemetry, specification/trace/tracestate-probability-sampling.md and
# tracestate-handling.md): every span carries its sampler's rejection threshold ``th`` (56 bits, hex,
# trailing zeros dropped) in the ``ot`` entry of the W3C tracestate; probability = (2^56 - th) / 2^56,
# ``th:0`` = kept with probability 1. ``rv`` is an explicit 56-bit randomness value (14 hex digits).
# --------------------------------------------------------------------------------------------------
TRACESTATE_OT: Final = "ot"  # the OpenTelemetry entry of the W3C tracestate
OT_THRESHOLD: Final = "th"  # ot sub-key: rejection threshold
OT_RANDOMNESS: Final = "rv"  # ot sub-key: explicit randomness value
SAMPLING_MAX_THRESHOLD: Final = 1 << 56  # 2^56: thresholds and randomness are 56-bit values
JAEGER_TAG_TRACESTATE: Final = "w3c.tracestate"  # where the collector's Jaeger translator keeps it

# --------------------------------------------------------------------------------------------------
# Where the analysis report's figures come from (``report["sources"]``): the traces (weighted by the
# inverse of each request's sampling probability), the load generator's results (every request it
# sent), or the request-duration histograms of the scraped metrics (every request the server saw).
# --------------------------------------------------------------------------------------------------
SOURCE_TRACES: Final = "traces"
SOURCE_CLIENT_RESULTS: Final = "client_results"
SOURCE_METRICS: Final = "metrics"

# --------------------------------------------------------------------------------------------------
# Histogram bucket sets (seconds). Every set holds the non-integer SLO thresholds 0.25, 0.5 and 2.5 s
# (and 0.3 s, the reference service's e2e SLO) so that latency SLIs can be read off a bucket.
# --------------------------------------------------------------------------------------------------
BUCKETS_REQUEST: Final[tuple[float, ...]] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
BUCKETS_STAGE: Final[tuple[float, ...]] = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.25, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
BUCKETS_BATCH_SIZE: Final[tuple[float, ...]] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# GenAI advisory buckets (OpenTelemetry semantic conventions), extended where an SLO needs a bound.
BUCKETS_GENAI_REQUEST: Final[tuple[float, ...]] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.25, 0.32, 0.5, 0.64, 1.28, 2.5, 2.56, 5.12, 10.24, 20.48,
    40.96, 81.92, 163.84, 327.68,
)  # fmt: skip
BUCKETS_GENAI_TTFT: Final[tuple[float, ...]] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    30.0, 60.0, 120.0,
)  # fmt: skip
BUCKETS_GENAI_TPOT: Final[tuple[float, ...]] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
BUCKETS_INTER_TOKEN: Final[tuple[float, ...]] = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.15,
    0.2, 0.25, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip

#: Default bucket set per metric family; users override per family (see instrument_app's buckets=).
DEFAULT_BUCKETS: Final[dict[str, tuple[float, ...]]] = {
    METRIC_REQUEST_DURATION: BUCKETS_REQUEST,
    METRIC_STAGE_DURATION: BUCKETS_STAGE,
    METRIC_BATCH_SIZE: BUCKETS_BATCH_SIZE,
    METRIC_GENAI_REQUEST_DURATION: BUCKETS_GENAI_REQUEST,
    METRIC_GENAI_TTFT: BUCKETS_GENAI_TTFT,
    METRIC_GENAI_TPOT: BUCKETS_GENAI_TPOT,
    METRIC_INTER_TOKEN: BUCKETS_INTER_TOKEN,
}

#: The histogram each SLI is read from, for alerts and dashboards.
SLI_HISTOGRAM: Final[dict[str, str]] = {
    SLI_E2E: METRIC_REQUEST_DURATION,
    SLI_TTFT: METRIC_GENAI_TTFT,
    SLI_ITL: METRIC_INTER_TOKEN,
}

# --------------------------------------------------------------------------------------------------
# Recording rules and alerts written by `stagescope alerts build` (alerts/generated/); the dashboards,
# the autoscaling examples (alerts/k8s/) and Alertmanager read them. Sloth-style SLO names.
# --------------------------------------------------------------------------------------------------
SLO_WINDOWS: Final[tuple[str, ...]] = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")  # burn-rate windows
RULE_SLI_ERROR_RATIO_FORMAT: Final = "slo:sli_error:ratio_rate{window}"  # bad / total over the window
RULE_SLO_OBJECTIVE: Final = "slo:objective:ratio"  # e.g. 0.99
RULE_SLO_ERROR_BUDGET: Final = "slo:error_budget:ratio"  # 1 - objective
RULE_SLO_THRESHOLD: Final = "slo:latency_threshold:seconds"  # the SLO's latency threshold, seconds
RULE_SLO_BUDGET_REMAINING: Final = "slo:period_error_budget_remaining:ratio"  # 1 = untouched, <0 = spent
RULE_STAGE_P99: Final = f"job_model_stage:{METRIC_STAGE_DURATION}:p99_rate5m"  # seconds
RULE_STAGE_MEAN: Final = f"job_model_stage:{METRIC_STAGE_DURATION}:mean_rate5m"  # seconds
RULE_REQUEST_P99: Final = f"job_route:{METRIC_REQUEST_DURATION}:p99_rate5m"  # seconds
RULE_QUEUE_DEPTH: Final = f"job_model:{METRIC_QUEUE_DEPTH}:avg1m"  # requests waiting; autoscale on it
ALERT_FAST_BURN: Final = "LatencySLOFastBurn"  # severity=page
ALERT_SLOW_BURN: Final = "LatencySLOSlowBurn"  # severity=ticket
LABEL_SLO: Final = "slo"
LABEL_SLI: Final = "sli"
LABEL_SEVERITY: Final = "severity"
SEVERITY_PAGE: Final = "page"
SEVERITY_TICKET: Final = "ticket"


#: What a server span records in place of a request's query string unless queries are recorded
#: (``instrument_app(record_query=True)`` or ENV_RECORD_QUERY): ``url.query`` is this and ``http.url``
#: ends ``?`` + this. OpenTelemetry's HTTP conventions replace a redacted value with the same word.
QUERY_REDACTED: Final = "REDACTED"


# --------------------------------------------------------------------------------------------------
# Environment variables (explicit argument first, then these, then defaults).
# --------------------------------------------------------------------------------------------------
ENV_SPANS_DIR: Final = "STAGESCOPE_SPANS_DIR"
ENV_SLOW_THRESHOLD_MS: Final = "STAGESCOPE_SLOW_THRESHOLD_MS"
ENV_BASELINE_SAMPLE: Final = "STAGESCOPE_BASELINE_SAMPLE"
ENV_BASELINE_MIN_PER_S: Final = "STAGESCOPE_BASELINE_MIN_PER_S"  # default policy's floor, traces/s/route
ENV_MODELS: Final = "STAGESCOPE_MODELS"
ENV_INSTRUMENTATION_MODE: Final = "STAGESCOPE_INSTRUMENTATION_MODE"
#: Seconds a graceful stop (SIGTERM/SIGINT through the ASGI lifespan, atexit, ``shutdown()``) may spend
#: writing or sending the spans still queued; what is left then is counted as DROP_SHUTDOWN.
ENV_SHUTDOWN_TIMEOUT_S: Final = "STAGESCOPE_SHUTDOWN_TIMEOUT_S"
#: Unix time minus steady-clock time on the Triton host, in ns, for placing Triton trace files
#: (their timestamps are on the server's steady clock; see analysis/ingest/triton_file.py).
ENV_TRITON_CLOCK_OFFSET_NS: Final = "STAGESCOPE_TRITON_CLOCK_OFFSET_NS"
ENV_MAX_CUSTOM_STAGES: Final = "STAGESCOPE_MAX_CUSTOM_STAGES"
#: ``1``/``true``/``yes``/``on`` records a request's query string on its server span (``http.url``,
#: ``url.query``); by default it is replaced by QUERY_REDACTED, since a GET query can carry user text.
ENV_RECORD_QUERY: Final = "STAGESCOPE_RECORD_QUERY"

__all__ = sorted(name for name in dir() if name.isupper())
