// Model::Load: config.json + safetensors -> the forward implementation of the architecture.
#include "models/model.h"

#include "models/llama.h"
#include "models/safetensors.h"

namespace kestrel {

Result<std::unique_ptr<Model>> Model::Load(const std::string& model_dir,
                                           const ModelLoadOptions& options) {
  KASSIGN(ModelConfig config, LoadModelConfig(model_dir));
  KASSIGN(WeightStore store, WeightStore::Open(model_dir));
  switch (config.arch) {
    case Architecture::kLlama:
    case Architecture::kMistral:
    case Architecture::kQwen2:
    case Architecture::kQwen3:
      return LoadDenseDecoder(std::move(config), std::move(store), options);
  }
  return Unsupported(model_dir + ": architecture " + ArchitectureName(config.arch) +
                     " has no forward implementation");
}

}  // namespace kestrel
