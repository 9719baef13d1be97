#ifdef KESTREL_HAS_CUDA

#include "models/gpu_sampling_rows.h"

#include "core/check.h"

namespace kestrel {

void GpuSamplingHostBatch::Clear() {
  rows.clear();
  repetition_ids.clear();
  count_ids.clear();
  count_values.clear();
  bias_ids.clear();
  bias_values.clear();
}

void AppendGpuSamplingRow(Sampler& sampler, GpuSamplingHostBatch* batch) {
  // Grammar-constrained requests are refused on CUDA by Engine::Submit.
  KCHECK_MSG(!sampler.has_token_mask(), "token masks are not applied by the GPU sampler");
  const SamplingParams& p = sampler.params();
  cuda::GpuSamplingRow r{};
  r.temperature = p.temperature;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.top_k = p.top_k;
  r.repetition_penalty = p.repetition_penalty;
  r.presence_penalty = p.presence_penalty;
  r.frequency_penalty = p.frequency_penalty;
  r.n_top_logprobs = p.n_top_logprobs;
  r.r53 = sampler.NextR53();
  r.repetition_offset = static_cast<int32_t>(batch->repetition_ids.size());
  r.n_repetition = static_cast<int32_t>(sampler.repetition_ids().size());
  batch->repetition_ids.insert(batch->repetition_ids.end(), sampler.repetition_ids().begin(),
                               sampler.repetition_ids().end());
  r.count_offset = static_cast<int32_t>(batch->count_ids.size());
  r.n_count = static_cast<int32_t>(sampler.generated_ids().size());
  for (int32_t id : sampler.generated_ids()) {
    batch->count_ids.push_back(id);
    batch->count_values.push_back(sampler.generated_count(id));
  }
  r.bias_offset = static_cast<int32_t>(batch->bias_ids.size());
  r.n_bias = static_cast<int32_t>(p.logit_bias.size());
  for (const auto& [id, bias] : p.logit_bias) {
    batch->bias_ids.push_back(id);
    batch->bias_values.push_back(bias);
  }
  r.logprobs = p.logprobs ? 1 : 0;
  r.processed_logprobs = p.logprob_mode == LogprobMode::kProcessed ? 1 : 0;
  batch->rows.push_back(r);
}

}  // namespace kestrel

#endif  // KESTREL_HAS_CUDA
