// The tiers' answer to "drop and recompute, or keep in slower memory?" for one model on this
// machine: recompute time per block by depth (fitted from timed prefill passes), load time per
// block from each configured tier (timed with probe blocks), and the reuse rate above which
// keeping a block there pays. Printed by `kvcache plan --model M` with tier flags.
#pragma once

#include <string>

#include "base/dtype.h"
#include "cli/cli_options.h"

namespace kvc::cli {

// Times the model and the tiers named in tiers and renders the table (or JSON with json).
// Throws Error when the model cannot be loaded or a tier flag is bad.
std::string tier_cost_report(const std::string& model_path, const TierArgs& tiers, DType k_dtype,
                             DType v_dtype, int block_tokens, int threads, bool json);

}  // namespace kvc::cli
