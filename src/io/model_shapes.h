// model_shapes.h: built-in model shapes (model.shape): the architecture numbers of released Llama / Qwen models,
// so that a model of that shape can be planned (`mgrl plan`) or trained from random weights without its files.
#pragma once
#include <string>
#include <vector>

#include "io/hf_config.h"

namespace mgrl::io {

// The names model.shape accepts, in table order ("tiny-llama", "llama-3.1-8b", ...).
std::vector<std::string> model_shape_names();
// The ModelConfig of a built-in shape, as parse_hf_config would read the model's config.json. UserError naming
// `key` and listing the known names when `name` is not one of them.
ModelConfig model_shape(const std::string& name, const std::string& key = "model.shape");

}  // namespace mgrl::io
